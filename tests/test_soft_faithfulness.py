"""Soft comprehensiveness and sufficiency: against an explicit loop with the same seeded masks,
reproducibility, min-max invariance, and the conformance kit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, full_trace

from attrib_bench import Attribution, EvalContext
from attrib_bench.model.load import load_model
from attrib_bench.testing import check_evaluator
from attrib_bench_plugins.gradient import Saliency
from attrib_bench_plugins.soft_faithfulness import (
    SoftComprehensiveness,
    SoftSufficiency,
    soft_masks,
)


def seeded_attribution(trace, seed: int) -> Attribution:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(trace.batch.input_ids_BN.shape, generator=generator, dtype=torch.float64)
    return Attribution(aggregated_BLN=(scores * trace.batch.attention_mask_BN)[:, None].float())


def p_target(loaded, ids, keep_ND, y=None):
    """p(y) in float64 for one unpadded example whose embedding output is multiplied by keep."""
    handle = loaded.embeddings.register_forward_hook(
        lambda _m, _a, out: out * keep_ND.to(out.dtype)[None]
    )
    try:
        with torch.no_grad():
            probs = loaded.model(input_ids=ids[None]).logits[0].double().softmax(-1)
    finally:
        handle.remove()
    return probs, int(probs.argmax()) if y is None else y


def reference(loaded, trace, attribution, metric: str, normalise: bool, samples: int, seed: int):
    """The definition, one example and one mask at a time, in Python floats."""
    batch, out = trace.batch, []
    width = loaded.model.config.hidden_size
    for b, example in enumerate(batch.examples):
        n = batch.lengths[b]
        ids = batch.input_ids_BN[b, :n]
        cand = [not s for s in batch.special_tokens_mask_BN[b, :n].bool().tolist()]
        s = [float(attribution.aggregated_BLN[b, -1, j]) for j in range(n)]
        chosen = [s[j] for j in range(n) if cand[j]]
        if len(chosen) == 0 or max(chosen) == min(chosen):
            out.append(float("nan"))
            continue
        lo, hi = min(chosen), max(chosen)
        q = [(s[j] - lo) / (hi - lo) if cand[j] else 0.0 for j in range(n)]
        keep = [
            (1.0 - q[j] if metric == "soft-comprehensiveness" else q[j]) if cand[j] else 1.0
            for j in range(n)
        ]
        full, y = p_target(loaded, ids, torch.ones(n, width))
        fx = float(full[y])
        null = torch.tensor([[0.0 if cand[j] else 1.0] * width for j in range(n)])
        f0 = float(p_target(loaded, ids, null, y)[0][y])
        masks = soft_masks(np.array(keep), samples, width, seed, example.id, metric)
        values = []
        for k in range(samples):
            fs = float(p_target(loaded, ids, masks[k].double(), y)[0][y])
            if not normalise:
                values.append(fx - fs)
                continue
            drop0 = max(0.0, fx - f0)
            if drop0 == 0:
                values.append(float("nan"))
            elif metric == "soft-comprehensiveness":
                values.append(min(1.0, max(0.0, max(0.0, fx - fs) / drop0)))
            else:
                soft_s, s0 = 1.0 - max(0.0, fx - fs), 1.0 - drop0
                values.append(min(1.0, max(0.0, (soft_s - s0) / drop0)))
        out.append(sum(values) / samples)
    return np.array(out)


@pytest.mark.parametrize("cls", [SoftComprehensiveness, SoftSufficiency])
@pytest.mark.parametrize("normalise", [True, False])
def test_matches_a_per_example_loop_with_the_same_masks(tiny_bert, cls, normalise):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, examples())
    attribution = seeded_attribution(trace, 0)
    evaluator = cls().configure({"normalise": str(normalise).lower(), "samples": "3"})
    got = evaluator.score(attribution, EvalContext(trace, None, 7))["aggregated"][0]
    expected = reference(loaded, trace, attribution, cls.name, normalise, 3, 7)
    # Normalised scores divide float32 noise (padded batch vs example alone, ~1e-7) by
    # f(x) - f(0), which a tiny random model makes small: compare those relatively.
    np.testing.assert_allclose(got, expected, **({"rtol": 1e-3} if normalise else {"atol": 1e-6}))
    assert np.isfinite(got).sum() >= (2 if normalise else 4)  # the null input often raises p


@pytest.mark.parametrize("cls", [SoftComprehensiveness, SoftSufficiency])
def test_reproducible_from_the_seed_and_invariant_to_min_max(tiny_bert, cls):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, examples())
    attribution = seeded_attribution(trace, 0)
    evaluator = cls().configure({"normalise": "false"})
    first = evaluator.score(attribution, EvalContext(trace, None, 0))["aggregated"]
    again = evaluator.score(attribution, EvalContext(full_trace(loaded, examples()), None, 0))
    np.testing.assert_array_equal(first, again["aggregated"])
    other = evaluator.score(attribution, EvalContext(trace, None, 1))["aggregated"]
    assert not np.allclose(np.nan_to_num(first), np.nan_to_num(other))
    mask = trace.batch.attention_mask_BN[:, None]
    affine = Attribution(aggregated_BLN=(attribution.aggregated_BLN * 3.0 + 2.0) * mask)
    scaled = evaluator.score(affine, EvalContext(trace, None, 0))["aggregated"]
    np.testing.assert_allclose(scaled, first, atol=1e-6)


def test_masks_keep_with_the_given_probability():
    masks = soft_masks(np.array([0.0, 0.25, 1.0]), 4, 2000, 0, "x", "m")
    rates = masks.double().mean(dim=(0, 2))
    assert rates[0] == 0 and rates[2] == 1
    assert abs(float(rates[1]) - 0.25) < 0.02


@pytest.mark.parametrize("cls", [SoftComprehensiveness, SoftSufficiency])
def test_conformance_with_the_kit_default(cls):
    check_evaluator(cls())


@pytest.mark.parametrize("cls", [SoftComprehensiveness, SoftSufficiency])
def test_conformance_with_saliency(cls):
    # Saliency's float32 gradients differ by ~1e-7 between a batch and an example alone; the
    # Bernoulli threshold u < q turns such a change into a flipped mask element now and then,
    # so the score is batch-independent only up to the attributor's own noise.
    check_evaluator(cls(), attributor=Saliency(), batch_independent=False)
