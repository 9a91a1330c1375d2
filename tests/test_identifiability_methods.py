"""Effective attention and hidden-token attribution: the properties the spec asks for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, SENTENCES, examples, full_trace

from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.toolkit.norm_decomposition import layer_inputs
from attrib_bench.toolkit.token_contributions import contributions
from attrib_bench_plugins.effective import column_space_projector, effective_attention

LONG = " ".join(["a long sentence that needs more tokens than one head has dimensions"] * 3)


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)


def test_effective_attention_keeps_what_reaches_the_output(tiny):
    """A_eff_h T_h = A_h T_h for every head; the part removed lies in T_h's left null space."""
    trace = full_trace(tiny, examples([LONG, "short one", *SENTENCES[:2]]))
    for layer in range(trace.num_layers):
        effective_BHNK = effective_attention(trace, layer).double()
        transformed_BHKD = layer_inputs(trace, layer).transformed_BHKD.double()
        for row, n in enumerate(trace.batch.lengths):
            a = trace.attentions[layer][row, :, :n, :n].double()
            t = transformed_BHKD[row, :, :n]
            torch.testing.assert_close(effective_BHNK[row, :, :n, :n] @ t, a @ t)
            assert effective_BHNK[row, :, n:].abs().max() == 0 if n < effective_BHNK.shape[2] else 1


def test_effective_attention_equals_attention_for_short_inputs(tiny):
    """n <= head dim (8 for the tiny models) and full rank: nothing to remove."""
    trace = full_trace(tiny, examples(["good", "not bad at all"]))
    assert max(trace.batch.lengths) <= 8
    for layer in range(trace.num_layers):
        effective = effective_attention(trace, layer)
        for row, n in enumerate(trace.batch.lengths):
            torch.testing.assert_close(
                effective[row, :, :n, :n], trace.attentions[layer][row, :, :n, :n]
            )


def test_effective_attention_differs_for_long_inputs(tiny):
    trace = full_trace(tiny, examples([LONG]))
    n = trace.batch.lengths[0]
    assert n > 8
    for layer in range(trace.num_layers):
        difference = effective_attention(trace, layer) - trace.attentions[layer]
        assert difference.norm() / trace.attentions[layer].norm() > 0.1


FLOAT32_EPS = float(np.finfo(np.float32).eps)


def effective_reference(model, inputs: dict, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec in float64 on one unpadded example, from the model's modules: (L, n) local rows
    of (1 - r) A_eff + r I and the rows of their rollout, an explicit loop of matrix products.

    The rank rule is numpy's matrix_rank on each n x d matrix T_h with float32's eps, the dtype
    the attributor's values are computed in.
    """
    model.double()
    try:
        with torch.no_grad():
            out = model(**inputs, output_attentions=True, output_hidden_states=True)
        weights = [
            (
                layer.attention.self.value.weight.detach().clone(),
                layer.attention.self.value.bias.detach().clone(),
                layer.attention.output.dense.weight.detach().clone(),
            )
            for layer in model.base_model.encoder.layer
        ]
    finally:
        model.float()
    heads = model.config.num_attention_heads
    local, aggregated = [], []
    product = None
    for index, (wv, bv, wo) in enumerate(weights):
        x = out.hidden_states[index][0]
        n, d = x.shape
        e = d // heads
        mean = np.zeros((n, n))
        for h in range(heads):
            part = slice(h * e, (h + 1) * e)
            t = ((x @ wv[part].T + bv[part]) @ wo[:, part].T).numpy()
            u, singular, _ = np.linalg.svd(t)
            rank = np.linalg.matrix_rank(t, tol=singular.max() * max(n, d) * FLOAT32_EPS)
            mean += out.attentions[index][0, h].numpy() @ u[:, :rank] @ u[:, :rank].T / heads
        matrix = (1 - ratio) * mean + ratio * np.eye(n)
        product = matrix if product is None else matrix @ product
        local.append(matrix[0])
        aggregated.append(product[0])
    return torch.tensor(np.array(local)), torch.tensor(np.array(aggregated))


@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.9])
def test_effective_attention_rows_match_float64_loops(tiny, ratio):
    """Local and rolled-out rows of (1 - r) A_eff + r I, rows not renormalised; padding is zero
    and a padded example's rows equal its solo computation."""
    trace = full_trace(tiny, examples([LONG, SENTENCES[1], "short one"]))
    result = load_registry().attributor(f"effective-attention:residual={ratio}").attribute(trace)
    inputs = trace.batch.model_inputs()
    for row, n in enumerate(trace.batch.lengths):
        solo = {key: value[row : row + 1, :n] for key, value in inputs.items()}
        local, aggregated = effective_reference(tiny.model, solo, ratio)
        torch.testing.assert_close(result.local_BLN[row, :, :n].double(), local, atol=2e-6, rtol=0)
        torch.testing.assert_close(
            result.aggregated_BLN[row, :, :n].double(), aggregated, atol=2e-6, rtol=0
        )
        assert result.local_BLN[row, :, n:].abs().sum() == 0
        assert result.aggregated_BLN[row, :, n:].abs().sum() == 0


@pytest.mark.parametrize("n", [6, 40])
def test_rank_tolerance_is_the_spec_rule(n):
    """Singular values above sigma_max * max(n, d) * eps are kept, below are dropped; d is the
    width passed (T_h's), not the width of the matrix decomposed (d_v)."""
    generator = torch.Generator().manual_seed(0)
    width, columns = 32, 4
    tolerance = max(n, width) * FLOAT32_EPS
    u = torch.linalg.qr(torch.randn(n, columns, generator=generator, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(columns, columns, generator=generator, dtype=torch.float64)).Q
    sigma_max = 2.0  # the threshold is relative to the largest singular value
    singular = sigma_max * torch.tensor(
        [1.0, 0.5, 3 * tolerance, tolerance / 3], dtype=torch.float64
    )
    matrix = u @ torch.diag(singular) @ v.T
    projector = column_space_projector(matrix[None], width, FLOAT32_EPS)[0]
    torch.testing.assert_close(projector, u[:, :3] @ u[:, :3].T)
    # the same matrix with its own width (4) and float64's eps keeps all four directions
    full = column_space_projector(matrix[None], columns, float(np.finfo(np.float64).eps))[0]
    torch.testing.assert_close(full, u @ u.T)


def test_effective_attention_detects_a_float32_rank_deficiency(tiny):
    """Value vectors of rank 3 stored in float32, with one singular value of T_h between the
    spec's threshold (max(n, d) * eps32) and the one with d_v as the width: A_eff keeps exactly
    the 3 directions the spec's rule keeps on the explicit T_h = V_h W_O^h."""
    trace = full_trace(tiny, examples([SENTENCES[1]]))
    n = trace.batch.lengths[0]
    params = trace.adapter.layer_params(0)
    heads, e, d = params.output_weight_HED.shape
    assert n > e
    generator = torch.Generator().manual_seed(0)
    values = trace.values[0].clone()
    middle = (max(n, e) * max(n, d)) ** 0.5 * FLOAT32_EPS  # between the two thresholds
    for h in range(heads):
        w = params.output_weight_HED[h].double()  # W_O^h, e x d
        eigenvalues, eigenvectors = torch.linalg.eigh(w @ w.T)
        # (W W^T)^(-1/2) W has orthonormal rows, so T_h = U diag(s) (W W^T)^(-1/2) W has s
        whitening = eigenvectors @ torch.diag(eigenvalues.rsqrt()) @ eigenvectors.T
        u = torch.linalg.qr(torch.randn(n, e, generator=generator, dtype=torch.float64)).Q
        singular = torch.tensor([1.0, 0.7, 0.4, middle] + [0.0] * (e - 4), dtype=torch.float64)
        values[0, :n, h * e : (h + 1) * e] = (u @ torch.diag(singular) @ whitening).float()
    trace.values = (values, *trace.values[1:])
    effective = effective_attention(trace, 0)
    for h in range(heads):
        t = values[0, :n, h * e : (h + 1) * e].double() @ params.output_weight_HED[h].double()
        u, singular, _ = torch.linalg.svd(t)
        rank_with = {
            "spec": int((singular > singular.max() * max(n, d) * FLOAT32_EPS).sum()),
            "width d_v": int((singular > singular.max() * max(n, e) * FLOAT32_EPS).sum()),
            "float64 eps": int((singular > singular.max() * max(n, d) * 2.2e-16).sum()),
        }
        assert rank_with == {"spec": 3, "width d_v": 4, "float64 eps": e}
        expected = trace.attentions[0][0, h, :n, :n].double() @ u[:, :3] @ u[:, :3].T
        torch.testing.assert_close(effective[0, h, :n, :n].double(), expected, atol=1e-6, rtol=0)


def test_hta_rows_sum_to_one(tiny):
    registry = load_registry()
    trace = full_trace(tiny, examples()[:3])
    for spec in ("hta", "hta:norm=sum"):
        rows = registry.attributor(spec).attribute(trace).aggregated_BLN
        assert rows.shape[1] == trace.num_layers
        for row, n in enumerate(trace.batch.lengths):
            torch.testing.assert_close(rows[row, :, :n].sum(-1), torch.ones(trace.num_layers))
            assert rows[row, :, n:].abs().max() == 0 if n < rows.shape[2] else True


def hf_contributions(trace, norm: str) -> torch.Tensor:
    """c^l_ji from the Hugging Face model's own ``hidden_states``, (B, L, N, N), in float64.

    The embedding module's output is replaced by the variable x, so this is the Jacobian of the
    real forward pass (attention mask included) w.r.t. the embedding output, not of a re-run.
    """
    model = trace.model
    inputs = trace.batch.model_inputs()
    embeddings = model.base_model.embeddings

    def hidden_BLND(x_BND: torch.Tensor) -> torch.Tensor:
        handle = embeddings.register_forward_hook(lambda _m, _i, _o: x_BND)
        try:
            out = model(**inputs, output_hidden_states=True)
        finally:
            handle.remove()
        return torch.stack(out.hidden_states[1:], dim=1)

    x_BND = trace.hidden_states[0]
    jacobian = torch.autograd.functional.jacobian(
        hidden_BLND, x_BND, vectorize=True
    )  # (B, L, N, D, B, N, D)
    batch_size, layers, n = jacobian.shape[:3]
    result = torch.zeros(batch_size, layers, n, n, dtype=torch.float64)
    for row, length in enumerate(trace.batch.lengths):
        block = jacobian[row, :, :length, :, row, :length]  # (L, j, D, i, D)
        if norm == "frobenius":
            norms = block.pow(2).sum(dim=(2, 4)).sqrt()
        else:
            norms = block.sum(dim=2).norm(dim=-1)
        result[row, :, :length, :length] = norms / norms.sum(dim=-1, keepdim=True)
    return result


@pytest.mark.parametrize("norm", ["frobenius", "sum"])
def test_hta_matches_the_real_models_float64_jacobian(tiny, norm):
    """hta's rows equal c^l_0i from the HF model's hidden states, for every j via contributions."""
    registry = load_registry()
    tiny.model.double()
    try:
        trace = full_trace(tiny, examples(["the food was not good at all", "bad"]))
        assert trace.hidden_states[0].dtype == torch.float64
        expected = hf_contributions(trace, norm)
        rows = registry.attributor(f"hta:norm={norm}").attribute(trace).aggregated_BLN
        for row, n in enumerate(trace.batch.lengths):
            # the attributor stores its rows in float32
            torch.testing.assert_close(
                rows[row, :, :n].double(), expected[row, :, 0, :n], rtol=1e-6, atol=1e-9
            )
            assert rows[row, :, n:].abs().max() == 0 if n < rows.shape[2] else True
            every_target = contributions(
                tiny, trace.hidden_states[0][row, :n], norm, targets=range(n)
            )
            torch.testing.assert_close(
                every_target, expected[row, :, :n, :n], rtol=1e-9, atol=1e-12
            )
    finally:
        tiny.model.float()


@pytest.mark.parametrize("chunk_size", [7, 256])
def test_forward_and_reverse_mode_give_the_same_frobenius_contributions(tiny, chunk_size):
    """Forward mode (a Jacobian-vector product per input coordinate, every layer and target at
    once) and reverse mode (per layer and target) are the same Frobenius shares, in float64,
    whatever the chunks (7 does not divide n x D); ``auto`` picks forward for every target."""
    tiny.model.double()
    try:
        trace = full_trace(tiny, examples(["the food was not good at all"]))
        n = trace.batch.lengths[0]
        x_ND = trace.hidden_states[0][0, :n]
        every = range(n)
        forward = contributions(tiny, x_ND, targets=every, chunk_size=chunk_size, mode="forward")
        reverse = contributions(tiny, x_ND, targets=every, chunk_size=chunk_size, mode="reverse")
        torch.testing.assert_close(forward, reverse, rtol=1e-10, atol=1e-13)
        assert forward.shape == (trace.num_layers, n, n)
        some = contributions(tiny, x_ND, targets=(2, 0), mode="forward")
        torch.testing.assert_close(some, reverse[:, [2, 0]], rtol=1e-10, atol=1e-13)
    finally:
        tiny.model.float()


def test_layerwise_reference_compares_layer_by_layer(tiny_bert, run_cli, tmp_path):
    """Each score is scipy's Spearman of the method's layer l with the reference's layer l.

    A whole-model method (saliency, one row) is compared with the reference's last layer.
    """
    import json

    from scipy.stats import spearmanr

    from attrib_bench.data.load import load_examples

    output = tmp_path / "r.json"
    code, _, err = run_cli(
        "run",
        "--model",
        tiny_bert,
        "--limit",
        "4",
        "--attributors",
        "attention,saliency",
        "--reference",
        "hta:norm=sum",
        "--quiet",
        "--output",
        output,
    )
    assert code == 0, err
    document = json.loads(output.read_text())
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, load_examples(limit=4).examples)
    registry = load_registry()
    reference = registry.attributor("hta:norm=sum").attribute(trace).aggregated_BLN
    layers = trace.num_layers
    assert reference.shape[1] == layers == 3
    for method in ("attention", "saliency"):
        attribution = registry.attributor(method).attribute(trace)
        stored = document["methods"][method]
        for kind in ("aggregated", "local"):
            rows = attribution.rows(kind)
            if rows is None:
                assert kind not in stored["per_example"]["spearman"]
                continue
            per_layer = stored["per_example"]["spearman"][kind]
            assert len(per_layer) == rows.shape[1] == (layers if method == "attention" else 1)
            for row, (example, n) in enumerate(
                zip(trace.batch.examples, trace.batch.lengths, strict=True)
            ):
                index = document["example_ids"].index(example.id)
                for layer in range(rows.shape[1]):
                    matched = layer if rows.shape[1] == layers else layers - 1
                    expected = spearmanr(rows[row, layer, :n], reference[row, matched, :n])[0]
                    assert per_layer[layer][index] == pytest.approx(expected, abs=1e-9)


def test_costly_hta_is_not_in_the_default_run():
    defaults = load_registry().defaults("attributors")
    assert "hta" not in defaults
    assert {"attention", "globenc", "effective-attention", "saliency"} <= set(defaults)
