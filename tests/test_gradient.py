"""Gradient methods: our saliency equals a direct Captum computation and plain autograd."""

from __future__ import annotations

import pytest
import torch
from captum.attr import InputXGradient, IntegratedGradients
from helpers import examples, one_batch

from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.gradient import Gradient, Saliency
from attrib_bench_plugins.gradient import IntegratedGradients as OurIG


@pytest.fixture(scope="module")
def setup(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu")
    batch = one_batch(loaded, examples())
    return loaded, trace_batch(loaded, batch, set())


def from_embedding_output(loaded, batch):
    """f(E): the classifier's logits with the embedding module's output replaced by E."""
    embeddings = loaded.model.base_model.embeddings

    def forward(embedding_output):
        # Captum's IG stacks the path steps along the batch: tile the other inputs to match.
        repeats = embedding_output.shape[0] // batch.input_ids_BN.shape[0]
        inputs = {k: v.repeat(repeats, 1) for k, v in batch.model_inputs().items()}
        handle = embeddings.register_forward_hook(lambda *_: embedding_output)
        try:
            return loaded.model(**inputs).logits
        finally:
            handle.remove()

    with torch.no_grad():
        start = embeddings(input_ids=batch.input_ids_BN, token_type_ids=batch.token_type_ids_BN)
    return forward, start


def test_saliency_equals_captum_input_x_gradient(setup):
    loaded, trace = setup
    forward, start = from_embedding_output(loaded, trace.batch)
    target = trace.predicted_B
    direct = InputXGradient(forward).attribute(start, target=target).norm(dim=-1)
    ours = Saliency().attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours[mask], direct[mask], rtol=1e-5, atol=1e-7)
    assert ours[~mask].abs().max() == 0


def test_gradient_equals_autograd(setup):
    loaded, trace = setup
    forward, start = from_embedding_output(loaded, trace.batch)
    start = start.clone().requires_grad_(True)
    logits = forward(start)
    logits.gather(1, trace.predicted_B[:, None]).sum().backward()
    expected = start.grad.norm(dim=-1)
    ours = Gradient().attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours[mask], expected[mask], rtol=1e-5, atol=1e-7)
    # the two methods must differ: gradient is not gradient x input
    assert not torch.allclose(ours, Saliency().attribute(trace).aggregated_BLN[:, 0])


def test_gold_target_and_signed_sum(setup):
    loaded, trace = setup
    forward, start = from_embedding_output(loaded, trace.batch)
    gold = trace.batch.labels
    direct = InputXGradient(forward).attribute(start, target=gold).sum(dim=-1)
    ours = Saliency().configure({"target": "gold", "reduce": "sum"}).attribute(trace)
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours.aggregated_BLN[:, 0][mask], direct[mask], rtol=1e-5, atol=1e-7)


def pad_baseline(loaded, batch) -> torch.Tensor:
    """The [PAD] baseline's token ids: special tokens kept, every other token [PAD]."""
    pad = loaded.tokenizer.pad_token_id
    return torch.where(
        batch.special_tokens_mask_BN.bool(),
        batch.input_ids_BN,
        torch.full_like(batch.input_ids_BN, pad),
    )


def test_integrated_gradients_equals_captum_on_embedding_output(tiny_model):
    loaded = load_model(str(tiny_model), "cpu")
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    forward, start = from_embedding_output(loaded, trace.batch)
    batch = trace.batch
    with torch.no_grad():  # the baseline's tokens stay at the real input's positions
        baseline = loaded.model.base_model.embeddings(
            input_ids=pad_baseline(loaded, batch),
            token_type_ids=batch.token_type_ids_BN,
            position_ids=loaded.adapter.position_ids(batch.input_ids_BN),
        )
    direct, delta = IntegratedGradients(forward).attribute(
        start,
        baselines=baseline,
        target=trace.predicted_B,
        n_steps=8,
        return_convergence_delta=True,
    )
    ours = OurIG().configure({"steps": "8"}).attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours[mask], direct.norm(dim=-1)[mask], rtol=1e-4, atol=1e-6)
    assert delta.abs().max() < 0.05  # completeness holds approximately at 8 steps


def test_integrated_gradients_baseline_keeps_the_kept_tokens_embeddings(tiny_model):
    """RoBERTa numbers positions over non-pad tokens: the baseline's [PAD]s must not move the
    final special token, so every token the baseline keeps is embedded as in the input."""
    loaded = load_model(str(tiny_model), "cpu")
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    batch = trace.batch
    baseline_ids = pad_baseline(loaded, batch)
    embedded = {}
    handle = loaded.adapter.embeddings.register_forward_hook(
        lambda _module, _args, kwargs, output: embedded.setdefault(
            tuple(kwargs["input_ids"].flatten().tolist()), output.detach()
        ),
        with_kwargs=True,
    )
    try:
        OurIG().configure({"steps": "2"}).attribute(trace)
    finally:
        handle.remove()
    original = embedded[tuple(batch.input_ids_BN.flatten().tolist())]
    baseline = embedded[tuple(baseline_ids.flatten().tolist())]
    kept = baseline_ids == batch.input_ids_BN  # special tokens and padding
    torch.testing.assert_close(baseline[kept], original[kept])
