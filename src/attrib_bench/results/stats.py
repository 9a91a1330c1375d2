"""Summaries of per-example scores: mean, spread, a seeded bootstrap CI, and NaNs counted apart."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

BOOTSTRAP_RESAMPLES = 1000
#: Row indices drawn at once (8 bytes each): the draws' memory stays bounded however many
#: examples a run has (one (1000, 20,000) draw would be 160 MB, and its uses several times that).
DRAW_BLOCK = 1 << 20


def resample_blocks(
    n: int, seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> Iterator[np.ndarray]:
    """The bootstrap's draws: ``resamples`` rows of ``n`` indices in [0, n) from
    ``default_rng(seed)``, in blocks of whole rows of at most ``DRAW_BLOCK`` indices, the very
    numbers one (resamples, n) draw gives."""
    rng = np.random.default_rng(seed)
    step = max(1, DRAW_BLOCK // n)
    for start in range(0, resamples, step):
        yield rng.integers(0, n, size=(min(step, resamples - start), n))


def bootstrap_ci(
    values: np.ndarray,
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
    statistic: Callable[[np.ndarray], float] | None = None,
) -> list:
    """Percentile bootstrap 95% interval of the mean (or of ``statistic`` of the resampled
    rows); [nan, nan] with fewer than 2 values."""
    if len(values) < 2:
        return [math.nan, math.nan]
    blocks = []
    for drawn in resample_blocks(len(values), seed, resamples):
        if statistic is None:
            blocks.append(values[drawn].mean(axis=1))
        else:
            blocks.append(np.array([statistic(values[rows]) for rows in drawn]))
    estimates = np.concatenate(blocks)
    low, high = np.percentile(estimates, [2.5, 97.5])
    return [float(low), float(high)]


def summarize(values: np.ndarray, seed: int) -> dict:
    """Summary of one layer's per-example scores; NaN examples are counted, never averaged."""
    values = np.asarray(values, dtype=float)
    finite = values[~np.isnan(values)]
    return {
        "mean": float(finite.mean()) if len(finite) else math.nan,
        "std": float(finite.std(ddof=1)) if len(finite) > 1 else math.nan,
        "ci95": bootstrap_ci(finite, seed),
        "n": len(finite),
        "nan": int(np.isnan(values).sum()),
    }


def summarize_layers(values_LE: np.ndarray, seed: int) -> list[dict]:
    """``summarize`` of each layer's row, numbered from 1 as the result's summaries are."""
    return [{"layer": layer + 1, **summarize(row, seed)} for layer, row in enumerate(values_LE)]


def summarize_by_answer(
    per_kind: dict[str, np.ndarray], right_E: np.ndarray, seed: int
) -> dict[str, dict[str, list[dict]]]:
    """Per answer, ``right`` and ``wrong``: per kind, the layers' summaries over the examples
    the model gets right (or wrong) alone; ``per_kind`` holds (layers, examples) scores."""
    right_E = np.asarray(right_E, dtype=bool)
    return {
        answer: {
            kind: summarize_layers(values_LE[:, keep_E], seed)
            for kind, values_LE in per_kind.items()
        }
        for answer, keep_E in (("right", right_E), ("wrong", ~right_E))
    }


def summarize_corpus(
    values_EP: np.ndarray, statistic: Callable[[np.ndarray], float], seed: int
) -> dict:
    """Summary of a corpus-level score (ERASER's macro F1): ``statistic`` of the (examples,
    parts) rows that are defined, its CI a bootstrap over examples; no per-example spread."""
    values_EP = np.asarray(values_EP, dtype=float)
    defined = ~np.isnan(values_EP).any(axis=1)
    rows = values_EP[defined]
    return {
        "mean": float(statistic(rows)) if len(rows) else math.nan,
        "std": math.nan,
        "ci95": bootstrap_ci(rows, seed, statistic=statistic),
        "n": int(defined.sum()),
        "nan": int((~defined).sum()),
    }


def rank_rows(values: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis (ties share their mean rank, as scipy.stats.rankdata)."""
    from scipy.stats import rankdata

    return rankdata(values, axis=-1)


def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row of ``a`` with the matching row of ``b`` (shape (..., n)).

    Equal to ``scipy.stats.spearmanr`` per row (Pearson of average ranks); NaN where a row is
    constant, as scipy returns.
    """
    ra = rank_rows(a)
    rb = rank_rows(np.broadcast_to(b, a.shape))
    ra = ra - ra.mean(axis=-1, keepdims=True)
    rb = rb - rb.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((ra**2).sum(axis=-1) * (rb**2).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        result = (ra * rb).sum(axis=-1) / denominator
    return np.where(denominator > 0, result, np.nan)
