"""Norm-based family and GlobEnc: exactness properties and a plain float64 golden reference."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, examples, full_trace

from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.toolkit.norm_decomposition import (
    decompose,
    layer_inputs,
    layer_norms,
    norm_family,
)
from attrib_bench_plugins.norm import GLOBENC_EIGHT


@pytest.fixture(scope="module", params=["tiny", "minilm"])
def loaded(request, tiny_model, minilm):
    return load_model(
        str(tiny_model) if request.param == "tiny" else minilm, "cpu", architectures=ARCHITECTURES
    )


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
    import attrib_bench.toolkit.norm_decomposition as norm

    original = norm.layer_norms
    monkeypatch.setattr(norm, "layer_norms", lambda *a: calls.append(1) or original(*a))
    registry = load_registry()
    trace = full_trace(loaded, examples())
    for name in GLOBENC_EIGHT:
        registry.attributor(name).attribute(trace)
    assert len(calls) == trace.num_layers


def plain_reference(model, solo_inputs: list[dict]) -> list[dict[str, list[torch.Tensor]]]:
    """The spec, written with loops in float64 on unpadded examples, from the model modules.

    Per example and layer: the full matrices M^l of the norm variants (N, N-Res, N-ResLN, N-Enc),
    W-Res's mixing ratio, and every method of GLOBENC_EIGHT's M^l by its attrib-bench name.
    """
    model = model.double()
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
    results = []
    try:
        for inputs in solo_inputs:
            with torch.no_grad():
                out = model(**inputs, output_attentions=True, output_hidden_states=True)
            results.append(_reference_matrices(model, out, captured))
    finally:
        for hook in hooks:
            hook.remove()
        model.float()
    return results


def _reference_matrices(model, out, captured: dict) -> dict[str, list[torch.Tensor]]:
    heads = model.config.num_attention_heads
    result: dict[str, list[torch.Tensor]] = {k: [] for k in ("ratio", *GLOBENC_EIGHT)}
    for index, layer in enumerate(model.base_model.encoder.layer):
        x = out.hidden_states[index][0]
        alpha = out.attentions[index][0]
        length, d = x.shape
        wv, bv = layer.attention.self.value.weight, layer.attention.self.value.bias
        wo = layer.attention.output.dense.weight
        ln1, ln2 = layer.attention.output.LayerNorm, layer.output.LayerNorm
        e = d // heads
        u1, u2 = captured[("u1", index)], captured[("u2", index)]
        s1 = torch.sqrt(u1.var(dim=-1, unbiased=False) + ln1.eps)
        s2 = torch.sqrt(u2.var(dim=-1, unbiased=False) + ln2.eps)
        f = [
            [
                (x[j] @ wv[h * e : (h + 1) * e].T + bv[h * e : (h + 1) * e])
                @ wo[:, h * e : (h + 1) * e].T
                for j in range(length)
            ]
            for h in range(heads)
        ]
        mats = {
            k: torch.zeros(length, length, dtype=torch.float64)
            for k in ("norm", "norm-res", "norm-resln", "globenc", "attention")
        }
        ratio = torch.zeros(length, dtype=torch.float64)
        for i in range(length):
            ys = []
            for j in range(length):
                z = torch.zeros(d, dtype=torch.float64)
                for h in range(heads):
                    z = z + alpha[h, i, j] * f[h][j]
                    mats["attention"][i, j] += alpha[h, i, j] / heads
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
        eye = torch.eye(length, dtype=torch.float64)
        w, n = mats["attention"], mats["norm"]
        mats["rollout"] = 0.5 * w + 0.5 * eye
        mats["norm-fixedres"] = 0.5 * n / n.sum(dim=1, keepdim=True) + 0.5 * eye
        off_diagonal = w * (1 - eye)
        context_w = off_diagonal / off_diagonal.sum(dim=1, keepdim=True)
        mats["attention-res"] = ratio[:, None] * context_w + (1 - ratio[:, None]) * eye
        for key, value in mats.items():
            result[key].append(value)
        result["ratio"].append(ratio)
    return result


def rolled_out(matrices: list[torch.Tensor]) -> list[torch.Tensor]:
    """R^1 = M^1, R^l = M^l @ R^(l-1): the spec's rollout, one product per layer."""
    products = [matrices[0]]
    for matrix in matrices[1:]:
        products.append(matrix @ products[-1])
    return products


@pytest.mark.slow
def test_golden_against_plain_float64_loops(minilm):
    """Every layer matrix, the local and rolled-out [CLS] rows of all eight methods, per example
    of a padded batch against its solo float64 computation; padded positions hold zeros."""
    loaded = load_model(minilm, "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, examples()[:3])
    assert len(set(trace.batch.lengths)) == 3  # two of the three are padded
    registry = load_registry()
    attributions = {name: registry.attributor(name).attribute(trace) for name in GLOBENC_EIGHT}
    inputs = trace.batch.model_inputs()
    lengths = trace.batch.lengths
    solo = [{k: v[row : row + 1, :n] for k, v in inputs.items()} for row, n in enumerate(lengths)]
    references = plain_reference(loaded.model, solo)
    for row, (length, reference) in enumerate(zip(lengths, references, strict=True)):
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
        for name, attribution in attributions.items():
            local = torch.stack([m[0] for m in reference[name]])
            aggregated = torch.stack([m[0] for m in rolled_out(reference[name])])
            for rows, expected in (
                (attribution.local_BLN, local),
                (attribution.aggregated_BLN, aggregated),
            ):
                torch.testing.assert_close(
                    rows[row, :, :length].double(),
                    expected,
                    rtol=1e-5,
                    atol=1e-6,
                    msg=lambda message, name=name: f"{name}: {message}",
                )
                assert rows[row, :, length:].abs().sum() == 0, name
