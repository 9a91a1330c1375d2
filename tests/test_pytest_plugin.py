"""The pytest plugin: a user's three-line regression test, run by ``pytester``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from attrib_bench.runner.cache import NO_CACHE_ENV

pytest_plugins = ["pytester"]

USER_TEST = """
def test_attribution_quality(attrib_bench):
    results = attrib_bench.run("bench.toml")
    attrib_bench.assert_no_regression(results, "baselines/bench.json", tolerance=0.02)
"""

#: The user's own method: saliency under another name, with NOISE degrading it.
MY_METHOD = """
import torch

import attrib_bench
from attrib_bench_plugins.gradient import Saliency

NOISE = {noise}


class MyMethod(Saliency):
    name = "my-method"
    description = "Gradient x input, as a team's own method"

    def attribute(self, trace):
        attribution = super().attribute(trace)
        rows = attribution.aggregated_BLN
        noise = torch.rand(rows.shape, generator=torch.Generator().manual_seed(0))
        rows = rows + NOISE * noise * rows.abs().amax(dim=-1, keepdim=True)
        return attrib_bench.Attribution(rows * trace.mask_BN[:, None, :].to(rows.dtype))


@attrib_bench.hookimpl
def attrib_bench_attributors():
    return [MyMethod()]
"""


@pytest.fixture
def project(pytester, tiny_bert, monkeypatch):
    """A user's project: a benchmark config, their plugin, and the three-line test."""
    monkeypatch.delenv(NO_CACHE_ENV)
    pytester.makefile(
        ".toml",
        bench=f"""
        model = "{tiny_bert}"
        limit = 12
        batch_size = 6
        attributors = ["my-method", "attention"]
        plugins = ["my_method.py"]
        """,
    )
    pytester.makepyfile(my_method=MY_METHOD.format(noise=0.0), test_quality=USER_TEST)
    return pytester


def test_the_plugin_is_registered_by_its_entry_point(pytester):
    config = pytester.parseconfig()
    assert config.pluginmanager.get_plugin("attrib_bench") is not None
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--attrib-bench-update-baselines*"])


def test_loading_the_plugin_imports_nothing_heavy():
    code = (
        "import sys, attrib_bench_plugins.pytest_plugin; "
        "print(sorted({'torch', 'transformers', 'attrib_bench'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_three_line_test_writes_passes_and_catches_a_regression(project):
    # No baseline yet: the failure says how to make one.
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*does not exist: run pytest --attrib-bench-update-baselines*"])

    result = project.runpytest("--attrib-bench-update-baselines")
    result.assert_outcomes(passed=1)
    assert (project.path / "baselines" / "bench.json").is_file()

    project.runpytest().assert_outcomes(passed=1)

    # The method gets worse: the same test fails, with the Markdown summary as its message.
    (project.path / "my_method.py").write_text(textwrap.dedent(MY_METHOD.format(noise=2.0)))
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*attribution quality regressed*",
            "*## ❌ attrib-bench check: 1 regression(s)*",
            "*| `my-method` | spearman | aggregated | 1 | +1.000 |*❌ regression |",
        ]
    )


def test_results_can_be_loaded_instead_of_run(project, tiny_bert):
    project.makepyfile(
        test_quality="""
        def test_from_file(attrib_bench):
            results = attrib_bench.run("bench.toml", limit=6)
            assert len(results.example_ids) == 6
            results.save(attrib_bench.path("results.json"))
            loaded = attrib_bench.load("results.json")
            comparison = attrib_bench.assert_no_regression("results.json", "results.json")
            assert loaded.methods.keys() == results.methods.keys()
            assert comparison.passed and all(row.delta == 0 for row in comparison.rows)
        """
    )
    project.runpytest().assert_outcomes(passed=1)
