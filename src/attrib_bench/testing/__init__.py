"""Helpers for a project's own test suite: run a benchmark config, assert no regression, and
check a plugin with the conformance kit (``check_attributor``, ``check_evaluator``; for segment
plugins ``check_segment_attributor``, ``check_segment_evaluator``).

The pytest plugin (``attrib_bench`` fixture, registered as a ``pytest11`` entry point) wraps
these; they work without pytest too. The kit's names are resolved on first use (PEP 562): the
pytest plugin imports this module in every pytest session, and the kit imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrib_bench.reports.gate import gate_markdown
from attrib_bench.results.compare import DEFAULT_TOLERANCE, Comparison, compare
from attrib_bench.results.typed import Result, Results, as_result

if TYPE_CHECKING:
    from attrib_bench.testing.conformance import ConformanceError, check_attributor, check_evaluator
    from attrib_bench.testing.segment_conformance import (
        check_segment_attributor,
        check_segment_evaluator,
    )

__all__ = [
    "ConformanceError",
    "Results",
    "as_result",
    "assert_no_regression",
    "check_attributor",
    "check_evaluator",
    "check_segment_attributor",
    "check_segment_evaluator",
    "run_config",
]

#: Names this module re-exports from the conformance kit, by the module that holds them.
_CONFORMANCE = {
    "ConformanceError": "conformance",
    "check_attributor": "conformance",
    "check_evaluator": "conformance",
    "check_segment_attributor": "segment_conformance",
    "check_segment_evaluator": "segment_conformance",
}


def __getattr__(name: str) -> Any:
    if name not in _CONFORMANCE:
        raise AttributeError(f"module 'attrib_bench.testing' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"attrib_bench.testing.{_CONFORMANCE[name]}")
    return getattr(module, name)


def run_config(path: Path | str, quiet: bool = True, **overrides: Any) -> Result:
    """Run a TOML benchmark config and return its result (nothing is written).

    ``overrides`` are settings as in the file (``limit=20``, ``attributors=[...]``,
    ``cache=False``); the cache is used unless the file or an override turns it off.
    """
    from attrib_bench.runner.config import build_model, make_plan
    from attrib_bench.runner.models import run_config

    plan = build_model(make_plan(path, overrides), quiet=quiet)
    document = run_config(plan.config, quiet=quiet, cache=plan.cache)
    document.update(plan.extra)
    return Result.from_document(document)


def assert_no_regression(
    results: Results,
    baseline: Results,
    tolerance: float = DEFAULT_TOLERANCE,
    all_layers: bool = False,
    **allowances: Any,
) -> Comparison:
    """Fail with the check's Markdown summary when any score regressed (results.compare).

    ``results`` and ``baseline`` are ``Result`` objects, documents or paths (``as_result``).
    ``allowances``: ``compare``'s ``allow_removed``, ``allow_model_change`` and
    ``allow_reference_change``. Returns the comparison when the gate passes.
    """
    comparison = compare(
        as_result(results),
        as_result(baseline, "baseline"),
        tolerance=tolerance,
        all_layers=all_layers,
        **allowances,
    )
    if not comparison.passed:
        name = str(baseline) if isinstance(baseline, (str, Path)) else "baseline"
        raise AssertionError(
            "attribution quality regressed\n\n" + gate_markdown(comparison, "results", name)
        )
    return comparison
