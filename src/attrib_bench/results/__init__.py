"""Results: the document a run builds (``document``), the typed result every consumer can read
(``typed``), and the merge of runs over disjoint examples (``merge``).

The run's names (``document``) are resolved on first use (PEP 562): the gate, the reports and
the pytest helpers import ``typed``, and ``document`` imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrib_bench.results.merge import merge
from attrib_bench.results.typed import LayerScore, MethodResult, Result

if TYPE_CHECKING:
    from attrib_bench.results.document import (
        SCHEMA_PATH,
        SCHEMA_VERSION,
        build_result,
        check_writable,
        exit_status,
        write_json,
    )

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "LayerScore",
    "MethodResult",
    "Result",
    "build_result",
    "check_writable",
    "exit_status",
    "merge",
    "write_json",
]

#: Names this package re-exports from attrib_bench.results.document.
_DOCUMENT = (
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "build_result",
    "check_writable",
    "exit_status",
    "write_json",
)


def __getattr__(name: str) -> Any:
    if name not in _DOCUMENT:
        raise AttributeError(f"module 'attrib_bench.results' has no attribute {name!r}")
    from attrib_bench.results import document

    return getattr(document, name)
