"""The protocols of segment plugins: methods that score a context's segments, and evaluators
of those scores (docs/segments.md).

A segment attributor returns one score per segment, (S,), for the answer's log-probability
that the scorer it is given explains (``attrib_bench.SegmentScorer``, a layer above the core).
It asks the scorer for every ablation it needs, so that the ablations methods and evaluators
share run once. It may also have ``attribute_steps(scorer) -> (T, S)``, each of the answer's T
steps' log-probability attributed (rows summing to the scores), which ``--per-step`` reports.
A segment evaluator returns named values (``{"top1-drop": 0.4}``) for one
example's scores. Both take ``name:key=value`` parameters through ``configure``
(``attrib_bench.Configurable``), like token attributors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SegmentAttributor", "SegmentEvaluator"]


@runtime_checkable
class SegmentAttributor(Protocol):
    name: str
    description: str

    def attribute_segments(self, scorer: Any) -> np.ndarray:
        """One score per segment, (S,): higher means the segment raises the answer's score."""
        ...


@runtime_checkable
class SegmentEvaluator(Protocol):
    name: str
    description: str

    def evaluate_segments(self, scorer: Any, scores_S: np.ndarray) -> dict[str, float]:
        """Named values for one example's segment scores; NaN where a value is undefined."""
        ...
