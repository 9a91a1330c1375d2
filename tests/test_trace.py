"""The trace captures the right internals, through the architecture adapter, in one pass."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, examples, full_trace, one_batch

from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch


@pytest.fixture(scope="module")
def loaded_tiny(tiny_model):
    return load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)


def test_one_forward_pass_per_trace(loaded_tiny):
    calls = []
    handle = loaded_tiny.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        full_trace(loaded_tiny, examples())
    finally:
        handle.remove()
    assert len(calls) == 1


def test_only_requested_fields_are_captured(loaded_tiny):
    trace = trace_batch(loaded_tiny, one_batch(loaded_tiny, examples()), {"attentions"})
    assert len(trace.attentions) == 3
    assert trace.values == () and trace.pre_ln1 == () and trace.hidden_states == ()
    with pytest.raises(RuntimeError, match="requires"):
        trace.need("values")


def test_hooks_are_removed_after_tracing(loaded_tiny):
    def hook_count() -> int:
        return sum(
            len(m._forward_hooks) + len(m._forward_pre_hooks) for m in loaded_tiny.model.modules()
        )

    full_trace(loaded_tiny, examples())  # transformers may install its own hooks on first use
    before = hook_count()
    full_trace(loaded_tiny, examples())
    assert hook_count() == before


def test_values_are_layer_input_through_value_projection(loaded_tiny):
    trace = full_trace(loaded_tiny, examples())
    for layer in range(trace.num_layers):
        params = trace.adapter.layer_params(layer)
        x_BND = trace.hidden_states[layer]
        expected = torch.einsum("bnd,hde->bnhe", x_BND, params.value_weight_HDE)
        expected = expected + params.value_bias_HE
        torch.testing.assert_close(trace.values[layer], expected.flatten(2))


def test_pre_layernorm_vector_is_the_sum_of_head_contributions(loaded_tiny):
    """u1_i = x_i + b_O + sum_j sum_h alpha^h_ij (x_j W_V^h + b_V^h) W_O^h (spec notation)."""
    trace = full_trace(loaded_tiny, examples())
    mask = trace.mask_BN.bool()
    for layer in range(trace.num_layers):
        params = trace.adapter.layer_params(layer)
        x_BND = trace.hidden_states[layer]
        values_BNHE = trace.values[layer].unflatten(-1, (params.num_heads, params.head_dim))
        transformed_BHND = torch.einsum("bkhe,hed->bhkd", values_BNHE, params.output_weight_HED)
        mixed_BND = torch.einsum("bhnk,bhkd->bnd", trace.attentions[layer], transformed_BHND)
        u1 = x_BND + params.output_bias_D + mixed_BND
        torch.testing.assert_close(u1[mask], trace.pre_ln1[layer][mask], atol=1e-5, rtol=1e-5)
        ln2 = params.ln2
        output = torch.nn.functional.layer_norm(
            trace.pre_ln2[layer], (x_BND.shape[-1],), ln2.weight_D, ln2.bias_D, ln2.eps
        )
        torch.testing.assert_close(output[mask], trace.hidden_states[layer + 1][mask])


def test_padded_keys_get_no_attention(loaded_tiny):
    trace = full_trace(loaded_tiny, examples())
    pad = ~trace.mask_BN.bool()
    assert pad.any()
    for attention_BHNK in trace.attentions:
        to_padding_BHN = (attention_BHNK * pad[:, None, None, :]).sum(dim=-1)
        assert to_padding_BHN.abs().max() == 0
