"""Passes that read no attention probabilities run under sdpa; the traced pass that records
them stays eager (attrib_bench.core.attention_kernels)."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, DECODER_TEXTS, examples, one_batch, save_tiny_decoder

from attrib_bench.core import attention_kernels
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.gradient import IntegratedGradients, Saliency
from attrib_bench_plugins.loo import LooTau
from attrib_bench_plugins.perturbation import Occlusion

#: sdpa against eager in float64: one fused kernel against softmax(QK^T / sqrt(d)) V step by
#: step differ in the last bits only (measured: under 1e-15 relative on these models).
FLOAT64 = {"rtol": 1e-10, "atol": 1e-12}


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return save_tiny_decoder(tmp_path_factory.mktemp("kernels-gpt2"), "gpt2")


def _loaded(path, float64: bool = False):
    loaded = load_model(str(path), "cpu", architectures=ARCHITECTURES)
    if float64:
        loaded.model.double()
    texts = DECODER_TEXTS if loaded.is_language_model else examples()
    items = examples(texts) if loaded.is_language_model else texts
    return loaded, one_batch(loaded, items)


def _seen(loaded) -> list[str]:
    """The attention implementation of every forward pass of ``loaded.model`` from now on."""
    seen: list[str] = []
    loaded.model.register_forward_pre_hook(
        lambda model, _args: seen.append(model.config._attn_implementation)
    )
    return seen


def test_gradient_ig_occlusion_and_erasures_run_under_sdpa_and_eager_is_restored(tiny_bert):
    loaded, batch = _loaded(tiny_bert)
    seen = _seen(loaded)
    trace = trace_batch(loaded, batch, Saliency.requires)
    Saliency().attribute(trace)  # backpropagates through the trace's own pass
    assert seen == ["sdpa"]
    IntegratedGradients().configure({"steps": "3"}).attribute(trace)
    Occlusion().attribute(trace)
    attribution = Saliency().attribute(trace)
    from attrib_bench import EvalContext

    LooTau().score(attribution, EvalContext(trace, None, 0, Saliency()))
    assert len(seen) > 10 and set(seen) == {"sdpa"}
    assert loaded.model.config._attn_implementation == "eager"


def test_the_attention_trace_gets_probabilities_even_inside_a_fast_block(tiny_bert):
    loaded, batch = _loaded(tiny_bert)
    seen = _seen(loaded)
    with loaded.fast_attention() as implementation:
        assert implementation == "sdpa"
        trace = trace_batch(loaded, batch, {"attentions", "embedding_graph"})
        assert loaded.model.config._attn_implementation == "sdpa"  # restored after the trace
    assert seen == ["eager"]
    assert len(trace.attentions) == loaded.model.config.num_hidden_layers
    real = batch.attention_mask_BN.bool()
    for probabilities in trace.attentions:
        sums = probabilities.sum(dim=-1).transpose(1, 2)[real]  # (real tokens, heads)
        torch.testing.assert_close(sums, torch.ones_like(sums))
    assert loaded.model.config._attn_implementation == "eager"


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_sdpa_and_eager_give_the_same_gradients_and_ig_in_float64(
    family, tiny_bert, tiny_gpt2, monkeypatch
):
    loaded, batch = _loaded(tiny_bert if family == "bert" else tiny_gpt2, float64=True)
    methods = [Saliency(), IntegratedGradients().configure({"steps": "5", "chunk_tokens": "16"})]

    def scores() -> list[torch.Tensor]:
        trace = trace_batch(loaded, batch, Saliency.requires)
        return [method.attribute(trace).aggregated_BLN for method in methods]

    seen = _seen(loaded)
    fast = scores()
    assert set(seen) == {"sdpa"}
    monkeypatch.setattr(attention_kernels, "_can_switch", lambda _model: False)
    seen.clear()
    eager = scores()
    assert set(seen) == {"eager"}
    for ours, reference in zip(fast, eager, strict=True):
        assert ours.abs().sum() > 0
        torch.testing.assert_close(ours, reference, **FLOAT64)


def test_a_class_without_sdpa_stays_eager(tiny_bert, monkeypatch):
    loaded, batch = _loaded(tiny_bert)
    # transformers refuses sdpa for a class that does not declare it
    monkeypatch.setattr(type(loaded.model), "_supports_sdpa", False)
    seen = _seen(loaded)
    with loaded.fast_attention() as implementation:
        assert implementation == "eager"
    trace = trace_batch(loaded, batch, Saliency.requires)
    IntegratedGradients().configure({"steps": "2"}).attribute(trace)
    assert set(seen) == {"eager"}
