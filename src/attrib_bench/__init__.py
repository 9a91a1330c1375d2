"""attrib-bench: benchmark token-attribution methods for transformer classifiers.

The public API: everything a plugin or a Python user needs is importable from here.
"""

from attrib_bench.base import Configurable
from attrib_bench.errors import ExitCode, UsageError
from attrib_bench.hookspecs import hookimpl
from attrib_bench.interfaces import (
    KINDS,
    Attribution,
    Attributor,
    Batch,
    EvalContext,
    Evaluator,
    Example,
)
from attrib_bench.model.trace import TRACE_FIELDS, Trace

__version__ = "0.1.0"

__all__ = [
    "KINDS",
    "TRACE_FIELDS",
    "Attribution",
    "Attributor",
    "Batch",
    "Configurable",
    "EvalContext",
    "Evaluator",
    "Example",
    "ExitCode",
    "Trace",
    "UsageError",
    "__version__",
    "hookimpl",
]
