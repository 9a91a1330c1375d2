"""Normalized AOPC (``normalise=naopc``, attrib_bench.toolkit.naopc): bounds against brute force
over every ordering, the beam search against the exact search, best and worst orderings, and
the bad inputs."""

from __future__ import annotations

import itertools
import math
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attrib_bench import Attribution, EvalContext, UsageError
from attrib_bench.core.interfaces import Batch, Example
from attrib_bench.core.trace import Trace
from attrib_bench.toolkit.naopc import (
    Beam,
    counted_sets,
    exact_bounds,
    order_value,
    step_weights,
)
from attrib_bench_plugins.faithfulness import Comprehensiveness, Sufficiency

CLS, SEP, MASK, PAD = 101, 102, 103, 0


def brute_force(n: int, weights: np.ndarray, drops: dict[int, float]) -> tuple[float, float]:
    """min and max over all n! orderings of sum_s w(s) * drop(first s), from the definition."""
    values = []
    for order in itertools.permutations(range(n)):
        total, mask = 0.0, 0
        for size, token in enumerate(order, start=1):
            mask |= 1 << token
            if weights[size] > 0:
                total += weights[size] * drops[mask]
        values.append(total)
    return min(values), max(values)


def random_drops(n: int, seed: int) -> dict[int, float]:
    rng = np.random.default_rng(seed)
    return {mask: float(rng.normal()) for mask in range(1, 1 << n)}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("sizes", ["every", "some"])
def test_exact_bounds_equal_brute_force_over_every_ordering(n, sizes):
    steps = list(range(1, n + 1)) if sizes == "every" else [math.ceil(n / 2), n, n]
    weights = step_weights(steps, n)
    drops = random_drops(n, seed=n)
    assert np.allclose(exact_bounds(n, weights, drops), brute_force(n, weights, drops))
    assert set(counted_sets(n, weights)) == {
        m for m in range(1, 1 << n) if weights[bin(m).count("1")] > 0
    }


def run_beam(n: int, size: int, drops: dict[int, float], weights: np.ndarray):
    beam = Beam(n, size)
    while not beam.done:
        beam.advance({m: drops[m] for m in beam.pending()})
    return beam.bounds(weights, drops), beam.orders()


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_a_beam_wide_enough_to_keep_every_order_is_exact(n):
    weights = step_weights(range(1, n + 1), n)
    drops = random_drops(n, seed=10 + n)
    bounds, _ = run_beam(n, math.factorial(n), drops, weights)
    assert np.allclose(bounds, exact_bounds(n, weights, drops))


def test_a_narrow_beam_finds_bounds_inside_the_exact_ones():
    n = 6
    weights = step_weights(range(1, n + 1), n)
    drops = random_drops(n, seed=3)
    (low, high), (best, worst) = run_beam(n, 2, drops, weights)
    exact_low, exact_high = exact_bounds(n, weights, drops)
    assert exact_low <= low <= high <= exact_high
    assert sorted(best) == sorted(worst) == list(range(n))
    assert order_value(best, weights, drops) == high


def test_greedy_beam_is_exact_when_drops_are_additive():
    """drop(E) = sum of token weights: the top-k by weight is the best set at every k, a
    chain, so one order per beam finds both bounds."""
    n = 6
    w = np.array([0.3, -1.2, 2.0, 0.0, 0.7, -0.4])
    drops = {m: float(sum(w[i] for i in range(n) if m >> i & 1)) for m in range(1, 1 << n)}
    weights = step_weights(range(1, n + 1), n)
    bounds, (best, worst) = run_beam(n, 1, drops, weights)
    assert np.allclose(bounds, exact_bounds(n, weights, drops))
    assert best == np.argsort(-w, kind="stable").tolist()
    assert worst == np.argsort(w, kind="stable").tolist()


# ----------------------------------------------------------------- through the evaluators

#: Six word tokens; class 1's logit sums their weights plus an interaction of the first two, so
#: that which order is best is not simply the order of the weights.
WORDS = [1, 2, 3, 4, 5, 6]
WEIGHTS = {1: 1.5, 2: 1.0, 3: -0.5, 4: 0.8, 5: 0.0, 6: -1.1}
PAIR = 2.5  # added while tokens 1 and 2 are both present


class Interacting(torch.nn.Module):
    def forward(self, input_ids, attention_mask, token_type_ids=None, position_ids=None):
        on = attention_mask.bool()
        present = {t: ((input_ids == t) & on).any(-1).double() for t in WEIGHTS}
        z = sum(w * present[t] for t, w in WEIGHTS.items()) + PAIR * present[1] * present[2]
        return SimpleNamespace(logits=torch.stack([torch.full_like(z, 0.3), z], dim=-1))


def toy(scores: list[float]) -> tuple[Attribution, EvalContext]:
    ids = torch.tensor([[CLS, *WORDS, SEP]])
    mask = torch.ones_like(ids)
    special = torch.tensor([[1] + [0] * len(WORDS) + [1]])
    batch = Batch([Example("x", "w", label=1)], ids, mask, None, special, [])
    model = Interacting()
    loaded = SimpleNamespace(
        model=model,
        tokenizer=SimpleNamespace(mask_token_id=MASK, pad_token_id=PAD, bos_token_id=None),
        position_ids=lambda ids: torch.arange(ids.shape[1]).expand_as(ids),
        is_language_model=False,
        fast_attention=nullcontext,
    )
    trace = Trace(batch=batch, loaded=loaded, logits_BC=model(ids, mask).logits.float())
    row = torch.tensor([[[0.0, *scores, 0.0]]], dtype=torch.float64)
    return Attribution(aggregated_BLN=row), EvalContext(trace, None, 0)


def score(evaluator, scores: list[float], **params) -> float:
    attribution, context = toy(scores)
    configured = evaluator.configure({k: str(v) for k, v in params.items()})
    configured.plan(attribution, context)
    return float(configured.score(attribution, context)["aggregated"][0, 0])


def order_scores(order: tuple[int, ...]) -> list[float]:
    """Scores that rank the words in ``order`` (first: highest)."""
    scores = [0.0] * len(order)
    for rank, word in enumerate(order):
        scores[word] = float(len(order) - rank)
    return scores


@pytest.mark.parametrize("evaluator", [Comprehensiveness(), Sufficiency()])
@pytest.mark.parametrize("ratios", ["all", "0.2/0.5/0.9"])
def test_the_best_ordering_scores_one_and_the_worst_zero(evaluator, ratios):
    raw = {
        order: score(evaluator, order_scores(order), ratios=ratios)
        for order in itertools.permutations(range(len(WORDS)))
    }
    best = (max if evaluator.higher_is_better else min)(raw, key=raw.get)
    worst = (min if evaluator.higher_is_better else max)(raw, key=raw.get)
    normalised = {
        order: score(evaluator, order_scores(order), ratios=ratios, normalise="naopc")
        for order in (best, worst)
    }
    # The official code's orientation: (A - lowest) / (highest - lowest), for sufficiency
    # too, whose best (lowest) AOPC scores 0.
    top, bottom = (1.0, 0.0) if evaluator.higher_is_better else (0.0, 1.0)
    assert normalised[best] == pytest.approx(top, abs=1e-12)
    assert normalised[worst] == pytest.approx(bottom, abs=1e-12)
    middle = order_scores((3, 0, 5, 1, 4, 2))
    value = score(evaluator, middle, ratios=ratios, normalise="naopc")
    low, high = min(raw.values()), max(raw.values())
    expected = (score(evaluator, middle, ratios=ratios) - low) / (high - low)
    assert value == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("evaluator", [Comprehensiveness(), Sufficiency()])
def test_exact_and_beam_search_agree_on_six_tokens(evaluator):
    scores = [0.2, 0.9, -0.3, 0.5, 0.1, 0.4]
    exact = score(evaluator, scores, ratios="all", normalise="naopc", search="exact")
    beam = score(evaluator, scores, ratios="all", normalise="naopc", search="beam", beam_size=720)
    assert beam == pytest.approx(exact, abs=1e-12)
    auto = score(evaluator, scores, ratios="all", normalise="naopc", exact_cap=5, beam_size=720)
    assert auto == pytest.approx(exact, abs=1e-12)


def test_ratios_all_is_the_mean_drop_over_every_step():
    scores = [0.2, 0.9, -0.3, 0.5, 0.1, 0.4]
    order = np.argsort(-np.array(scores), kind="stable")
    model = Interacting()
    full = torch.tensor([[CLS, *WORDS, SEP]])

    def p1(ids):
        return float(torch.softmax(model(ids, torch.ones_like(ids)).logits.double(), -1)[0, 1])

    drops = []
    for k in range(1, len(WORDS) + 1):
        erased = full.clone()
        erased[0, 1 + order[:k]] = MASK
        drops.append(p1(full) - p1(erased))
    assert score(Comprehensiveness(), scores, ratios="all") == pytest.approx(np.mean(drops))


def test_exact_search_above_the_cap_fails_with_one_line_naming_the_fix():
    with pytest.raises(UsageError) as error:
        score(Comprehensiveness(), [0.1] * 6, normalise="naopc", search="exact", exact_cap=5)
    message = str(error.value)
    assert "\n" not in message and "comprehensiveness" in message and "exact_cap" in message


@pytest.mark.parametrize(
    "params",
    [
        {"normalise": "naopc", "protocol": "ferret"},
        {"normalise": "naopc", "rationale": "positive"},
        {"normalise": "naopc", "classes": "all"},
        {"exact_cap": "17"},
        {"beam_size": "0"},
        {"ratios": "all", "rationale": "positive"},
    ],
)
def test_settings_naopc_cannot_use_fail_before_any_batch(params):
    with pytest.raises(UsageError) as error:
        Comprehensiveness().configure(params)
    assert "\n" not in str(error.value)
