"""Results: the document a run builds (``document``), the typed result every consumer can read
(``typed``), and the merge of runs over disjoint examples (``merge``)."""

from attrib_bench.results.document import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    build_result,
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
    "build_result",
    "exit_status",
    "merge",
    "write_json",
]
