"""Norm-based family and GlobEnc: exactness properties and a plain float64 golden reference."""

from __future__ import annotations

import pytest
import torch
from helpers import examples, full_trace

from attrib_bench.model.load import load_model
from attrib_bench.plugins import load_registry
from attrib_bench_plugins.norm import (
    GLOBENC_EIGHT,
    decompose,
    layer_inputs,
    layer_norms,
    norm_family,
)


@pytest.fixture(scope="module", params=["tiny", "minilm"])
def loaded(request, tiny_model, minilm):
    return load_model(str(tiny_model) if request.param == "tiny" else minilm, "cpu")


def test_decomposition_sums_back_to_the_layer(loaded):
    """sum_j r_ij + b_O = u1_i, and sum_j y_ij + g1_i(b_O) + beta1 = LN1(u1_i) (g1 is linear)."""
    trace = full_trace(loaded, examples())
    mask = trace.mask_BN.bool()
    for layer in range(trace.num_layers):
        params = trace.adapter.layer_params(layer)
        inputs = layer_inputs(trace, layer)
        vectors = decompose(inputs)
        u1 = trace.pre_ln1[layer]
        torch.testing.assert_close(
            (vectors["r"].sum(dim=2) + params.output_bias_D)[mask], u1[mask], rtol=1e-4, atol=1e-4
        )
        ln1 = torch.nn.functional.layer_norm(
            u1, u1.shape[-1:], params.ln1.weight_D, params.ln1.bias_D, params.ln1.eps
        )
        bias = params.output_bias_D
        g1_bias = params.ln1.weight_D * (bias - bias.mean()) * inputs.scale1_BN1
        assert bias.abs().max() > 0 or loaded.model.config.hidden_size == 32  # MiniLM has b_O
        torch.testing.assert_close(
            (vectors["y"].sum(dim=2) + g1_bias + params.ln1.bias_D)[mask],
            ln1[mask],
            rtol=1e-4,
            atol=1e-4,
        )


def test_gram_form_equals_norms_of_the_explicit_vectors(loaded):
    """The attributors' per-key Gram computation equals ||vector|| of the spec's vectors."""
    trace = full_trace(loaded, examples())
    keep = trace.mask_BN.bool()[:, :, None] & trace.mask_BN.bool()[:, None, :]
    for layer in range(trace.num_layers):
        vectors = decompose(layer_inputs(trace, layer))
        norms = layer_norms(trace, layer)
        for name, key in (("norm", "z"), ("norm-res", "r"), ("norm-resln", "y"), ("globenc", "e")):
            expected = vectors[key].norm(dim=-1)
            torch.testing.assert_close(norms[name][keep], expected[keep], rtol=1e-4, atol=1e-5)


def test_family_is_computed_once_per_batch(loaded, monkeypatch):
    calls = []
    import attrib_bench_plugins.norm as norm

    original = norm.layer_norms
    monkeypatch.setattr(norm, "layer_norms", lambda *a: calls.append(1) or original(*a))
    registry = load_registry()
    trace = full_trace(loaded, examples())
    for name in GLOBENC_EIGHT:
        registry.attributor(name).attribute(trace)
    assert len(calls) == trace.num_layers


def plain_reference(model, batch_inputs: dict, length: int) -> dict[str, list[torch.Tensor]]:
    """The spec, written with loops in float64 on one example, straight from the model modules."""
    model = model.double()
    inputs = {k: v[:1, :length] for k, v in batch_inputs.items()}
    captured = {}
    layers = model.base_model.encoder.layer
    hooks = []
    for index, layer in enumerate(layers):
        hooks.append(
            layer.attention.output.LayerNorm.register_forward_pre_hook(
                lambda _m, a, i=index: captured.__setitem__(("u1", i), a[0][0])
            )
        )
        hooks.append(
            layer.output.LayerNorm.register_forward_pre_hook(
                lambda _m, a, i=index: captured.__setitem__(("u2", i), a[0][0])
            )
        )
    with torch.no_grad():
        out = model(**inputs, output_attentions=True, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    heads = model.config.num_attention_heads
    result: dict[str, list[torch.Tensor]] = {
        k: [] for k in ("norm", "norm-res", "norm-resln", "globenc", "ratio")
    }
    for index, layer in enumerate(layers):
        x = out.hidden_states[index][0]
        alpha = out.attentions[index][0]
        wv, bv = layer.attention.self.value.weight, layer.attention.self.value.bias
        wo = layer.attention.output.dense.weight
        ln1, ln2 = layer.attention.output.LayerNorm, layer.output.LayerNorm
        d = x.shape[1]
        e = d // heads
        u1, u2 = captured[("u1", index)], captured[("u2", index)]
        s1 = torch.sqrt(u1.var(dim=-1, unbiased=False) + ln1.eps)
        s2 = torch.sqrt(u2.var(dim=-1, unbiased=False) + ln2.eps)
        mats = {k: torch.zeros(length, length, dtype=torch.float64) for k in result if k != "ratio"}
        ratio = torch.zeros(length, dtype=torch.float64)
        for i in range(length):
            ys = []
            for j in range(length):
                z = torch.zeros(d, dtype=torch.float64)
                for h in range(heads):
                    part = slice(h * e, (h + 1) * e)
                    f = (x[j] @ wv[part].T + bv[part]) @ wo[:, part].T
                    z = z + alpha[h, i, j] * f
                r = z + (x[i] if i == j else 0.0)
                y = ln1.weight * (r - r.mean()) / s1[i]
                enc = ln2.weight * (y - y.mean()) / s2[i]
                mats["norm"][i, j] = torch.linalg.norm(z)
                mats["norm-res"][i, j] = torch.linalg.norm(r)
                mats["norm-resln"][i, j] = torch.linalg.norm(y)
                mats["globenc"][i, j] = torch.linalg.norm(enc)
                ys.append(y)
            context = torch.linalg.norm(sum(ys) - ys[i])
            ratio[i] = context / (context + torch.linalg.norm(ys[i]))
        for key, value in mats.items():
            result[key].append(value)
        result["ratio"].append(ratio)
    model.float()
    return result


@pytest.mark.slow
def test_golden_against_plain_float64_loops(minilm):
    loaded = load_model(minilm, "cpu")
    items = examples()[:2]
    trace = full_trace(loaded, items)
    row = 0  # the first example of the batch: compare its real tokens
    length = trace.batch.lengths[row]
    reference = plain_reference(loaded.model, trace.batch.model_inputs(), length)
    for layer, ours in enumerate(norm_family(trace)):
        for key in ("norm", "norm-res", "norm-resln", "globenc"):
            torch.testing.assert_close(
                ours[key][row, :length, :length].double(),
                reference[key][layer],
                rtol=1e-5,
                atol=1e-6,
            )
        torch.testing.assert_close(
            ours["mixing_ratio"][row, :length].double(),
            reference["ratio"][layer],
            rtol=1e-5,
            atol=1e-6,
        )
