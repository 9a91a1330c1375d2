"""Agreement between the methods of one run (Krishna et al. 2022, "The Disagreement Problem in
Explainable Machine Learning"): per example and pair of methods, how far two explanations agree,
computed from the attributions the run already made (no extra model call).

Features are the tokens the erasure evaluators may remove (real tokens that are not special:
``toolkit.erasure.candidates``); each method's scores are its scored row, the last aggregated row
(``toolkit.ranking.scored_row``). As in the paper, a feature's rank is its place when the
features are ordered by the magnitude |score| (ties to the earlier position, as
``toolkit.ranking.top_k_mask``), and the top k are the first k of that order, k capped at the
number of features. Per example, for explanations a and b:

- ``feature``: |top_k(a) ∩ top_k(b)| / k;
- ``rank``: the share of the k ranks that hold the same feature in both;
- ``sign``: the share of the k that are in both top k with the same sign;
- ``signed_rank``: the share of the k ranks that hold the same feature with the same sign;
- ``rank_correlation``: Spearman's correlation of |a| and |b| over all the features (the paper's
  rank correlation of the rankings by magnitude), undefined (NaN) where either is constant.

The paper reports these over a range of k; ``DEFAULT_K`` is 5. A method agrees with itself
perfectly, so the matrix's diagonal is 1 by definition and is not stored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from attrib_bench.results.paired import defined_groups, resampled_means
from attrib_bench.results.stats import rank_rows

MEASURES = ("feature", "rank", "sign", "signed_rank", "rank_correlation")
#: Headings the reports show for each measure.
TITLES = {
    "feature": "feature agreement",
    "rank": "rank agreement",
    "sign": "sign agreement",
    "signed_rank": "signed-rank agreement",
    "rank_correlation": "rank correlation (Spearman of |score|)",
}
DEFAULT_K = 5


def magnitude_order(rows_MN: np.ndarray) -> np.ndarray:
    """Each row's positions by decreasing |score|; ties go to the earlier position."""
    positions = np.arange(rows_MN.shape[1])
    return np.stack([np.lexsort((positions, -np.abs(row))) for row in rows_MN])


def example_agreement(rows_MN: np.ndarray, k: int = DEFAULT_K) -> np.ndarray:
    """(M, M, len(MEASURES)) agreement of every two of M methods' scores over one example's N
    features (``MEASURES`` order); NaN everywhere when there is no feature."""
    rows_MN = np.asarray(rows_MN, dtype=float)
    count, n = rows_MN.shape
    out = np.full((count, count, len(MEASURES)), math.nan)
    if n == 0:
        return out
    k = min(k, n)
    order_MK = magnitude_order(rows_MN)[:, :k]
    top_MN = np.zeros(rows_MN.shape, dtype=bool)
    np.put_along_axis(top_MN, order_MK, True, axis=1)
    signs_MN = np.sign(rows_MN)
    top = top_MN.astype(float)
    out[..., 0] = top @ top.T / k
    same_rank_MMK = order_MK[:, None, :] == order_MK[None, :, :]
    out[..., 1] = same_rank_MMK.sum(axis=-1) / k
    signed = [(top_MN & (signs_MN == s)).astype(float) for s in (-1.0, 0.0, 1.0)]
    out[..., 2] = sum(part @ part.T for part in signed) / k
    top_signs_MK = np.take_along_axis(signs_MN, order_MK, axis=1)
    same_sign_MMK = top_signs_MK[:, None, :] == top_signs_MK[None, :, :]
    out[..., 3] = (same_rank_MMK & same_sign_MMK).sum(axis=-1) / k
    ranks_MN = rank_rows(np.abs(rows_MN))
    centred = ranks_MN - ranks_MN.mean(axis=1, keepdims=True)
    norms = np.sqrt((centred**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        correlation = (centred @ centred.T) / np.outer(norms, norms)
    defined = np.outer(norms > 0, norms > 0)
    out[..., 4] = np.where(defined, np.clip(correlation, -1.0, 1.0), math.nan)
    return out


class AgreementTally:
    """Per-example agreement of every pair of a run's methods, gathered example by example.

    Holds (pairs, measures) numbers per example, never the rows: the runner adds each example
    once every method's scored row for it is known (computed or read from the cache).
    """

    def __init__(self, methods: Sequence[str], k: int = DEFAULT_K) -> None:
        if k < 1:
            raise ValueError(f"agreement needs k >= 1, got {k}")
        self.methods = list(methods)
        self.k = k
        self.pairs = list(combinations(range(len(self.methods)), 2))
        self.first = np.array([a for a, _ in self.pairs], dtype=int)
        self.second = np.array([b for _, b in self.pairs], dtype=int)
        self.values: dict[str, np.ndarray] = {}

    def add(self, example_id: str, rows: Mapping[str, np.ndarray], features: np.ndarray) -> None:
        """One example: ``rows`` maps a method to its scored row over the example's real tokens
        (methods without one, failed ones, are NaN in its pairs); ``features`` marks the tokens
        compared (``toolkit.erasure.candidates``)."""
        present = [i for i, spec in enumerate(self.methods) if spec in rows]
        values = np.full((len(self.pairs), len(MEASURES)), math.nan)
        if present and self.pairs:
            stacked = np.stack([np.asarray(rows[self.methods[i]])[features] for i in present])
            matrix = example_agreement(stacked, self.k)
            where = np.full(len(self.methods), -1)
            where[present] = np.arange(len(present))
            first, second = where[self.first], where[self.second]
            both = (first >= 0) & (second >= 0)
            values[both] = matrix[first[both], second[both]]
        self.values[example_id] = values

    def section(self, ok: Iterable[str], example_ids: Sequence[str], seed: int) -> dict[str, Any]:
        """The result's ``agreement`` section over the methods in ``ok`` (those that ran on every
        example): per pair and measure, the mean over examples with a seeded bootstrap CI
        (``summarize_columns``: undefined examples counted in ``nan``, never averaged)."""
        kept = set(ok)
        methods = [spec for spec in self.methods if spec in kept]
        missing = np.full((len(self.pairs), len(MEASURES)), math.nan)  # never added
        values_EPM = (
            np.stack([self.values.get(i, missing) for i in example_ids]) if example_ids else None
        )
        pairs = []
        chosen = [
            pair
            for pair, (a, b) in enumerate(self.pairs)
            if self.methods[a] in kept and self.methods[b] in kept
        ]
        if values_EPM is not None and chosen:
            count = len(MEASURES)
            columns = values_EPM[:, chosen].reshape(len(example_ids), len(chosen) * count)
            summaries = summarize_columns(columns, seed)
            for index, pair in enumerate(chosen):
                a, b = self.pairs[pair]
                scores = dict(
                    zip(MEASURES, summaries[index * count : (index + 1) * count], strict=True)
                )
                pairs.append({"a": self.methods[a], "b": self.methods[b], "scores": scores})
        return {
            "k": self.k,
            "features": "real tokens without special tokens; the last aggregated row",
            "measures": list(MEASURES),
            "methods": methods,
            "pairs": pairs,
        }


def summarize_columns(values_EC: np.ndarray, seed: int) -> list[dict[str, Any]]:
    """``stats.summarize`` of each column (mean, std, 95% bootstrap CI, n, nan; NaN rows left
    out per column), the columns defined on the same examples sharing one resampling: a run's
    pairs x measures are hundreds of columns (4 s for 105 pairs on 600 examples one by one)."""
    out: list[dict[str, Any]] = [{} for _ in range(values_EC.shape[1])]
    undefined_C = np.isnan(values_EC).sum(axis=0)
    for columns, rows in defined_groups(values_EC):
        values = values_EC[rows][:, columns]
        n = len(values)
        nan = np.full(len(columns), math.nan)
        means = values.mean(axis=0) if n else nan
        spread = values.std(axis=0, ddof=1) if n > 1 else nan
        low = high = nan
        if n >= 2:
            low, high = np.percentile(resampled_means(values, seed), [2.5, 97.5], axis=0)
        for index, column in enumerate(columns):
            out[column] = {
                "mean": float(means[index]),
                "std": float(spread[index]),
                "ci95": [float(low[index]), float(high[index])],
                "n": n,
                "nan": int(undefined_C[column]),
            }
    return out


@dataclass
class Agreement:
    """The result's ``agreement`` section: per pair of methods and measure, a summary
    (``mean``, ``std``, ``ci95``, ``n``, ``nan``) over the examples."""

    k: int
    measures: list[str]
    methods: list[str]
    #: (a, b), a before b in ``methods`` -> measure -> summary (NaN: undefined)
    pairs: dict[tuple[str, str], dict[str, dict[str, Any]]]
    extra: dict[str, Any]

    @classmethod
    def from_json(cls, section: Mapping[str, Any]) -> Agreement:
        known = ("k", "measures", "methods", "pairs")
        return cls(
            k=int(section["k"]),
            measures=list(section["measures"]),
            methods=list(section["methods"]),
            pairs={
                (pair["a"], pair["b"]): {
                    measure: _summary(summary) for measure, summary in pair["scores"].items()
                }
                for pair in section["pairs"]
            },
            extra={key: value for key, value in section.items() if key not in known},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            **self.extra,
            "measures": list(self.measures),
            "methods": list(self.methods),
            "pairs": [
                {"a": a, "b": b, "scores": {m: _summary_json(s) for m, s in scores.items()}}
                for (a, b), scores in self.pairs.items()
            ],
        }

    def summary(self, measure: str, a: str, b: str) -> dict[str, Any] | None:
        """The summary of one pair in either order; None for a method with itself or absent."""
        return (self.pairs.get((a, b)) or self.pairs.get((b, a)) or {}).get(measure)

    def matrix(self, measure: str) -> np.ndarray:
        """(M, M) means in ``methods`` order: symmetric, 1 on the diagonal, NaN where unknown."""
        count = len(self.methods)
        out = np.eye(count)
        for i, j in combinations(range(count), 2):
            summary = self.summary(measure, self.methods[i], self.methods[j])
            out[i, j] = out[j, i] = math.nan if summary is None else summary["mean"]
        return out


def _summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    low, high = entry["ci95"]
    return {
        "mean": _float(entry["mean"]),
        "std": _float(entry.get("std")),
        "ci95": (_float(low), _float(high)),
        "n": int(entry["n"]),
        "nan": int(entry.get("nan", 0)),
    }


def _summary_json(summary: Mapping[str, Any]) -> dict[str, Any]:
    low, high = summary["ci95"]
    return {
        "mean": _null(summary["mean"]),
        "std": _null(summary["std"]),
        "ci95": [_null(low), _null(high)],
        "n": summary["n"],
        "nan": summary["nan"],
    }


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _null(value: float) -> float | None:
    return None if math.isnan(value) else value
