"""Which row of an attribution an evaluator scores, and which of its tokens a ratio selects.

Public so that the built-in evaluators (faithfulness, plausibility, sanity) and third-party ones
read a method's scores and rank its tokens the same way: one row per example, k = ceil(ratio * n)
of n candidates, ties to the earlier position.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

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


def ratio_k(ratio: float, n: int) -> int:
    """How many of n candidates a ratio erases: ceil(ratio * n), immune to float noise."""
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


def erasure_mask(
    scores_BN: np.ndarray, candidates_BN: np.ndarray, ratio: float, mode: str
) -> np.ndarray:
    """Tokens to erase: the top k (``remove``), or every candidate outside the top k (``keep``)."""
    k_B = np.array([ratio_k(ratio, int(n)) for n in candidates_BN.sum(axis=1)])
    top = top_k_mask(scores_BN, candidates_BN, k_B)
    return top if mode == "remove" else candidates_BN & ~top
