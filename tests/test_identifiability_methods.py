"""Effective attention and hidden-token attribution: the properties the spec asks for."""

from __future__ import annotations

import pytest
import torch
from helpers import SENTENCES, examples, full_trace

from attrib_bench.model.load import load_model
from attrib_bench.plugins import load_registry
from attrib_bench_plugins.effective import effective_attention
from attrib_bench_plugins.hta import contributions, hidden_states_from
from attrib_bench_plugins.norm import layer_inputs

LONG = " ".join(["a long sentence that needs more tokens than one head has dimensions"] * 3)


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(str(tiny_model), "cpu")


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


def test_hta_rows_sum_to_one(tiny):
    registry = load_registry()
    trace = full_trace(tiny, examples()[:3])
    for spec in ("hta", "hta:norm=sum"):
        rows = registry.attributor(spec).attribute(trace).aggregated_BLN
        assert rows.shape[1] == trace.num_layers
        for row, n in enumerate(trace.batch.lengths):
            torch.testing.assert_close(rows[row, :, :n].sum(-1), torch.ones(trace.num_layers))
            assert rows[row, :, n:].abs().max() == 0 if n < rows.shape[2] else True


def test_hta_frobenius_matches_finite_differences(tiny):
    trace = full_trace(tiny, examples(["the food was not good"]))
    x_ND = trace.hidden_states[0][0].double()
    model = tiny.model.double()
    try:
        ours = contributions(tiny, x_ND, "frobenius", targets=(0, 2))
        step = 1e-6
        n, d = x_ND.shape
        for layer in range(1, trace.num_layers + 1):
            blocks = torch.zeros(2, n)
            for i in range(n):
                for k in range(d):
                    plus, minus = x_ND.clone(), x_ND.clone()
                    plus[i, k] += step
                    minus[i, k] -= step
                    delta = (
                        hidden_states_from(tiny, plus, layer)
                        - hidden_states_from(tiny, minus, layer)
                    ) / (2 * step)
                    blocks[:, i] += delta[[0, 2]].pow(2).sum(-1).detach().float()
            expected = blocks.sqrt() / blocks.sqrt().sum(-1, keepdim=True)
            torch.testing.assert_close(ours[layer - 1].float(), expected, rtol=1e-4, atol=1e-6)
    finally:
        model.float()


def test_layerwise_reference_compares_layer_by_layer(tiny_bert, run_cli, tmp_path):
    import json

    output = tmp_path / "r.json"
    code, _, err = run_cli(
        "run",
        "--model",
        tiny_bert,
        "--limit",
        "4",
        "--attributors",
        "attention,saliency,hta",
        "--reference",
        "hta:norm=sum",
        "--quiet",
        "--output",
        output,
    )
    assert code == 0, err
    methods = json.loads(output.read_text())["methods"]
    assert len(methods["attention"]["scores"]["spearman"]["aggregated"]) == 3
    assert len(methods["saliency"]["scores"]["spearman"]["aggregated"]) == 1


def test_costly_hta_is_not_in_the_default_run():
    defaults = load_registry().defaults("attributors")
    assert "hta" not in defaults
    assert {"attention", "globenc", "effective-attention", "saliency"} <= set(defaults)
