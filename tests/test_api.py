"""The Python API (``attrib_bench.run``, ``check``, ``report``): the README's example, run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import attrib_bench

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def readme_api_example() -> str:
    section = README[README.index("## Python API") :]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


@pytest.mark.xdist_group("default_model")  # one worker fine-tunes it (conftest.py)
def test_the_readme_example_runs_checks_and_reports(default_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_api_example(), "README.md", "exec"), namespace)
    result = namespace["result"]
    assert json.loads((tmp_path / "result.json").read_text())["example_ids"] == result.example_ids
    assert len(result.example_ids) == 20
    assert namespace["comparison"].passed
    assert "globenc" in namespace["markdown"]
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_the_api_is_what_the_cli_runs(tiny_bert, run_cli, tmp_path):
    settings = dict(model=str(tiny_bert), limit=4, attributors=["attention", "saliency"])
    result = attrib_bench.run(**settings, cache=False)
    code, _, err = run_cli(
        "run", "--model", tiny_bert, "--limit", "4", "--attributors", "attention,saliency",
        "--no-cache", "--quiet", "--output", tmp_path / "cli.json",
    )  # fmt: skip
    assert code == 0, err
    from_cli = json.loads((tmp_path / "cli.json").read_text())
    for spec in ("attention", "saliency", "random"):
        assert (
            result.methods[spec].per_example
            == attrib_bench.load(from_cli).methods[spec].per_example
        )
    assert attrib_bench.check(result, tmp_path / "cli.json").passed


def test_bad_settings_raise_one_usage_error():
    with pytest.raises(attrib_bench.UsageError, match="unknown setting"):
        attrib_bench.run(limt=3)


def test_list_plugins_is_what_list_prints(run_cli):
    code, out, err = run_cli("list", "--json")
    assert code == 0, err
    listing = attrib_bench.list_plugins()
    assert json.loads(out) == json.loads(json.dumps(listing))
    assert {"globenc", "saliency", "random"} <= {row["name"] for row in listing["attributors"]}
    assert any("bert" in family["model_types"] for family in listing["architectures"])


def test_run_and_merge_return_results_that_name_their_file(tiny_bert, tmp_path):
    settings = {"model": str(tiny_bert), "dataset": "default", "limit": 5, "cache": False}
    settings |= {"attributors": ["attention"], "evaluators": ["spearman"], "agreement_k": 0}
    halves = [
        attrib_bench.run(shard=f"{i}/2", batch_size=2, output=tmp_path / f"{i}.json", **settings)
        for i in (1, 2)
    ]
    assert all(isinstance(half, attrib_bench.Result) for half in halves)
    assert [half.source for half in halves] == [str(tmp_path / "1.json"), str(tmp_path / "2.json")]
    merged = attrib_bench.merge([tmp_path / "2.json", halves[0]], output=tmp_path / "all.json")
    assert isinstance(merged, attrib_bench.Result)
    assert merged.example_ids == [f"default-test-{i}" for i in range(5)]
    assert attrib_bench.load(tmp_path / "all.json").methods.keys() == merged.methods.keys()
    assert merged.methods["attention"].score("spearman").n == 5


def test_clear_cache_says_what_it_removed(tmp_path, monkeypatch):
    from attrib_bench.runner.cache import results_root

    monkeypatch.setenv("ATTRIB_BENCH_CACHE", str(tmp_path))
    entry = results_root() / "ab" / "0123.json"
    entry.parent.mkdir(parents=True)
    entry.write_text("{}" * 10)
    cleared = attrib_bench.clear_cache()
    assert (cleared.entries, cleared.size_bytes, cleared.folder) == (1, 20, tmp_path)
    assert not entry.exists()


def test_every_command_has_its_api_function():
    """``cli.py`` parses and calls: each command's handler calls a function of the API."""
    import inspect

    from attrib_bench import api, cli

    called = {
        "list": "list_plugins",
        "run": "run",
        "attribute": "attribute",
        "evaluate": "evaluate",
        "finetune": "finetune",
        "identifiability": "identifiability",
        "similarity": "similarity",
        "check": "check",
        "merge": "merge",
        "report": "report",
        "cache": "clear_cache",
        "meta": "meta",
        "context": "context",
    }
    assert set(cli.COMMANDS) == set(called)
    for command, handler in cli.COMMANDS.items():
        source = inspect.getsource(handler)
        assert "from attrib_bench.api import" in source and called[command] in source, command
        assert callable(getattr(api, called[command]))
        for package in ("model", "runner", "analyses", "segments", "data", "toolkit"):
            assert f"attrib_bench.{package}" not in source, (command, package)
