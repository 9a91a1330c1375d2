"""The per-example result cache: reuse, keys, corruption, resume after an interrupted run.

A plugin that logs every example it computes (``plugin_fixtures/counting_plugin.py``) tells
what was computed and what came from the cache.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench.model.load import load_model
from attrib_bench.runner.cache import (
    NO_CACHE_ENV,
    PRESENTATION_MODULES,
    atomic_write,
    code_identity,
    digest,
    example_key,
    read_entry,
    results_root,
    source_digest,
)

COUNTING = Path(__file__).parent / "plugin_fixtures" / "counting_plugin.py"
QUIET = ("--quiet", "--batch-size", "4")


@pytest.fixture
def cache_on(monkeypatch, tmp_path):
    """The cache as users get it (the suite turns it off by default), and a computation log."""
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    log = tmp_path / "computed.log"
    monkeypatch.setenv("COUNT_LOG", str(log))
    return log


def computed(log: Path) -> list[tuple[str, str]]:
    """(method, example id) pairs computed since the log was last cleared."""
    if not log.is_file():
        return []
    return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()]


def run(run_cli, tmp_path, model, attributors, *extra, name="result.json"):
    output = tmp_path / name
    code, _, err = run_cli(
        "run",
        "--model",
        model,
        "--limit",
        "8",
        "--attributors",
        attributors,
        "--plugin",
        COUNTING,
        *QUIET,
        *extra,
        "--output",
        output,
    )
    assert code == 0, err
    return json.loads(output.read_text()), err


def numbers(document: dict) -> dict:
    """Everything a run computes: per method its scores, per-example scores and cost."""
    return {
        spec: (m["scores"], m["per_example"], m["seconds_per_example"])
        for spec, m in document["methods"].items()
    }


def method_dir(document: dict, spec: str) -> Path:
    return Path(document["cache"]["dir"]) / document["cache"]["methods"][spec]


def test_rerun_reuses_everything_and_equals_a_fresh_computation(
    tiny_bert, run_cli, tmp_path, cache_on, monkeypatch
):
    first, err = run(run_cli, tmp_path, tiny_bert, "counted,attention", name="first.json")
    assert "nothing reused" in err
    assert sorted(computed(cache_on)) == sorted(("counted", i) for i in first["example_ids"])
    assert first["cache"]["hits"] == {"counted": 0, "attention": 0, "saliency": 0, "random": 0}
    assert set(first["cache"]["examples"]) == set(first["example_ids"])
    jsonschema = pytest.importorskip("jsonschema")
    from attrib_bench.results import SCHEMA_PATH

    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(first)

    # Everything cached: no method runs and no batch is even traced.
    cache_on.unlink()
    monkeypatch.setattr(
        "attrib_bench.runner.engine.trace_batch",
        lambda *a, **k: pytest.fail("traced a cached batch"),
    )
    again, err = run(run_cli, tmp_path, tiny_bert, "counted,attention", name="again.json")
    assert computed(cache_on) == []
    assert again["cache"]["hits"] == {"counted": 8, "attention": 8, "saliency": 8, "random": 8}
    assert "examples reused per method: counted 8, attention 8, saliency 8, random 8" in err
    # Identical numbers, the cost recorded when they were computed included.
    assert numbers(again) == numbers(first)

    monkeypatch.undo()
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    fresh, _ = run(run_cli, tmp_path, tiny_bert, "counted,attention", "--no-cache", name="f.json")
    assert "cache" not in fresh
    for spec in ("counted", "attention", "random"):
        assert fresh["methods"][spec]["per_example"] == first["methods"][spec]["per_example"]


def test_adding_a_method_computes_only_that_method(tiny_bert, run_cli, tmp_path, cache_on):
    first, _ = run(run_cli, tmp_path, tiny_bert, "counted,saliency", name="first.json")
    cache_on.unlink()
    second, _ = run(run_cli, tmp_path, tiny_bert, "counted,saliency,counted-too", name="s.json")
    ids = first["example_ids"]
    assert sorted(computed(cache_on)) == sorted(("counted-too", i) for i in ids)
    assert second["cache"]["hits"] == {"counted": 8, "saliency": 8, "counted-too": 0, "random": 8}
    for spec in ("counted", "saliency", "random"):
        assert second["methods"][spec]["per_example"] == first["methods"][spec]["per_example"]
    # The new method was scored against the cached reference: same as against a fresh one.
    fresh, _ = run(run_cli, tmp_path, tiny_bert, "counted-too", "--no-cache", name="fresh.json")
    assert (
        second["methods"]["counted-too"]["per_example"]
        == fresh["methods"]["counted-too"]["per_example"]
    )


def test_reuse_is_per_method_and_example(tiny_bert, run_cli, tmp_path, cache_on):
    """Two methods on 5 examples, then three on 12: the third runs on 12, the first two on 7.

    Examples are batched by the methods they still miss, so an example cached for some methods
    is traced only for the others, and a method's rows do not depend on which others ran.
    """
    small, _ = run(run_cli, tmp_path, tiny_bert, "counted,attention", "--limit", "5", name="5.json")
    cache_on.unlink()
    large, err = run(
        run_cli, tmp_path, tiny_bert, "counted,attention,counted-too", "--limit", "12",
        name="12.json",
    )  # fmt: skip
    old, ids = small["example_ids"], large["example_ids"]
    new = [i for i in ids if i not in old]
    assert len(old) == 5 and len(new) == 7
    assert sorted(computed(cache_on)) == sorted(
        [("counted-too", i) for i in ids] + [("counted", i) for i in new]
    )
    assert large["cache"]["hits"] == {"counted": 5, "attention": 5, "counted-too": 0,
                                      "saliency": 5, "random": 5}  # fmt: skip
    assert "examples reused per method: counted 5, attention 5, saliency 5, random 5" in err
    fresh, _ = run(
        run_cli, tmp_path, tiny_bert, "counted,attention,counted-too", "--limit", "12",
        "--no-cache", name="fresh.json",
    )  # fmt: skip
    for spec in ("counted", "counted-too"):  # exact: their rows do not depend on the batch
        assert large["methods"][spec]["per_example"] == fresh["methods"][spec]["per_example"]
    for spec in ("attention", "saliency"):  # other batches: equal up to the last float bits
        for name, kinds in fresh["methods"][spec]["per_example"].items():
            for kind, layers in kinds.items():
                got = large["methods"][spec]["per_example"][name][kind]
                np.testing.assert_allclose(np.array(got, float), np.array(layers, float), atol=1e-6)


def test_a_full_cache_disk_warns_once_and_the_run_finishes(
    tiny_bert, run_cli, tmp_path, cache_on, monkeypatch
):
    """The cache is optional: a write failing (here the disk is full after 3 entries) warns
    once, stops caching, and the run writes its result, equal to an uncached one."""
    from attrib_bench.runner import cache

    written = []

    def fill_up(path: Path, text: str) -> None:
        if len(written) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written.append(path)
        atomic_write(path, text)

    monkeypatch.setattr(cache, "atomic_write", fill_up)
    full, err = run(run_cli, tmp_path, tiny_bert, "counted", "--batch-size", "1", name="f.json")
    assert err.count("cache: cannot write to") == 1
    assert "No space left on device" in err and "--no-cache" in err
    assert "No space left on device" in full["cache"]["write_error"]
    assert len(written) == 3
    monkeypatch.undo()
    fresh, _ = run(run_cli, tmp_path, tiny_bert, "counted", "--no-cache", name="fresh.json")
    assert full["methods"]["counted"]["per_example"] == fresh["methods"]["counted"]["per_example"]


def test_unselected_reference_is_a_cached_row(tiny_bert, run_cli, tmp_path, cache_on):
    """A reference not selected joins the leaderboard, is cached, and serves from its rows."""
    first, _ = run(run_cli, tmp_path, tiny_bert, "counted", name="first.json")
    reference = first["methods"]["saliency"]
    assert reference["added_as_reference"] and not reference["added_as_floor"]
    assert first["cache"]["reference"] == first["cache"]["methods"]["saliency"]
    # Scored against itself: a perfect rank correlation on every example.
    assert all(v == 1.0 for v in reference["per_example"]["spearman"]["aggregated"][0])
    second, _ = run(run_cli, tmp_path, tiny_bert, "counted,counted-too", name="second.json")
    assert second["cache"]["hits"]["saliency"] == 8
    fresh, _ = run(run_cli, tmp_path, tiny_bert, "counted-too", "--no-cache", name="fresh.json")
    assert (
        second["methods"]["counted-too"]["per_example"]
        == fresh["methods"]["counted-too"]["per_example"]
    )


def test_corrupt_entries_are_detected_deleted_and_recomputed(
    tiny_bert, run_cli, tmp_path, cache_on
):
    # One example per batch, so exactly the corrupt examples have to be recomputed.
    first, _ = run(run_cli, tmp_path, tiny_bert, "counted", "--batch-size", "1", name="1.json")
    entries = sorted(p for p in method_dir(first, "counted").glob("*.json") if p.name != "key.json")
    assert len(entries) == 8
    garbage, flipped, truncated = entries[0], entries[1], entries[2]
    garbage.write_text("not json at all")
    text = flipped.read_text()
    assert '\\"seconds\\":' in text  # the payload is a JSON string inside the entry
    flipped.write_text(text.replace('\\"seconds\\":', '\\"seconds\\":1', 1))  # bad checksum
    truncated.write_text(truncated.read_text()[:40])
    corrupt_ids = set()
    for path in (garbage, flipped, truncated):
        corrupt_ids.add(next(i for i, k in first["cache"]["examples"].items() if path.stem == k))
    cache_on.unlink()

    again, err = run(run_cli, tmp_path, tiny_bert, "counted", "--batch-size", "1", name="2.json")
    assert err.count("corrupt cache entry") == 3
    assert "(checksum mismatch)" in " ".join(err.split())
    assert sorted(computed(cache_on)) == sorted(("counted", i) for i in corrupt_ids)
    assert numbers(again)["counted"][:2] == numbers(first)["counted"][:2]
    for path in (garbage, flipped, truncated):
        assert read_entry(path) is not None  # rewritten, valid


def test_keys_follow_parameters_version_and_source(tmp_path):
    from attrib_bench.core.registry import load_registry

    registry = load_registry()
    source = registry.attributors["rollout"].source

    def key(spec):
        return digest(code_identity(registry.attributor(spec), spec, source))

    # Defaults applied: the bare name and its explicit default share entries.
    assert key("rollout") == key("rollout:residual=0.5")
    assert key("rollout:residual=0.9") != key("rollout")

    rollout = registry.attributor("rollout")
    bumped = registry.attributor("rollout:residual=0.5")
    bumped.version = "2"
    assert digest(code_identity(bumped, "rollout", source)) != key("rollout")
    assert code_identity(rollout, "rollout", source)["version"] == "0"

    # Key order does not matter; the digest is of content.
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})


def test_every_presentation_path_exists_in_the_package():
    """A renamed module must not silently fall back into the numeric core's digest (after the
    package was split into folders, 'reports.py' named nothing and every report edit missed)."""
    import attrib_bench

    root = Path(attrib_bench.__file__).parent
    for entry in PRESENTATION_MODULES:
        path = root / entry
        assert path.is_dir() if entry.endswith("/") else path.is_file(), entry


def test_the_core_digest_skips_presentation_files_and_follows_the_rest(tmp_path, monkeypatch):
    package = tmp_path / "fakecore"
    for name in (
        "__init__.py",
        "engine.py",
        "reports/__init__.py",
        "reports/html.py",
        "runner/cache.py",
        "runner/engine.py",
    ):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(f"# {name}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("fakecore.engine")
    try:
        before = source_digest("fakecore.engine", exclude=PRESENTATION_MODULES)
        for name in ("reports/html.py", "runner/cache.py"):
            (package / name).write_text("# edited, longer than before\n")
            assert source_digest("fakecore.engine", exclude=PRESENTATION_MODULES) == before, name
        (package / "runner/engine.py").write_text("# edited, longer than before\n")
        assert source_digest("fakecore.engine", exclude=PRESENTATION_MODULES) != before
    finally:
        for module in [m for m in sys.modules if m.startswith("fakecore")]:
            del sys.modules[module]


def test_editing_a_plugin_file_misses_the_cache(tiny_bert, run_cli, tmp_path, cache_on):
    plugin = tmp_path / "edited.py"
    plugin.write_text(COUNTING.read_text())
    args = ("--model", tiny_bert, "--limit", "4", "--attributors", "counted", *QUIET)
    code, _, err = run_cli("run", *args, "--plugin", plugin, "--output", tmp_path / "a.json")
    assert code == 0, err
    plugin.write_text(COUNTING.read_text().replace("0.0), Counted", "0.25), Counted"))
    cache_on.unlink()
    code, _, err = run_cli("run", *args, "--plugin", plugin, "--output", tmp_path / "b.json")
    assert code == 0, err
    assert len(computed(cache_on)) == 4  # all recomputed: the source changed


def test_no_cache_writes_nothing_and_cache_clear_empties_it(tiny_bert, run_cli, tmp_path, cache_on):
    run(run_cli, tmp_path, tiny_bert, "counted", "--no-cache", name="a.json")
    assert not results_root().exists()
    run(run_cli, tmp_path, tiny_bert, "counted", name="b.json")
    atomic_write(results_root() / "x" / "leftover.json", "{}")
    entries = [p for p in results_root().rglob("*.json") if p.name != "key.json"]
    code, out, err = run_cli("cache", "clear")
    assert code == 0, err
    assert f"removed {len(entries)} cached example results" in out
    assert not results_root().exists()


def counted_ids() -> set[str]:
    """Ids of the examples whose ``counted`` entry is in the cache."""
    ids = set()
    for key in results_root().glob("*/key.json"):
        if json.loads(key.read_text())["method"]["name"] == "counted":
            ids |= {read_entry(p)["id"] for p in key.parent.glob("*.json") if p.name != "key.json"}
    return ids


def interrupt(args: list[str], how: signal.Signals, after: int) -> str:
    """Run ``attrib-bench`` in a subprocess and send it ``how`` once ``after`` examples of the
    ``counted`` method are cached; its stderr. The run computes 3 examples of ``counted`` and
    then waits in its next call, so the signal always lands midway."""
    process = subprocess.Popen(
        [sys.executable, "-m", "attrib_bench", *args],
        env={**os.environ, "COUNT_BLOCK_AFTER": "3"},
        # A shell's background job inherits SIGINT ignored, and Python then never raises
        # KeyboardInterrupt: give the run Ctrl-C's default, whoever started the suite.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None and len(counted_ids()) < after:
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be interrupted"
    process.send_signal(how)
    _, err = process.communicate(timeout=60)
    if how == signal.SIGINT:  # Ctrl-C: a clean exit that says how to resume
        assert process.returncode == 130, err
        assert "rerun the same command to resume" in err
    else:
        assert process.returncode == -signal.SIGKILL
    return err


def test_an_interrupted_run_resumes_and_loses_nothing(tiny_bert, run_cli, tmp_path, cache_on):
    """Kill a run (SIGKILL), interrupt the rerun (SIGINT), finish: each run computes only what
    was not cached, nothing is corrupt, and the result equals an uninterrupted run."""
    args = [
        "run",
        "--model",
        str(tiny_bert),
        "--limit",
        "12",
        "--batch-size",
        "1",
        "--attributors",
        "counted,attention",
        "--plugin",
        str(COUNTING),
        "--quiet",
        "--output",
        str(tmp_path / "result.json"),
    ]
    interrupt(args, signal.SIGKILL, after=3)
    killed = counted_ids()
    assert len(killed) == 3
    cache_on.unlink()
    err = interrupt(args, signal.SIGINT, after=len(killed) + 3)
    assert "corrupt" not in err
    interrupted = counted_ids()
    assert len(interrupted) == len(killed) + 3
    assert {i for _, i in computed(cache_on)}.isdisjoint(killed)
    assert not (tmp_path / "result.json").exists()

    cache_on.unlink()
    code, _, err = run_cli(*args)
    assert code == 0, err
    assert "corrupt" not in err
    resumed = json.loads((tmp_path / "result.json").read_text())
    finished = {i for method, i in computed(cache_on) if method == "counted"}
    assert finished.isdisjoint(interrupted)
    assert finished | interrupted == set(resumed["example_ids"])
    assert resumed["cache"]["hits"]["counted"] == len(interrupted) < 12

    code, _, err = run_cli(*args[:-1], str(tmp_path / "fresh.json"), "--no-cache")
    assert code == 0, err
    fresh = json.loads((tmp_path / "fresh.json").read_text())
    for spec in ("counted", "attention", "random"):
        assert resumed["methods"][spec]["scores"] == fresh["methods"][spec]["scores"]
        assert resumed["methods"][spec]["per_example"] == fresh["methods"][spec]["per_example"]


def test_a_larger_limit_reuses_every_example_a_smaller_one_computed(
    tiny_bert, run_cli, tmp_path, cache_on
):
    """Reuse is per example: batching by length mixes old and new examples, and must not matter."""
    small = tmp_path / "small.json"
    code, _, err = run_cli(
        "run", "--model", tiny_bert, "--limit", "4", "--attributors", "counted",
        "--plugin", COUNTING, *QUIET, "--output", small,
    )  # fmt: skip
    assert code == 0, err
    cache_on.unlink()
    larger, _ = run(run_cli, tmp_path, tiny_bert, "counted", name="larger.json")
    first_four = json.loads(small.read_text())["example_ids"]
    new = [i for i in larger["example_ids"] if i not in first_four]
    assert len(new) == 4
    assert sorted(computed(cache_on)) == sorted(("counted", i) for i in new)
    assert larger["cache"]["hits"]["counted"] == 4
    fresh, _ = run(run_cli, tmp_path, tiny_bert, "counted", "--no-cache", name="fresh.json")
    assert larger["methods"]["counted"]["per_example"] == fresh["methods"]["counted"]["per_example"]


def test_a_result_file_cannot_make_the_report_delete_files(tmp_path):
    """``cached_rows`` follows paths a result file names: a bad entry there is left alone."""
    from attrib_bench.runner.cache import cached_rows

    victim = tmp_path / "method" / "example.json"
    victim.parent.mkdir()
    victim.write_text('{"a user": "file"}')
    document = {
        "cache": {"dir": str(tmp_path), "methods": {"m": "method"}, "examples": {"e": "example"}}
    }
    assert cached_rows(document, "m", "e") is None
    assert victim.read_text() == '{"a user": "file"}'


def test_an_entry_records_its_own_batchs_memory_not_the_runs_peak(
    tiny_bert, run_cli, tmp_path, cache_on
):
    first, _ = run(run_cli, tmp_path, tiny_bert, "saliency", name="first.json")
    entries = [
        read_entry(p) for p in method_dir(first, "saliency").glob("*.json") if p.name != "key.json"
    ]
    peaks = {round(entry["peak_memory_mb"], 6) for entry in entries}
    # Two batches of four sentences of different lengths: two different peaks, the larger of
    # which is the run's.
    assert len(peaks) == 2
    assert max(peaks) == pytest.approx(first["methods"]["saliency"]["peak_memory_mb"], abs=0.01)


def test_an_examples_foil_joins_its_key_only_when_set(tiny_bert):
    """A changed foil changes the contrastive score: it must not reuse the old entry. Examples
    without one keep the key they had before foils existed."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    plain = examples(["a fine film"])
    batch = one_batch(loaded, plain)
    length = int(batch.attention_mask_BN[0].sum())
    before = digest(
        [
            "0",
            "a fine film",
            None,
            0,
            None,
            batch.input_ids_BN[0, :length].tolist(),
            batch.token_type_ids_BN[0, :length].tolist(),
        ]
    )
    assert example_key(batch, 0) == before
    keys = {
        example_key(one_batch(loaded, [dataclasses.replace(plain[0], foil=foil)]), 0)
        for foil in (0, 1)
    }
    assert len(keys) == 2 and before not in keys
