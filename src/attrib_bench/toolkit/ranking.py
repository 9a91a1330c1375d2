"""Which row of an attribution an evaluator scores, and which of its tokens a ratio selects.

Public so that the built-in evaluators (faithfulness, plausibility, sanity) and third-party ones
read a method's scores and rank its tokens the same way: one row per example, k = ceil(ratio * n)
of n candidates (``rounding="floor"``: int(ratio * n), ferret's), ties to the earlier position.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from attrib_bench.core.errors import UsageError

if TYPE_CHECKING:
    import torch

    from attrib_bench.core.interfaces import Attribution


def scored_row(attribution: Attribution, layer: int) -> torch.Tensor:
    """The (B, N) row an evaluator scores: the last aggregated row, or layer ``layer`` (1-based)."""
    rows_BLN = attribution.aggregated_BLN
    count = rows_BLN.shape[1]
    if layer == -1 or count == 1:
        return rows_BLN[:, -1]
    if not 1 <= layer <= count:
        raise ValueError(f"layer={layer} asked, but the method has {count} layers")
    return rows_BLN[:, layer - 1]


def parse_ratios(text: str) -> tuple[float, ...]:
    """``"0.1/0.2"`` -> (0.1, 0.2): a "/"-separated list, since "," separates parameters."""
    try:
        ratios = tuple(float(part) for part in text.split("/") if part.strip())
    except ValueError:
        raise UsageError(f"ratios must be numbers separated by '/', got {text!r}") from None
    if not ratios or any(not 0.0 <= r <= 1.0 for r in ratios):
        raise UsageError(f"ratios must lie in [0, 1], got {text!r}")
    return ratios


ROUNDINGS = ("ceil", "floor")


def ratio_k(ratio: float, n: int, rounding: str = "ceil") -> int:
    """How many of n candidates a ratio erases: ceil(ratio * n), immune to float noise; or
    ``floor``: int(ratio * n) as ferret 0.4.2 computes it, float noise included (its thresholds
    come from np.arange, whose 0.7000000000000001 * 90 gives 63 where 0.7 * 90 gives 62)."""
    if rounding == "floor":
        return min(n, int(ratio * n))
    return min(n, math.ceil(round(ratio * n, 9)))


def top_k_mask(scores_BN: np.ndarray, candidates_BN: np.ndarray, k_B: np.ndarray) -> np.ndarray:
    """True at each row's k highest-scoring candidates; ties go to the earlier position.

    Non-candidates (padding, special tokens) are never selected, whatever their score.
    """
    positions = np.arange(scores_BN.shape[1])
    out = np.zeros(scores_BN.shape, dtype=bool)
    for row in range(scores_BN.shape[0]):
        # lexsort: the last key is primary. Candidates first, then higher scores, then position.
        order = np.lexsort((positions, -scores_BN[row], ~candidates_BN[row]))
        out[row, order[: k_B[row]]] = True
    return out & candidates_BN


def rationale_mask(
    scores_BN: np.ndarray,
    candidates_BN: np.ndarray,
    ratio: float,
    rounding: str = "ceil",
    positive: bool = False,
) -> np.ndarray:
    """The rationale of a ratio: the top k candidates, and with ``positive`` only those of them
    with a score above 0 (ferret's ``only_pos``: a top k with no positive score is empty)."""
    k_B = np.array([ratio_k(ratio, int(n), rounding) for n in candidates_BN.sum(axis=1)])
    top = top_k_mask(scores_BN, candidates_BN, k_B)
    return top & (scores_BN > 0) if positive else top


def erasure_mask(
    scores_BN: np.ndarray,
    candidates_BN: np.ndarray,
    ratio: float,
    mode: str,
    rounding: str = "ceil",
    positive: bool = False,
) -> np.ndarray:
    """Tokens to erase: the rationale (``remove``), or every candidate outside it (``keep``)."""
    top = rationale_mask(scores_BN, candidates_BN, ratio, rounding, positive)
    return top if mode == "remove" else candidates_BN & ~top


def auprc(truth: np.ndarray, scores: np.ndarray) -> float:
    """Area under the precision-recall curve, as ``sklearn.metrics.auc(recall, precision)``
    over ``precision_recall_curve(truth, scores)``: one point per distinct score threshold plus
    (recall 0, precision 1), joined by straight lines. NaN without a positive."""
    if not truth.any():
        return math.nan
    order = np.argsort(-scores, kind="mergesort")
    ranked_scores, ranked_truth = scores[order], truth[order].astype(float)
    last_of_threshold = np.r_[np.flatnonzero(np.diff(ranked_scores)), len(ranked_truth) - 1]
    true_positives = np.cumsum(ranked_truth)[last_of_threshold]
    precision = true_positives / (last_of_threshold + 1)
    recall = true_positives / true_positives[-1]
    precision, recall = np.r_[1.0, precision], np.r_[0.0, recall]
    return float(np.sum(np.diff(recall) * (precision[1:] + precision[:-1]) / 2))
