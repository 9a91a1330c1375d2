"""Usage errors answered before torch and transformers load (attrib_bench.preflight).

Whether they are fast is the start-up benchmark's question (benchmarks/startup.py); here, that
they happen without the heavy imports, in a fresh process, and that the plugin names listing
they read is trusted only while what decides the names is unchanged.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest

from attrib_bench.core import plugin_names
from attrib_bench.core.errors import UsageError
from attrib_bench.core.registry import load_registry
from attrib_bench.preflight import DATA_SUFFIXES, check_arguments

CASES = [
    (["run", "--attributors", "nosuch"], "unknown attributor 'nosuch'; valid choices: alti,"),
    (["run", "--evaluators", "spearman,nosuch"], "unknown evaluator 'nosuch'"),
    (["run", "--reference", "nosuch:k=1"], "unknown reference attributor 'nosuch:k=1'"),
    (
        ["attribute", "--output", "x.jsonl", "--attributors", "rollout:residual=0.2,nosuch"],
        "unknown attributor 'nosuch'",
    ),
    (["run", "--dataset", "nosuch.csv"], "dataset 'nosuch.csv' not found"),
    (["run", "--config", "nosuch.toml"], "config file 'nosuch.toml' does not exist"),
    (["run", "--model", "./nosuch"], "model './nosuch' not found"),
    (["run", "--models", "./a,./b"], "model './a' not found"),
    (["finetune", "--model", "nosuch.gguf"], "model file 'nosuch.gguf' does not exist"),
    (["run", "--plugin", "nosuch.py"], "plugin file 'nosuch.py' does not exist"),
    (["run", "--target", "position=middle"], "target position='middle' is not one of"),
    (["run", "--shard", "3/2"], "--shard must be i/N"),
    (["run", "--limit", "0"], "--limit must be at least 1, got 0"),
    (["attribute", "--output", "x.jsonl", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["run", "--max-length", "2"], "--max-length must be at least 3, got 2"),
    (["run", "--agreement-k", "-1"], "agreement_k must be at least 0"),
    (["run", "--seed", "-1"], "--seed must be a whole number"),
    (["evaluate", "--attributions", "nosuch.jsonl"], "attributions file 'nosuch.jsonl' does not"),
]

CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from attrib_bench.cli import main
    from attrib_bench.core.cache_dir import cache_root
    from attrib_bench.core.plugin_names import LISTING_FILE

    answers = []
    for argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            answers.append((main(argv), err.getvalue()))
    heavy = [m for m in ("torch", "transformers", "datasets") if m in sys.modules]
    # Without a listing, a full registry load answers: torch and the plugins, nothing more.
    (cache_root() / LISTING_FILE).unlink()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        unlisted = (main(["run", "--attributors", "nosuch"]), err.getvalue())
    loaded = [m for m in ("torch", "transformers", "datasets") if m in sys.modules]
    print(json.dumps({"answers": answers, "heavy": heavy, "unlisted": unlisted, "loaded": loaded}))
    """
)


def test_usage_errors_come_before_torch_and_transformers_are_imported(tmp_path):
    load_registry()  # a full load writes the names listing (into this test's cache)
    argvs = [argv for argv, _ in CASES]
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argvs)],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(child.stdout)
    for (argv, expected), (code, message) in zip(CASES, report["answers"], strict=True):
        assert code == 2, (argv, message)
        assert message.startswith("error: ") and expected in message, (argv, message)
        assert message.count("\n") == 1, (argv, message)  # one line, no traceback
    assert report["heavy"] == []
    code, message = report["unlisted"]
    assert code == 2 and message.startswith("error: unknown attributor 'nosuch'")
    assert report["loaded"] == ["torch"]


def namespace(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"command": "run", "plugin": None, "config": None, **given})


def test_hub_ids_and_names_the_listing_cannot_vouch_for_are_left_to_the_run():
    check_arguments(namespace(model="some-org/no-such-model", dataset="glue/sst2"))
    assert plugin_names.read_listing() is None  # this test's cache has none yet
    with pytest.raises(UsageError, match="unknown attributor 'nosuch'"):
        check_arguments(namespace(attributors=["nosuch"]))  # a full load, which writes one
    assert plugin_names.read_listing() is not None
    check_arguments(namespace(attributors=["nosuch"], plugin=[__file__]))  # a file may add it
    installed = importlib.metadata.entry_points(group=plugin_names.ENTRY_POINT_GROUP)
    plugin_names.write_listing(installed, ["a"], ["b"], broken=True)
    check_arguments(namespace(attributors=["nosuch"]))  # maybe the broken plugin's


def test_under_a_launcher_rank_0_alone_says_it(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as exited:
        check_arguments(namespace(limit=0))
    assert exited.value.code == 2
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UsageError, match="--limit must be at least 1"):
        check_arguments(namespace(limit=0))


def test_the_listing_holds_the_registry_names_until_a_plugin_file_changes(tmp_path, monkeypatch):
    package = tmp_path / "listing_plugin"
    package.mkdir()
    (package / "__init__.py").write_text("")
    module = package / "methods.py"
    module.write_text("NAME = 'one'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points = [
        importlib.metadata.EntryPoint("mine", "listing_plugin.methods", "attrib_bench"),
        *importlib.metadata.entry_points(group=plugin_names.ENTRY_POINT_GROUP),
    ]
    before = plugin_names.fingerprint(entry_points)
    assert before is not None and before == plugin_names.fingerprint(entry_points)
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert plugin_names.fingerprint(entry_points) != before

    registry = load_registry()
    listing = plugin_names.read_listing()
    assert listing is not None
    assert listing.attributors == set(registry.attributors)
    assert listing.evaluators == set(registry.evaluators)
    assert not listing.broken


def test_data_suffixes_are_the_loaders():
    from attrib_bench.data.load import FILE_BUILDERS

    assert set(DATA_SUFFIXES) == set(FILE_BUILDERS)
