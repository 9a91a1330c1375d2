"""The protocols of segment plugins: methods that score a context's segments, and evaluators
of those scores (docs/segments.md).

A segment attributor returns one score per segment, (S,), for the answer's log-probability
that the scorer it is given explains (``attrib_bench.SegmentScorer``, a layer above the core).
It asks the scorer for every ablation it needs, so that the ablations methods and evaluators
share run once. It may also have ``attribute_steps(scorer)``, each of the answer's T steps'
log-probability attributed: a (T, S) matrix whose rows sum to the scores, or ``StepScores``,
which adds the scores of the answer's own earlier tokens as inputs (the prefix, kept apart from
the segments); ``--per-step`` reports both.
A segment evaluator returns named values (``{"top1-drop": 0.4}``) for one
example's scores. Both take ``name:key=value`` parameters through ``configure``
(``attrib_bench.Configurable``), like token attributors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SegmentAttributor", "SegmentEvaluator", "StepScores"]


class StepScores(NamedTuple):
    """Each answer step attributed: to the segments, (T, S), rows summing to the method's
    scores; and to the answer's tokens a_0..a_{T-2} as inputs of the later steps, (T, T - 1),
    row t zero from column t on (step t reads only the tokens before it)."""

    segments_TS: np.ndarray
    prefix_TP: np.ndarray


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
