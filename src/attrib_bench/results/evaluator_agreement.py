"""Agreement between the evaluators of one run: do two evaluators put the run's methods in the
same order? Computed from the per-example scores the result already holds (no model call).

Per kind of row (``aggregated``, ``local``) and every two evaluators a and b, each evaluator
ranks the methods by its summary score, the one the leaderboard ranks by (the last layer's mean
over the examples, NaN examples left out), oriented by its ``higher_is_better`` (a lower-is-better
score is negated), so that both orders run from best to worst. The agreement is Kendall's tau-b
(``scipy.stats.kendalltau``) between the two oriented score vectors over the methods both rank:
1 when they order the methods alike, -1 when one reverses the other, ties counted as tau-b does
(Kendall 1945, "The treatment of ties in ranking problems"). It shows when two evaluators would
crown different methods, as raw and normalised AOPC can (Edin et al., ACL 2025).

Left out of a pair's comparison: a method that failed, or is undefined (NaN on every example),
under either evaluator, and the reference method under an evaluator that compares with it (it
scores itself perfectly by construction). Corpus-level evaluators (``parts``/``aggregate``:
ERASER's macro F1) are skipped, as in ``results.paired``: their summary is an aggregate of parts,
not a mean of the per-example scores a resample can recompute.

The 95% CI is a percentile bootstrap over the examples, paired: each resample draws the same
examples for every evaluator and method (``paired.resampled_means``, the run's seed), each
method's summary is recomputed over them, and so is tau; resamples where tau is undefined (fewer
than two methods scored, or one ranking all ties) are left out of the percentiles.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from attrib_bench.results.paired import resampled_means
from attrib_bench.results.stats import BOOTSTRAP_RESAMPLES, rank_rows

STATISTIC = (
    "Kendall tau-b (scipy.stats.kendalltau) between two evaluators' method rankings, each by "
    "the last layer's mean score oriented by higher_is_better; 95% percentile bootstrap CI "
    "over examples, the same resampled examples for every evaluator and method"
)
LEFT_OUT = (
    "per pair, the methods that failed or are undefined under either evaluator, and the "
    "reference under an evaluator that compares with it"
)
RULE = "tau <= 0, or the lower bound of its 95% CI <= 0"


def _oriented_means(
    per_example: Mapping[str, Mapping[str, Mapping[str, Sequence[Sequence[float | None]]]]],
    evaluators: Sequence[str],
    methods: Sequence[str],
    kind: str,
    signs: Mapping[str, float],
    left_out: Mapping[str, Collection[str]],
) -> np.ndarray:
    """(examples, evaluators, methods) last-layer scores, sign-oriented; NaN where a method has
    none (failed, never scored) or is left out (``left_out``: evaluator -> the methods)."""
    columns = []
    count = None
    for evaluator in evaluators:
        for spec in methods:
            layers = per_example[spec].get(evaluator, {}).get(kind)
            if not layers or spec in left_out[evaluator]:
                columns.append(None)
                continue
            row = np.array([math.nan if v is None else v for v in layers[-1]], dtype=float)
            columns.append(signs[evaluator] * row)
            count = len(row)
    if count is None:
        return np.empty((0, len(evaluators), len(methods)))
    filled = [np.full(count, math.nan) if c is None else c for c in columns]
    return np.stack(filled, axis=1).reshape(count, len(evaluators), len(methods))


def _tau(x: np.ndarray, y: np.ndarray) -> float:
    """tau-b over the entries both define; NaN below two, or where a side ranks all alike."""
    from scipy.stats import kendalltau  # here: reading a result must not import scipy

    both = ~(np.isnan(x) | np.isnan(y))
    x, y = x[both], y[both]
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(kendalltau(x, y).statistic)


def _resampled_taus(x_RK: np.ndarray, y_RK: np.ndarray) -> np.ndarray:
    """``_tau`` of each resample's two rows, scipy called once per distinct pair of rankings
    (tau-b reads only the ranks, ties included): with few methods most resamples repeat one,
    and scipy's per-call cost (~0.1-0.4 ms) times 1000 resamples times every pair adds up."""
    from scipy.stats import kendalltau

    taus = np.full(len(x_RK), math.nan)
    complete = ~(np.isnan(x_RK) | np.isnan(y_RK)).any(axis=1)
    count = x_RK.shape[1]
    if complete.any() and count >= 2:
        ranks = np.concatenate([rank_rows(x_RK[complete]), rank_rows(y_RK[complete])], axis=1)
        distinct, inverse = np.unique(ranks, axis=0, return_inverse=True)
        # A side ranking every method alike has no tau-b (NaN); scipy is asked only the rest.
        varied = (np.ptp(distinct[:, :count], axis=1) > 0) & (
            np.ptp(distinct[:, count:], axis=1) > 0
        )
        found = np.full(len(distinct), math.nan)
        if varied.any():
            x, y = distinct[varied, :count], distinct[varied, count:]
            # tau-b is the same whichever p-value scipy computes: the asymptotic one is the
            # cheaper (scipy's divides by n - 2, so not with two methods).
            method = "asymptotic" if count > 2 else "auto"
            found[varied] = np.atleast_1d(kendalltau(x, y, axis=1, method=method).statistic)
        taus[complete] = found[inverse.reshape(-1)]
    for row in np.flatnonzero(~complete):  # a method undefined on every drawn example
        taus[row] = _tau(x_RK[row], y_RK[row])
    return taus


def _kind_section(
    values_EVM: np.ndarray, evaluators: list[str], methods: list[str], seed: int
) -> dict[str, Any]:
    """One kind's evaluators and pairs (see the module doc)."""
    count, n_eval, n_methods = values_EVM.shape
    defined_EVM = ~np.isnan(values_EVM)
    with np.errstate(invalid="ignore"):
        point_VM = np.nansum(values_EVM, axis=0) / defined_EVM.sum(axis=0)
    resampled_RVM = None
    if count >= 2:
        flat = (count, n_eval * n_methods)
        sums = resampled_means(np.nan_to_num(values_EVM).reshape(flat), seed)
        drawn = resampled_means(defined_EVM.reshape(flat).astype(float), seed)  # same draws
        with np.errstate(invalid="ignore", divide="ignore"):
            resampled_RVM = (sums / drawn).reshape(-1, n_eval, n_methods)
    pairs = []
    for a, b in combinations(range(n_eval), 2):
        kept = ~(np.isnan(point_VM[a]) | np.isnan(point_VM[b]))
        tau = _tau(point_VM[a], point_VM[b])
        low = high = math.nan
        if resampled_RVM is not None and not math.isnan(tau):
            taus = _resampled_taus(resampled_RVM[:, a, kept], resampled_RVM[:, b, kept])
            if (~np.isnan(taus)).any():
                low, high = np.nanpercentile(taus, [2.5, 97.5])
        pairs.append(
            {
                "a": evaluators[a],
                "b": evaluators[b],
                "tau": None if math.isnan(tau) else tau,
                "ci95": [None if math.isnan(v) else float(v) for v in (low, high)],
                "methods": int(kept.sum()),
                "left_out": [spec for spec, k in zip(methods, kept, strict=True) if not k],
            }
        )
    return {"evaluators": evaluators, "pairs": pairs}


def evaluator_agreement_section(
    per_example: Mapping[str, Mapping[str, Mapping[str, Sequence[Sequence[float | None]]]]],
    evaluator_info: Mapping[str, Mapping[str, Any]],
    references: Collection[str],
    seed: int,
) -> dict[str, Any]:
    """The result's ``evaluator_agreement`` section. ``per_example``: per method spec that ran,
    its per-example scores (evaluator -> kind -> per layer, one value per example in the
    result's order, None or NaN undefined; a failed pair absent), as ``paired_section`` reads
    them; ``evaluator_info``: the result's (``higher_is_better``, ``needs_reference``,
    ``corpus_level``), whose order orders the evaluators; ``references``: the specs the reference
    ran under (the result's ``reference``, and the row added for it)."""
    methods = list(per_example)
    present = dict.fromkeys(e for scores in per_example.values() for e in scores)
    ordered = [e for e in evaluator_info if e in present] + [
        e for e in present if e not in evaluator_info
    ]
    info = {e: evaluator_info.get(e, {}) for e in ordered}
    skipped = [e for e in ordered if info[e].get("corpus_level")]
    ranking = [e for e in ordered if e not in skipped]
    signs = {e: 1.0 if info[e].get("higher_is_better", True) else -1.0 for e in ranking}
    compared = set(references)
    left_out = {e: compared if info[e].get("needs_reference", True) else set() for e in ranking}
    kinds = {}
    for kind in ("aggregated", "local"):
        evaluators = [e for e in ranking if any(kind in per_example[m].get(e, {}) for m in methods)]
        if len(evaluators) < 2:
            continue
        values = _oriented_means(per_example, evaluators, methods, kind, signs, left_out)
        kinds[kind] = _kind_section(values, evaluators, methods, seed)
    return {
        "statistic": STATISTIC,
        "resamples": BOOTSTRAP_RESAMPLES,
        "layer": "last",
        "left_out": LEFT_OUT,
        "disagree": RULE,
        "skipped": skipped,
        "kinds": kinds,
    }


@dataclass(frozen=True)
class EvaluatorPair:
    """Two evaluators' agreement on one kind: tau-b, its 95% CI, the methods both ranked."""

    a: str
    b: str
    tau: float
    ci95: tuple[float, float]
    methods: int
    left_out: tuple[str, ...] = ()

    def disagrees(self) -> bool:
        """``RULE``: tau <= 0 or a CI reaching 0; an undefined tau is not a disagreement."""
        if math.isnan(self.tau):
            return False
        return self.tau <= 0 or (not math.isnan(self.ci95[0]) and self.ci95[0] <= 0)


@dataclass
class EvaluatorAgreement:
    """The result's ``evaluator_agreement`` section: per kind, its evaluators and every pair."""

    #: kind -> the evaluators it ranks by, in the result's order
    evaluators: dict[str, list[str]]
    #: kind -> (a, b), a before b in ``evaluators[kind]`` -> the pair
    pairs: dict[str, dict[tuple[str, str], EvaluatorPair]]
    #: ``statistic``, ``resamples``, ``skipped`` and any other key, kept as they are.
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, section: Mapping[str, Any]) -> EvaluatorAgreement:
        def number(value: Any) -> float:
            return math.nan if value is None else float(value)

        kinds = section["kinds"]
        return cls(
            evaluators={kind: list(entry["evaluators"]) for kind, entry in kinds.items()},
            pairs={
                kind: {
                    (p["a"], p["b"]): EvaluatorPair(
                        p["a"],
                        p["b"],
                        number(p["tau"]),
                        (number(p["ci95"][0]), number(p["ci95"][1])),
                        int(p["methods"]),
                        tuple(p.get("left_out", ())),
                    )
                    for p in entry["pairs"]
                }
                for kind, entry in kinds.items()
            },
            extra={k: v for k, v in section.items() if k != "kinds"},
        )

    def to_json(self) -> dict[str, Any]:
        def null(value: float) -> float | None:
            return None if math.isnan(value) else value

        return {
            **self.extra,
            "kinds": {
                kind: {
                    "evaluators": list(evaluators),
                    "pairs": [
                        {
                            "a": p.a,
                            "b": p.b,
                            "tau": null(p.tau),
                            "ci95": [null(p.ci95[0]), null(p.ci95[1])],
                            "methods": p.methods,
                            "left_out": list(p.left_out),
                        }
                        for p in self.pairs[kind].values()
                    ],
                }
                for kind, evaluators in self.evaluators.items()
            },
        }

    def pair(self, kind: str, a: str, b: str) -> EvaluatorPair | None:
        """The pair in either order (tau is symmetric); None for one evaluator or absent."""
        entries = self.pairs.get(kind, {})
        return entries.get((a, b)) or entries.get((b, a))

    def matrix(self, kind: str) -> np.ndarray:
        """(V, V) tau in ``evaluators[kind]`` order: symmetric, 1 on the diagonal, NaN unknown."""
        names = self.evaluators.get(kind, [])
        out = np.eye(len(names))
        for i, j in combinations(range(len(names)), 2):
            found = self.pair(kind, names[i], names[j])
            out[i, j] = out[j, i] = math.nan if found is None else found.tau
        return out

    def disagreeing(self, kind: str) -> list[EvaluatorPair]:
        """The pairs of ``kind`` that disagree by ``RULE``, in section order."""
        return [p for p in self.pairs.get(kind, {}).values() if p.disagrees()]
