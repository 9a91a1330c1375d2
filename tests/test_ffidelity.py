"""F-Fidelity (``ffidelity``): FFid+ and FFid- against a float64 reference from the paper's
definition on the toy evidence model, the bound on what a sample removes, seeded draws that do
not depend on the batch, the scorer, and bad settings."""

from __future__ import annotations

import itertools
import math
import shutil

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch
from test_faithfulness import BIAS0, WEIGHTS, A, B, C, sigmoid, toy_trace

from attrib_bench import Attribution, EvalContext, UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.ffidelity import FFID_RATIOS, FFidelity, removal_probability


def toy(scores: list[float], pad: int = 0):
    """The toy trace of [CLS] A B C [SEP] with ``scores`` on A, B, C; [CLS] and [SEP] score
    highest, so a selection that took them would show."""
    return toy_trace([5.0, *scores, 4.0], pad=pad)


def _evaluate(evaluator: FFidelity, attribution, context) -> np.ndarray:
    evaluator.plan(attribution, context)
    return evaluator.score(attribution, context)["aggregated"][0]


def reference(
    scores: list[float], mode: str, ratios: list[float], alpha: float, beta: float, output: str
) -> float:
    """The mean over ratios of f(x) - E_M f(x without M), M a random subset of the top (plus)
    or bottom (minus) k = ceil(r * n) tokens, each in M with probability min(alpha, beta n / k),
    the expectation summed exactly over every subset; f = p(class 1) or [argmax is class 1]."""
    tokens = [A, B, C]
    n = len(tokens)

    def f(present: list[int]) -> float:
        z = sum(WEIGHTS.get(t, 0.0) for t in present)
        return sigmoid(z - BIAS0) if output == "probability" else float(z > BIAS0)

    sign = -1.0 if mode == "plus" else 1.0
    order = sorted(range(n), key=lambda i: (sign * scores[i], i))
    drops = []
    for ratio in ratios:
        k = min(n, math.ceil(round(ratio * n, 9)))
        selected = order[:k]
        p = min(alpha, beta * n / k)
        expected = 0.0
        for size in range(k + 1):
            for removed in itertools.combinations(selected, size):
                weight = p**size * (1 - p) ** (k - size)
                expected += weight * f([t for i, t in enumerate(tokens) if i not in removed])
        drops.append(f(tokens) - expected)
    return float(np.mean(drops))


@pytest.mark.parametrize("mode", ["plus", "minus"])
@pytest.mark.parametrize("output", ["probability", "accuracy"])
@pytest.mark.parametrize(("alpha", "beta"), [(0.5, 0.1), (0.5, 1.0), (1.0, 1.0)])
def test_ffidelity_matches_the_definition_on_the_toy_model(mode, output, alpha, beta):
    scores = [0.1, 0.9, -0.3]  # ranks B, A, C (the evidence ranks A, B, C)
    ratios = [0.34, 0.67, 1.0]
    _, attribution, context = toy(scores)
    evaluator = FFidelity().configure(
        {
            "mode": mode,
            "output": output,
            "alpha": str(alpha),
            "beta": str(beta),
            "ratios": "/".join(map(str, ratios)),
            "samples": "3000",
        }
    )
    got = _evaluate(evaluator, attribution, context)
    expected = reference(scores, mode, ratios, alpha, beta, output)
    assert got == pytest.approx(expected, abs=0.025)  # 3000 draws: a few standard errors
    if alpha == beta == 1.0:  # every selected token removed: no randomness left
        assert got == pytest.approx(expected, abs=1e-12)


def test_ffid_plus_ranks_the_true_evidence_above_its_reverse():
    """FFid+ is higher and FFid- lower for the exact ranking (A, B, C) than for its reverse."""
    truth, reverse = [2.0, 1.0, 0.0], [0.0, 1.0, 2.0]
    values = {}
    for mode in ("plus", "minus"):
        evaluator = FFidelity().configure({"mode": mode, "samples": "200", "beta": "0.5"})
        for name, scores in (("truth", truth), ("reverse", reverse)):
            _, attribution, context = toy(scores)
            values[mode, name] = _evaluate(evaluator, attribution, context)
    assert values["plus", "truth"] > values["plus", "reverse"]
    assert values["minus", "truth"] < values["minus", "reverse"]
    assert FFidelity().configure({"mode": "plus"}).higher_is_better
    assert not FFidelity().configure({"mode": "minus"}).higher_is_better


def test_a_sample_removes_at_most_beta_n_tokens_on_average():
    _, attribution, context = toy([0.1, 0.9, -0.3], pad=9)
    evaluator = FFidelity().configure({"alpha": "1", "beta": "0.2", "samples": "4000"})
    removed_RSBN = evaluator.draws(attribution, context)
    n = 3
    for r, ratio in enumerate(float(x) for x in FFID_RATIOS.split("/")):
        k = min(n, math.ceil(round(ratio * n, 9)))
        mean = removed_RSBN[r].sum(axis=-1).mean()
        bound = removal_probability(1.0, 0.2, n, k) * k
        assert bound <= 0.2 * n + 1e-12
        assert mean == pytest.approx(bound, abs=0.05)
        assert not removed_RSBN[r][..., [0, 4]].any()  # never [CLS] or [SEP]
        assert not removed_RSBN[r][..., 5:].any()  # nor padding


def test_the_draws_depend_on_the_example_not_its_batch(tiny_bert):
    """An example's random subsets are the same alone as in a batch (seeded by its id), and
    differ between examples."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    items = examples()
    evaluator = FFidelity().configure({"samples": "5", "ratios": "0.5/1", "alpha": "0.7"})

    def draws(chosen):
        trace = trace_batch(loaded, one_batch(loaded, chosen), frozenset())
        length = trace.batch.attention_mask_BN.sum(dim=1)
        row = torch.zeros(trace.batch.input_ids_BN.shape)
        order = trace.batch.examples  # batching may reorder the examples
        for b, item in enumerate(order):  # the same scores on an example's tokens in any batch
            row[b, : int(length[b])] = torch.arange(int(length[b])).float() * (-1) ** int(item.id)
        attribution = Attribution(aggregated_BLN=row[:, None])
        removed_RSBN = evaluator.draws(attribution, EvalContext(trace, None, 3))
        return {item.id: removed_RSBN[:, :, b, : int(length[b])] for b, item in enumerate(order)}

    together = draws(items)
    assert together["0"].any()
    for item in items[:2]:
        np.testing.assert_array_equal(draws([item])[item.id], together[item.id])
    assert not np.array_equal(together["0"][..., :4], together["1"][..., :4])


def test_without_a_scorer_it_warns_once_and_a_copy_scores_alike(tiny_bert, tmp_path, capsys):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), frozenset())
    generator = torch.Generator().manual_seed(0)
    attribution = Attribution(
        aggregated_BLN=torch.randn(trace.batch.input_ids_BN.shape, generator=generator)[:, None]
    )
    unscored = FFidelity().configure({"samples": "4", "ratios": "0.5/1"})
    context = EvalContext(trace, None, 0)
    first = _evaluate(unscored, attribution, context)
    _evaluate(unscored, attribution, context)
    assert capsys.readouterr().err.count("ffidelity: no scorer= given") == 1
    copy = tmp_path / "copy"
    shutil.copytree(tiny_bert, copy)
    scored = FFidelity().configure({"samples": "4", "ratios": "0.5/1", "scorer": str(copy)})
    np.testing.assert_array_equal(_evaluate(scored, attribution, context), first)
    assert "no scorer" not in capsys.readouterr().err
    assert scored.scored_by["weights_sha256"] == loaded.weights_sha256


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"alpha": "0"}, "ffidelity:alpha must be in (0, 1], got 0.0"),
        ({"beta": "1.5"}, "ffidelity:beta must be in (0, 1], got 1.5"),
        ({"samples": "0"}, "ffidelity:samples must be >= 1, got 0"),
        ({"ratios": "0/0.5"}, "ffidelity:ratios must be '/'-separated shares in (0, 1]"),
        ({"mode": "both"}, "bad value 'both' for ffidelity:mode"),
    ],
)
def test_bad_settings_are_one_line(params, message):
    with pytest.raises(UsageError) as raised:
        FFidelity().configure(params)
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith(message)
