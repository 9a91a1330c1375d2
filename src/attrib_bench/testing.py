"""Helpers for a project's own test suite: run a benchmark config, assert no regression.

The pytest plugin (``attrib_bench`` fixture, registered as a ``pytest11`` entry point) wraps
these; they work without pytest too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrib_bench.check import DEFAULT_TOLERANCE, Comparison, compare, load_results

Results = Mapping[str, Any] | Path | str


def run_config(path: Path | str, quiet: bool = True, **overrides: Any) -> dict[str, Any]:
    """Run a TOML benchmark config and return the result document (nothing is written).

    ``overrides`` are settings as in the file (``limit=20``, ``attributors=[...]``,
    ``cache=False``); the cache is used unless the file or an override turns it off.
    """
    from attrib_bench.config import build_model, make_plan
    from attrib_bench.run import run_benchmark

    plan = build_model(make_plan(path, overrides), quiet=quiet)
    document = run_benchmark(plan.config, quiet=quiet, cache=plan.cache)
    document.update(plan.extra)
    return document


def as_document(results: Results) -> Mapping[str, Any]:
    """A result document given as itself or as the path of its JSON file."""
    if isinstance(results, (str, Path)):
        return load_results(results)
    return results


def assert_no_regression(
    results: Results,
    baseline: Results,
    tolerance: float = DEFAULT_TOLERANCE,
    all_layers: bool = False,
) -> Comparison:
    """Fail with the check's Markdown summary when any score regressed (see attrib_bench.check).

    Returns the comparison when the gate passes, for further assertions.
    """
    comparison = compare(
        as_document(results), as_document(baseline), tolerance=tolerance, all_layers=all_layers
    )
    if not comparison.passed:
        name = str(baseline) if isinstance(baseline, (str, Path)) else "baseline"
        raise AssertionError(
            "attribution quality regressed\n\n" + comparison.markdown("results", name)
        )
    return comparison
