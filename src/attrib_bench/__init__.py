"""attrib-bench: benchmark token-attribution methods for transformer classifiers.

The public API: everything a plugin or a Python user needs is importable from here, the
functions ``run``, ``check``, ``report`` and ``load`` (attrib_bench.api) included. The names are
resolved on first use (PEP 562), so ``attrib-bench --help`` and usage errors answer without
importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "run": "attrib_bench.api",
    "check": "attrib_bench.api",
    "report": "attrib_bench.api",
    "evaluate": "attrib_bench.api",
    "load": "attrib_bench.api",
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
    "TRACE_FIELDS": "attrib_bench.core.trace_fields",
    "Trace": "attrib_bench.model.trace",
    "TraceField": "attrib_bench.core.trace_fields",
}

__all__ = [
    "KINDS",
    "TRACE_FIELDS",
    "ArchitectureSpec",
    "Attribution",
    "Attributor",
    "Batch",
    "Configurable",
    "EvalContext",
    "Evaluator",
    "Example",
    "ExitCode",
    "ModelEvaluator",
    "Trace",
    "TraceField",
    "UsageError",
    "__version__",
    "check",
    "evaluate",
    "hookimpl",
    "load",
    "report",
    "run",
]

if TYPE_CHECKING:
    from attrib_bench.api import check, evaluate, load, report, run
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
    from attrib_bench.core.trace import Trace
    from attrib_bench.core.trace_fields import TRACE_FIELDS, TraceField


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attrib_bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
