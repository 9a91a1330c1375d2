"""Paired comparison of methods: is one method's score really above another's on the same
examples, or could the order be the luck of which examples were drawn?

For every pair of methods, evaluator and kind, on the last layer (the one leaderboards rank by):
the mean of the per-example differences d = score(a) - score(b) over the examples both scored
(an example where either score is NaN is dropped from that pair), a 95% percentile bootstrap CI
of that mean, resampling examples (the same indices for both methods: resampling d is
resampling the pairs), and a two-sided p-value from the same resamples (``paired_bootstrap``).
Corpus-level evaluators (``parts``/``aggregate``, ERASER's macro F1) are skipped: their score is
an aggregate of parts the result does not keep, not a mean of per-example scores, and a
per-example difference would compare something else.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from attrib_bench.results.stats import BOOTSTRAP_RESAMPLES, resample_blocks

#: The significance level of the leaderboards' "not significantly worse" marker.
ALPHA = 0.05
TEST = (
    "paired bootstrap over examples: 95% percentile CI of the mean difference, two-sided "
    "p = 2 * min(share of resampled means <= 0, share >= 0), add-one corrected"
)


def resampled_means(
    values_EC: np.ndarray, seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> np.ndarray:
    """(resamples, C): each column's mean over rows drawn with replacement, the draws of
    ``stats.bootstrap_ci`` (same seed, same row count) shared by every column.

    One draw and one matrix product (how often each row was drawn, times the values) instead of
    a draw per column: a run compares every pair of methods under every evaluator, hundreds of
    columns over the same examples. Equal to ``values[drawn].mean(axis=1)`` up to rounding.
    """
    n = values_EC.shape[0]
    means = []
    for drawn in resample_blocks(n, seed, resamples):  # bounded memory (stats.DRAW_BLOCK)
        offsets = n * np.arange(len(drawn))[:, None]
        counts = np.bincount((drawn + offsets).ravel(), minlength=drawn.size)
        means.append(counts.reshape(drawn.shape).astype(float) @ values_EC / n)
    return np.concatenate(means)


def defined_groups(values_EC: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(columns, rows) of each set of columns defined (not NaN) on the same rows: the columns
    a shared resampling serves (``resampled_means``)."""
    defined_EC = ~np.isnan(values_EC)
    groups: dict[bytes, list[int]] = {}
    for column in range(values_EC.shape[1]):
        groups.setdefault(np.packbits(defined_EC[:, column]).tobytes(), []).append(column)
    for columns in groups.values():
        yield np.array(columns), defined_EC[:, columns[0]]


def paired_bootstrap(
    a_E: np.ndarray, b_E: np.ndarray, seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> dict[str, Any]:
    """Mean difference a - b, its 95% CI and two-sided p over the examples both define.

    Why this p-value: it tests the statistic the leaderboard ranks by and the CI describes (the
    mean difference), with no normality or symmetry assumption (a Wilcoxon signed-rank test
    asks whether d is symmetric about 0, its pseudo-median, and drops every zero difference).
    It inverts the percentile CI: p < 0.05 exactly when the resampled means fall on one side of
    0 in fewer than 2.5% of the resamples, so "p >= 0.05" and "the CI covers 0" agree (up to
    the CI's interpolation). The add-one correction (Davison & Hinkley 1997) keeps p above 0:
    with 1000 resamples the smallest p is 2/1001. The draws are those of ``stats.bootstrap_ci``
    with the same seed, so the CI is ``bootstrap_ci(d, seed)`` (up to rounding). Identical
    scores give d = 0, CI [0, 0] and p = 1. Fewer than two examples: no CI and no p (NaN).
    """
    d_E1 = (np.asarray(a_E, dtype=float) - np.asarray(b_E, dtype=float))[:, None]
    return paired_differences(d_E1, seed, resamples)[0]


def paired_differences(
    d_EC: np.ndarray, seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> list[dict[str, Any]]:
    """``paired_bootstrap`` of each column of per-example differences (NaN rows dropped per
    column), the columns defined on the same examples sharing one resampling."""
    entries: list[dict[str, Any]] = [{} for _ in range(d_EC.shape[1])]
    for columns, rows in defined_groups(d_EC):
        values = d_EC[rows][:, columns]
        n = len(values)
        means = values.mean(axis=0) if n else np.full(len(columns), math.nan)
        low = high = p = np.full(len(columns), math.nan)
        if n >= 2:
            estimates = resampled_means(values, seed, resamples)
            low, high = np.percentile(estimates, [2.5, 97.5], axis=0)
            tail = np.minimum((estimates <= 0).sum(axis=0), (estimates >= 0).sum(axis=0))
            p = np.minimum(1.0, 2.0 * (tail + 1) / (resamples + 1))
        for index, column in enumerate(columns):
            entries[column] = {
                "mean": float(means[index]),
                "ci95": [float(low[index]), float(high[index])],
                "p": float(p[index]),
                "n": n,
            }
    return entries


def _last_layer(per_example: Mapping[str, Any], evaluator: str, kind: str) -> np.ndarray | None:
    layers = per_example.get(evaluator, {}).get(kind)
    if not layers:
        return None
    return np.array([math.nan if v is None else v for v in layers[-1]], dtype=float)


def paired_section(
    per_example: Mapping[str, Mapping[str, Any]],
    corpus_level: Sequence[str],
    seed: int,
) -> dict[str, Any]:
    """The result's ``paired`` section. ``per_example``: per method spec (the methods that ran),
    its ``per_example`` scores (evaluator -> kind -> per layer, one value per example in the
    result's order, None or NaN undefined); ``corpus_level``: the evaluators to skip."""
    skipped = set(corpus_level)
    methods = list(per_example)
    evaluators = list(dict.fromkeys(e for scores in per_example.values() for e in scores))
    section: dict[str, Any] = {
        "test": TEST,
        "resamples": BOOTSTRAP_RESAMPLES,
        "layer": "last",
        "alpha": ALPHA,
        "skipped": sorted(e for e in evaluators if e in skipped),
        "evaluators": {},
    }
    for evaluator in evaluators:
        if evaluator in skipped:
            continue
        kinds: dict[str, list[dict[str, Any]]] = {}
        for kind in ("aggregated", "local"):
            rows = {m: _last_layer(per_example[m], evaluator, kind) for m in methods}
            present = [m for m in methods if rows[m] is not None]
            pairs = [(a, b) for a, b in combinations(present, 2) if len(rows[a]) == len(rows[b])]
            if not pairs:
                continue
            d_EC = np.stack([rows[a] - rows[b] for a, b in pairs], axis=1)
            kinds[kind] = [
                {"a": a, "b": b, **entry}
                for (a, b), entry in zip(pairs, paired_differences(d_EC, seed), strict=True)
            ]
        if kinds:
            section["evaluators"][evaluator] = kinds
    return section


@dataclass
class Comparison:
    """One pair's difference ``a - b`` (last layer): mean, 95% CI, two-sided p, examples."""

    a: str
    b: str
    mean: float
    ci95: tuple[float, float]
    p: float
    n: int

    def flipped(self) -> Comparison:
        low, high = self.ci95
        return Comparison(self.b, self.a, -self.mean, (-high, -low), self.p, self.n)

    def significant(self, alpha: float = ALPHA) -> bool:
        """True when p < alpha (NaN p, too few examples: False)."""
        return not math.isnan(self.p) and self.p < alpha


@dataclass
class Paired:
    """The result's ``paired`` section: evaluator -> kind -> the comparisons of every pair."""

    comparisons: dict[str, dict[str, dict[tuple[str, str], Comparison]]]
    alpha: float
    #: ``test``, ``resamples``, ``layer``, ``skipped`` and any other key, kept as they are.
    extra: dict[str, Any]

    @classmethod
    def from_json(cls, section: Mapping[str, Any]) -> Paired:
        comparisons = {
            evaluator: {
                kind: {(e["a"], e["b"]): _comparison(e) for e in entries}
                for kind, entries in kinds.items()
            }
            for evaluator, kinds in section["evaluators"].items()
        }
        extra = {k: v for k, v in section.items() if k not in ("evaluators", "alpha")}
        return cls(comparisons, float(section.get("alpha", ALPHA)), extra)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "alpha": self.alpha,
            "evaluators": {
                evaluator: {
                    kind: [_comparison_json(c) for c in entries.values()]
                    for kind, entries in kinds.items()
                }
                for evaluator, kinds in self.comparisons.items()
            },
        }

    def comparison(self, evaluator: str, kind: str, a: str, b: str) -> Comparison | None:
        """``a - b`` whichever order the section holds the pair in; None when absent."""
        entries = self.comparisons.get(evaluator, {}).get(kind, {})
        if (a, b) in entries:
            return entries[(a, b)]
        if (b, a) in entries:
            return entries[(b, a)].flipped()
        return None


def _comparison(entry: Mapping[str, Any]) -> Comparison:
    low, high = entry["ci95"]
    number = [math.nan if v is None else float(v) for v in (entry["mean"], low, high, entry["p"])]
    return Comparison(
        entry["a"], entry["b"], number[0], (number[1], number[2]), number[3], int(entry["n"])
    )


def _comparison_json(comparison: Comparison) -> dict[str, Any]:
    def null(value: float) -> float | None:
        return None if math.isnan(value) else value

    low, high = comparison.ci95
    return {
        "a": comparison.a,
        "b": comparison.b,
        "mean": null(comparison.mean),
        "ci95": [null(low), null(high)],
        "p": null(comparison.p),
        "n": comparison.n,
    }
