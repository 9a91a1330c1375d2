"""Perturbation methods through Captum: occlusion equals an explicit float64 loop, Shapley
value sampling converges to exact Shapley values, KernelSHAP and LIME are seeded and find the
one token that matters. The conformance kit (batch independence, determinism, every target)
checks all four in tests/test_conformance.py, at the sample counts of its FEWER_SAMPLES."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.perturbation import KernelShap, Lime, Occlusion, ShapleyValueSampling


def float64_trace(path, texts=None):
    loaded = load_model(str(path), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    items = examples() if texts is None else examples(texts)
    return loaded, trace_batch(loaded, one_batch(loaded, items), set())


def score(loaded, trace, row, ids_N) -> float:
    """The predicted class's logit of example ``row`` with its token ids replaced by ``ids_N``."""
    batch = trace.batch
    inputs = {k: v[row : row + 1] for k, v in batch.model_inputs().items()}
    inputs["input_ids"] = ids_N[None]
    inputs["position_ids"] = loaded.position_ids(batch.input_ids_BN)[row : row + 1]  # unmoved
    with torch.no_grad():
        return float(loaded.model(**inputs).logits[0, trace.predicted_B[row]])


def content_positions(trace, row) -> list[int]:
    batch = trace.batch
    real = batch.attention_mask_BN[row].bool() & ~batch.special_tokens_mask_BN[row].bool()
    return [j for j in range(real.shape[0]) if real[j]]


def test_occlusion_equals_explicit_loop(tiny_bert):
    loaded, trace = float64_trace(tiny_bert)
    ours = Occlusion().configure({"chunk_tokens": "30"}).attribute(trace)
    mask_id = loaded.tokenizer.mask_token_id
    for row in range(trace.batch.input_ids_BN.shape[0]):
        ids = trace.batch.input_ids_BN[row]
        full = score(loaded, trace, row, ids)
        content = content_positions(trace, row)
        for j in range(ids.shape[0]):
            if j in content:
                occluded = ids.clone()
                occluded[j] = mask_id
                expected = full - score(loaded, trace, row, occluded)
            else:
                expected = 0.0  # special tokens and padding are no features
            assert math.isclose(ours.aggregated_BLN[row, 0, j], expected, abs_tol=1e-10)


def test_pad_baseline_and_batching_do_not_change_occlusion(tiny_roberta):
    loaded, trace = float64_trace(tiny_roberta)
    one = Occlusion().configure({"baseline": "pad", "chunk_tokens": "1"})
    many = Occlusion().configure({"baseline": "pad", "chunk_tokens": "8192"})
    torch.testing.assert_close(
        one.attribute(trace).aggregated_BLN, many.attribute(trace).aggregated_BLN
    )
    row = 0
    ids = trace.batch.input_ids_BN[row]
    j = content_positions(trace, row)[0]
    occluded = ids.clone()
    occluded[j] = loaded.tokenizer.pad_token_id
    expected = score(loaded, trace, row, ids) - score(loaded, trace, row, occluded)
    assert math.isclose(many.attribute(trace).aggregated_BLN[row, 0, j], expected, abs_tol=1e-10)


def exact_shapley(loaded, trace, row) -> dict[int, float]:
    """Shapley values by enumeration of every coalition of the content tokens."""
    ids = trace.batch.input_ids_BN[row]
    players = content_positions(trace, row)
    n, mask_id = len(players), loaded.tokenizer.mask_token_id

    def value(coalition) -> float:
        kept = ids.clone()
        for p in players:
            if p not in coalition:
                kept[p] = mask_id
        return score(loaded, trace, row, kept)

    out = {}
    for i in players:
        others = [p for p in players if p != i]
        total = 0.0
        for size in range(n):
            weight = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            for coalition in itertools.combinations(others, size):
                total += weight * (value({*coalition, i}) - value(set(coalition)))
        out[i] = total
    return out


def test_shapley_value_sampling_converges_to_exact_values(tiny_bert):
    loaded, trace = float64_trace(tiny_bert, ["bad film today"])  # three content tokens
    assert len(content_positions(trace, 0)) == 3
    exact = exact_shapley(loaded, trace, 0)
    ours = ShapleyValueSampling().configure({"samples": "200"}).attribute(trace).aggregated_BLN
    scale = max(abs(v) for v in exact.values())
    for j, expected in exact.items():
        # 3 tokens have 6 orderings: 200 draws estimate each within a few percent
        assert abs(ours[0, 0, j] - expected) < 0.1 * scale
    assert ours.sum() == pytest.approx(sum(exact.values()), rel=1e-6)  # efficiency, exact


class OneTokenMatters(torch.nn.Module):
    """Wraps a classifier so that class 0's logit is 5 when token ``token`` is present."""

    def __init__(self, model, token: int) -> None:
        super().__init__()
        self.model, self.token = model, token
        self.config = model.config

    def forward(self, input_ids, **kwargs):
        out = self.model(input_ids=input_ids, **kwargs)
        out.logits = out.logits * 0 + 5.0 * (input_ids == self.token).any(1, keepdim=True)
        return out


@pytest.mark.parametrize("method", [KernelShap(), Lime()], ids=["kernel-shap", "lime"])
def test_kernel_shap_and_lime_are_seeded_batch_independent_and_sane(tiny_bert, method):
    loaded, trace = float64_trace(tiny_bert)
    method = method.configure({"samples": "60"})
    first = method.attribute(trace).aggregated_BLN
    torch.testing.assert_close(first, method.attribute(trace).aggregated_BLN, rtol=0, atol=0)
    alone = trace_batch(loaded, one_batch(loaded, examples()[3:4]), set())
    n, row = int(alone.mask_BN.sum()), [e.id for e in trace.batch.examples].index("3")
    torch.testing.assert_close(method.attribute(alone).aggregated_BLN[0, 0, :n], first[row, 0, :n])
    other = method.configure({"seed": "1"}).attribute(trace).aggregated_BLN
    assert not torch.allclose(first, other)

    good = loaded.tokenizer.convert_tokens_to_ids("good")
    loaded.model = OneTokenMatters(loaded.model, good)
    trace = trace_batch(loaded, one_batch(loaded, examples()[:1]), set())  # "... not good ."
    scores = method.configure({"target": "predicted"}).attribute(trace).aggregated_BLN[0, 0]
    assert trace.batch.input_ids_BN[0, int(scores.argmax())] == good


@pytest.mark.parametrize("method", [Occlusion, Lime])
def test_perturbed_inputs_run_in_passes_within_the_token_budget(tiny_bert, method):
    """Passes of ``chunk_tokens`` tokens at most, whatever the example's length: a long input
    gets fewer perturbed inputs per pass."""
    loaded, trace = float64_trace(tiny_bert)
    shapes = []
    loaded.model.register_forward_pre_hook(
        lambda _m, _args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    budget = 40
    params = {"chunk_tokens": str(budget), **({"samples": "20"} if method is Lime else {})}
    method().configure(params).attribute(trace)
    lengths = {int(n) for n in trace.batch.attention_mask_BN.sum(dim=1)}
    assert {n for _, n in shapes} == lengths
    assert all(rows * n <= budget or rows == 1 for rows, n in shapes)
    assert any(rows > 1 for rows, _ in shapes)
