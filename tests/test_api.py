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
    assert (
        json.loads((tmp_path / "result.json").read_text())["example_ids"] == result["example_ids"]
    )
    assert len(result["example_ids"]) == 20
    assert namespace["comparison"].passed
    assert "globenc" in namespace["markdown"]
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_the_api_is_what_the_cli_runs(tiny_bert, run_cli, tmp_path):
    settings = dict(model=str(tiny_bert), limit=4, attributors=["attention", "saliency"])
    document = attrib_bench.run(**settings, cache=False)
    code, _, err = run_cli(
        "run", "--model", tiny_bert, "--limit", "4", "--attributors", "attention,saliency",
        "--no-cache", "--quiet", "--output", tmp_path / "cli.json",
    )  # fmt: skip
    assert code == 0, err
    from_cli = json.loads((tmp_path / "cli.json").read_text())
    for spec in ("attention", "saliency", "random"):
        assert document["methods"][spec]["per_example"] == from_cli["methods"][spec]["per_example"]
    assert attrib_bench.check(document, tmp_path / "cli.json").passed


def test_bad_settings_raise_one_usage_error():
    with pytest.raises(attrib_bench.UsageError, match="unknown setting"):
        attrib_bench.run(limt=3)
