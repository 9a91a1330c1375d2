"""attrib-bench: benchmark token-attribution methods for transformer models.

The public API: everything a plugin or a Python user needs is importable from here, one function
per ``attrib-bench`` command (attrib_bench.api), the typed result they return and the types
plugins implement. The names are resolved on first use (PEP 562), so ``attrib-bench --help``
and usage errors answer without importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "run": "attrib_bench.api",
    "evaluate": "attrib_bench.api",
    "attribute": "attrib_bench.api",
    "check": "attrib_bench.api",
    "report": "attrib_bench.api",
    "load": "attrib_bench.api",
    "merge": "attrib_bench.api",
    "list_plugins": "attrib_bench.api",
    "finetune": "attrib_bench.api",
    "Finetuned": "attrib_bench.api",
    "identifiability": "attrib_bench.api",
    "similarity": "attrib_bench.api",
    "similarity_plots": "attrib_bench.api",
    "context": "attrib_bench.api",
    "clear_cache": "attrib_bench.api",
    "meta": "attrib_bench.api",
    "Cleared": "attrib_bench.api",
    "Result": "attrib_bench.results.typed",
    "MethodResult": "attrib_bench.results.typed",
    "LayerScore": "attrib_bench.results.typed",
    "Comparison": "attrib_bench.results.compare",
    "ArchitectureSpec": "attrib_bench.core.architecture_spec",
    "Configurable": "attrib_bench.core.configurable",
    "ExitCode": "attrib_bench.core.errors",
    "UsageError": "attrib_bench.core.errors",
    "hookimpl": "attrib_bench.core.hookspecs",
    "KINDS": "attrib_bench.core.interfaces",
    "Attribution": "attrib_bench.core.interfaces",
    "Attributor": "attrib_bench.core.interfaces",
    "Batch": "attrib_bench.core.interfaces",
    "EvalContext": "attrib_bench.core.interfaces",
    "Evaluator": "attrib_bench.core.interfaces",
    "Example": "attrib_bench.core.interfaces",
    "ModelEvaluator": "attrib_bench.core.interfaces",
    "SegmentAttributor": "attrib_bench.core.segment_interfaces",
    "SegmentEvaluator": "attrib_bench.core.segment_interfaces",
    "SegmentScorer": "attrib_bench.segments.scorer",
    "StepScores": "attrib_bench.core.segment_interfaces",
    "TRACE_FIELDS": "attrib_bench.core.trace_fields",
    "Trace": "attrib_bench.core.trace",
    "TraceField": "attrib_bench.core.trace_fields",
}

__all__ = [
    "KINDS",
    "TRACE_FIELDS",
    "ArchitectureSpec",
    "Attribution",
    "Attributor",
    "Batch",
    "Cleared",
    "Comparison",
    "Configurable",
    "EvalContext",
    "Evaluator",
    "Example",
    "ExitCode",
    "Finetuned",
    "LayerScore",
    "MethodResult",
    "ModelEvaluator",
    "Result",
    "SegmentAttributor",
    "SegmentEvaluator",
    "SegmentScorer",
    "StepScores",
    "Trace",
    "TraceField",
    "UsageError",
    "__version__",
    "attribute",
    "check",
    "clear_cache",
    "context",
    "evaluate",
    "finetune",
    "hookimpl",
    "identifiability",
    "list_plugins",
    "load",
    "merge",
    "meta",
    "report",
    "run",
    "similarity",
    "similarity_plots",
]

if TYPE_CHECKING:
    from attrib_bench.api import (
        Cleared,
        Finetuned,
        attribute,
        check,
        clear_cache,
        context,
        evaluate,
        finetune,
        identifiability,
        list_plugins,
        load,
        merge,
        meta,
        report,
        run,
        similarity,
        similarity_plots,
    )
    from attrib_bench.core.architecture_spec import ArchitectureSpec
    from attrib_bench.core.configurable import Configurable
    from attrib_bench.core.errors import ExitCode, UsageError
    from attrib_bench.core.hookspecs import hookimpl
    from attrib_bench.core.interfaces import (
        KINDS,
        Attribution,
        Attributor,
        Batch,
        EvalContext,
        Evaluator,
        Example,
        ModelEvaluator,
    )
    from attrib_bench.core.segment_interfaces import (
        SegmentAttributor,
        SegmentEvaluator,
        StepScores,
    )
    from attrib_bench.core.trace import Trace
    from attrib_bench.core.trace_fields import TRACE_FIELDS, TraceField
    from attrib_bench.results.compare import Comparison
    from attrib_bench.results.typed import LayerScore, MethodResult, Result
    from attrib_bench.segments.scorer import SegmentScorer


#: Modules whose names give or make a Result: using one also installs how a notebook shows a
#: Result (``Result.html_view``), which the HTML report defines and results cannot import.
_RESULT_MODULES = ("attrib_bench.api", "attrib_bench.results.typed")


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attrib_bench' has no attribute {name!r}")
    if _EXPORTS[name] in _RESULT_MODULES:
        importlib.import_module("attrib_bench.reports.html")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
