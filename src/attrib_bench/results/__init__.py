"""Results: the typed result every consumer reads (``typed``), the JSON document on disk
(``document``), and the merge of runs over disjoint examples (``merge``)."""

from __future__ import annotations

from attrib_bench.results.document import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    check_writable,
    exit_status,
    write_json,
)
from attrib_bench.results.merge import merge
from attrib_bench.results.typed import LayerScore, MethodResult, Result

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "LayerScore",
    "MethodResult",
    "Result",
    "check_writable",
    "exit_status",
    "merge",
    "write_json",
]
