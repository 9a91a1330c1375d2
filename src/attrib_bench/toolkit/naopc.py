"""Normalized AOPC (Edin et al. 2025): the lowest and highest AOPC any ordering of an example's
tokens can reach, so that an AOPC can be rescaled to [0, 1] between them.

An AOPC evaluator removes a chain of nested token sets E_1, E_2, ... (of fixed sizes, the same
for every ordering of the n tokens) and scores A(order) = sum_s w(s) * drop(E_s), with
drop(E) = f(x) - f(x without E) and w(s) the share of the evaluator's steps that erase s tokens
(comprehensiveness erases the top k; sufficiency keeps them, erasing the other n - k).
``exact_bounds`` finds the minimum and maximum over all n! orderings by dynamic programming
over the 2^n token sets (the best chain ending in a set extends the best chain ending in one of
its subsets one token smaller), which is the maximum over every permutation that the official
code (``JoakimEdin/naopc``, ``calculate_aopc_limits.py``) enumerates, at 2^n * n steps instead
of n!. ``Beam`` is the official beam search (``bound_approximation_methods.py``): two beams of
removal orders, one kept by the highest and one by the lowest cumulative drop over every step
1..n, each extended by every remaining token per step, ties kept in the order of the
extensions; its bounds are the evaluator's own AOPC of the two best orders found. Sets are
bit masks over the example's n candidate tokens (bit i: the i-th candidate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


def step_weights(sizes: Sequence[int], n: int) -> np.ndarray:
    """w(s) for s = 0..n: the share of the steps ``sizes`` (one erased-set size per step,
    repeats counted) that erase s tokens."""
    weights = np.zeros(n + 1)
    for size in sizes:
        weights[size] += 1.0 / len(sizes)
    return weights


def counted_sets(n: int, weights: np.ndarray) -> list[int]:
    """Every set of a size some step erases (size 0 left out: it drops nothing): the sets
    whose drop ``exact_bounds`` reads, 2^n at most."""
    masks = np.arange(1 << n)
    sizes = popcounts(masks)
    return masks[(sizes > 0) & (weights[sizes] > 0)].tolist()


def popcounts(masks: np.ndarray) -> np.ndarray:
    """How many bits each mask sets."""
    counts = np.zeros(masks.shape, dtype=np.int64)
    rest = masks.copy()
    while rest.any():
        counts += rest & 1
        rest >>= 1
    return counts


def exact_bounds(n: int, weights: np.ndarray, drops: Mapping[int, float]) -> tuple[float, float]:
    """(lowest, highest) A over all orderings of n tokens; ``drops`` holds drop(E) of every set
    of ``counted_sets``."""
    masks = np.arange(1 << n)
    sizes = popcounts(masks)
    values = np.zeros(1 << n)
    counted = (sizes > 0) & (weights[sizes] > 0)
    values[counted] = [weights[sizes[m]] * drops[m] for m in masks[counted].tolist()]
    low, high = values.copy(), values.copy()
    for size in range(1, n + 1):
        level = masks[sizes == size]
        below_low = np.full(len(level), np.inf)
        below_high = np.full(len(level), -np.inf)
        for bit in range(n):
            has = (level >> bit) & 1 == 1
            smaller = level[has] ^ (1 << bit)
            below_low[has] = np.minimum(below_low[has], low[smaller])
            below_high[has] = np.maximum(below_high[has], high[smaller])
        low[level] += below_low
        high[level] += below_high
    full = (1 << n) - 1
    return float(low[full]), float(high[full])


@dataclass
class _Order:
    """A partial removal order and its cumulative drop over every step so far."""

    removed: list[int]
    mask: int = 0
    score: float = 0.0


@dataclass
class Beam:
    """The official beam search for one example: ``pending`` names the sets whose drop the next
    step needs, ``advance`` takes them; after n steps ``bounds`` gives (lowest, highest) A of the
    two best orders (see the module docstring)."""

    n: int
    size: int
    descending: list[_Order] = field(init=False)
    ascending: list[_Order] = field(init=False)
    steps: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.descending, self.ascending = [_Order([])], [_Order([])]

    @property
    def done(self) -> bool:
        return self.steps == self.n

    def _extended(self, beam: list[_Order]) -> list[_Order]:
        return [
            _Order([*order.removed, i], order.mask | (1 << i), order.score)
            for order in beam
            for i in range(self.n)
            if not order.mask >> i & 1
        ]

    def pending(self) -> list[int]:
        """The sets the next step scores (each once)."""
        if self.done:
            return []
        extended = self._extended(self.descending) + self._extended(self.ascending)
        return list(dict.fromkeys(order.mask for order in extended))

    def advance(self, drops: Mapping[int, float]) -> None:
        """One step: extend both beams by every remaining token and keep the best ``size``."""
        beams = []
        for beam, highest in ((self.descending, True), (self.ascending, False)):
            extended = self._extended(beam)
            for order in extended:
                order.score += drops[order.mask]
            beams.append(sorted(extended, key=lambda o: o.score, reverse=highest)[: self.size])
        self.descending, self.ascending = beams
        self.steps += 1

    def orders(self) -> tuple[list[int], list[int]]:
        """The best order of each beam: (highest cumulative drop, lowest)."""
        return self.descending[0].removed, self.ascending[0].removed

    def bounds(self, weights: np.ndarray, drops: Mapping[int, float]) -> tuple[float, float]:
        """(lowest, highest) A of the two best orders; every prefix's drop was scored on the
        way (``drops`` holds it)."""
        values = [order_value(order, weights, drops) for order in self.orders()]
        return min(values), max(values)


def order_value(order: Sequence[int], weights: np.ndarray, drops: Mapping[int, float]) -> float:
    """A of a removal order: sum over its prefixes E_s of w(s) * drop(E_s)."""
    total, mask = 0.0, 0
    for size, token in enumerate(order, start=1):
        mask |= 1 << token
        if weights[size] > 0:
            total += weights[size] * drops[mask]
    return total


def normalised(aopc: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """(A - lowest) / (highest - lowest); 0 where the two are equal (as the official code)."""
    span = high - low
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(span == 0, 0.0, (aopc - low) / span)
