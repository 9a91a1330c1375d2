"""ALTI: the decomposition sums back to each layer, a float64 loop reference, chunking, padding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import (
    ARCHITECTURES,
    examples,
    full_trace,
    randomize_norms_and_biases,
    rows_by_id,
    save_tiny_decoder,
)

from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.model.load import load_model
from attrib_bench.testing.conformance import check_attributor
from attrib_bench_plugins.alti import ORDERS, Alti, alti_layer, alti_matrices


def load_double(directory: Path | str) -> LoadedModel:
    """The model in float64 with random norm weights and biases, so the b_O and beta terms
    that ALTI leaves out of T_i(x_j) are not zero."""
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    randomize_norms_and_biases(loaded.model)
    return loaded


def resultant_modules(loaded: LoadedModel) -> tuple[list[torch.nn.Module], str]:
    """Per layer, the module whose output (post-LN: LN1) or input (pre-LN: N2, reading the
    residual stream after attention) is y_i, by its Hugging Face name, independent of the
    adapter."""
    base = loaded.model.base_model
    model_type = loaded.model.config.model_type
    if model_type in ("bert", "roberta"):
        return [layer.attention.output.LayerNorm for layer in base.encoder.layer], "output"
    if model_type == "gpt2":
        return [block.ln_2 for block in base.h], "input"
    return [layer.post_attention_layernorm for layer in base.layers], "input"


def captured_resultants(loaded: LoadedModel, run) -> tuple[list[torch.Tensor], object]:
    """The real y_i of every layer while ``run()`` traces, and what it returns."""
    modules, where = resultant_modules(loaded)
    seen: list[torch.Tensor] = []

    def keep(_module, args, output):
        seen.append((args[0] if where == "input" else output).detach())

    hooks = [module.register_forward_hook(keep) for module in modules]
    try:
        result = run()
    finally:
        for hook in hooks:
            hook.remove()
    return seen, result


@pytest.fixture(scope="module")
def tiny_decoders(tmp_path_factory) -> dict[str, Path]:
    return {
        kind: save_tiny_decoder(tmp_path_factory.mktemp(f"alti-{kind}"), kind)
        for kind in ("gpt2", "llama")
    }


@pytest.fixture(params=["bert", "roberta", "gpt2", "llama"])
def any_family(request, tiny_bert, tiny_roberta, tiny_decoders) -> Path:
    return {"bert": tiny_bert, "roberta": tiny_roberta, **tiny_decoders}[request.param]


def test_transformed_vectors_sum_back_to_the_real_layer_output(any_family):
    """sum_j T_i(x_j) + the dropped terms (post-LN g1_i(b_O) + beta1, pre-LN b_O) is the real
    y_i that the model computed, in float64: what makes ALTI's decomposition exact."""
    loaded = load_double(any_family)
    real, trace = captured_resultants(loaded, lambda: full_trace(loaded, examples()))
    mask = trace.mask_BN.bool()
    tokens = mask.shape[1]
    queries = torch.arange(tokens).expand(mask.shape[0], -1)
    for layer in range(trace.num_layers):
        pieces = alti_layer(trace, layer)
        assert pieces.dropped_BND.abs().max() > 0 or loaded.model.config.model_type == "llama"
        total = pieces.transformed(queries).sum(dim=1) + pieces.dropped_BND
        # LLaMA's RMSNorm runs in float32 inside a float64 model, so its N2 input (our y_i) is
        # float64 but the stream it was added to was normalised in float32: still exact here.
        torch.testing.assert_close(total[mask], real[layer][mask], rtol=0, atol=1e-10)
        torch.testing.assert_close(
            pieces.resultant_BND[mask], real[layer][mask], rtol=0, atol=1e-10
        )


def test_transformed_vectors_sum_back_in_float32(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    real, trace = captured_resultants(loaded, lambda: full_trace(loaded, examples()))
    mask = trace.mask_BN.bool()
    queries = torch.arange(mask.shape[1]).expand(mask.shape[0], -1)
    for layer in range(trace.num_layers):
        pieces = alti_layer(trace, layer)
        total = pieces.transformed(queries).sum(dim=1) + pieces.dropped_BND
        torch.testing.assert_close(total[mask], real[layer][mask], rtol=1e-6, atol=1e-6)


def reference_matrices(model, inputs: dict, order: int) -> list[torch.Tensor]:
    """C^l of one unpadded example, written from the definition with loops over i, j and h in
    float64 from the Hugging Face modules (BERT layout)."""
    captured = {}
    layers = model.base_model.encoder.layer
    hooks = [
        layer.attention.output.LayerNorm.register_forward_pre_hook(
            lambda _m, args, i=index: captured.__setitem__(i, args[0][0])
        )
        for index, layer in enumerate(layers)
    ]
    try:
        with torch.no_grad():
            out = model(**inputs, output_attentions=True, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    heads = model.config.num_attention_heads
    matrices = []
    for index, layer in enumerate(layers):
        x, alpha, u1 = out.hidden_states[index][0], out.attentions[index][0], captured[index]
        length, d = x.shape
        e = d // heads
        wv, bv = layer.attention.self.value.weight, layer.attention.self.value.bias
        wo = layer.attention.output.dense.weight
        ln1 = layer.attention.output.LayerNorm
        std = torch.sqrt(u1.var(dim=-1, unbiased=False) + ln1.eps)
        c = torch.zeros(length, length, dtype=torch.float64)
        with torch.no_grad():
            f = [
                [
                    (x[j] @ wv[h * e : (h + 1) * e].T + bv[h * e : (h + 1) * e])
                    @ wo[:, h * e : (h + 1) * e].T
                    for j in range(length)
                ]
                for h in range(heads)
            ]
            for i in range(length):
                y = ln1(u1[i])
                for j in range(length):
                    r = x[i].clone() if i == j else torch.zeros(d, dtype=torch.float64)
                    for h in range(heads):
                        r = r + alpha[h, i, j] * f[h][j]
                    t = ln1.weight * (r - r.mean()) / std[i]
                    distance = torch.linalg.vector_norm(y - t, ord=order)
                    c[i, j] = max(0.0, float(torch.linalg.vector_norm(y, ord=order) - distance))
                c[i] /= c[i].sum()
        matrices.append(c)
    return matrices


@pytest.mark.parametrize("distance", list(ORDERS))
def test_against_a_float64_loop_reference(tiny_bert, distance):
    """Each example of a padded batch against the loops on that example alone: the full C^l
    below the top layer, and the local and rolled-out (no identity) target rows, to 1e-8."""
    loaded = load_double(tiny_bert)
    trace = full_trace(loaded, examples())
    assert len(set(trace.batch.lengths)) > 1  # padded
    alti = Alti().configure({"distance": distance})
    attribution = alti.attribute(trace)
    matrices = alti_matrices(trace, ORDERS[distance], 2**24)
    inputs = trace.batch.model_inputs()
    close = {"rtol": 0, "atol": 1e-8}
    for row, n in enumerate(trace.batch.lengths):
        solo = {k: v[row : row + 1, :n] for k, v in inputs.items()}
        reference = reference_matrices(loaded.model, solo, ORDERS[distance])
        for layer, expected in enumerate(reference[:-1]):
            torch.testing.assert_close(matrices[layer][row, :n, :n], expected, **close)
        product = reference[0]
        for layer, matrix in enumerate(reference):
            product = matrix if layer == 0 else matrix @ product
            torch.testing.assert_close(attribution.local_BLN[row, layer, :n], matrix[0], **close)
            aggregated = attribution.aggregated_BLN[row, layer, :n]
            torch.testing.assert_close(aggregated, product[0], **close)
        assert attribution.aggregated_BLN[row, :, n:].abs().sum() == 0


def test_chunking_changes_nothing(tiny_bert):
    """One query row per chunk gives what one chunk for the whole batch gives."""
    loaded = load_double(tiny_bert)
    trace = full_trace(loaded, examples())
    whole = Alti().configure({"chunk_elements": str(10**12)}).attribute(trace)
    rowwise = Alti().configure({"chunk_elements": "1"}).attribute(trace)
    for kind in ("local", "aggregated"):
        torch.testing.assert_close(rowwise.rows(kind), whole.rows(kind), rtol=0, atol=1e-14)


def test_an_example_alone_equals_it_in_a_padded_batch(any_family):
    loaded = load_double(any_family)
    # Hugging Face runs LLaMA's softmax and RMSNorm in float32 even in a float64 model.
    atol = 1e-6 if loaded.model.config.model_type == "llama" else 1e-10
    batch_trace = full_trace(loaded, examples())
    batched = rows_by_id(batch_trace, Alti().attribute(batch_trace))
    for item in examples():
        alone_trace = full_trace(loaded, [item])
        alone = rows_by_id(alone_trace, Alti().attribute(alone_trace))[item.id]
        for kind in ("local", "aggregated"):
            torch.testing.assert_close(batched[item.id][kind], alone[kind], rtol=0, atol=atol)


def test_causal_rows_give_nothing_to_later_tokens(tiny_decoders):
    """Lower-triangular C^l; each real row sums to 1, or to 0 where every ||y_i - T_i(x_j)||_1
    reaches ||y_i||_1 (here: random biases as large as the tiny model's stream; the official
    code divides 0 by 0 there)."""
    loaded = load_double(tiny_decoders["gpt2"])
    trace = full_trace(loaded, examples())
    real = trace.mask_BN.bool()
    for matrix in alti_matrices(trace, 1, 2**24)[:-1]:
        assert torch.triu(matrix, diagonal=1).abs().max() == 0
        sums = matrix.sum(dim=-1)[real]
        assert torch.isclose(sums, torch.ones_like(sums)).logical_or(sums == 0).all()


def test_conformance_in_chunks_of_one_element():
    """The defaults are checked with every built-in in test_conformance.py; this is the other
    distance, computed one element at a time."""
    check_attributor(Alti().configure({"distance": "l2", "chunk_elements": "1"}))


def test_bad_parameters_are_refused():
    from attrib_bench import UsageError

    with pytest.raises(UsageError, match="chunk_elements"):
        Alti().configure({"chunk_elements": "0"})
    with pytest.raises(UsageError, match="distance"):
        Alti().configure({"distance": "cosine"})


def test_a_cli_run(run_cli, tiny_bert, tmp_path):
    output = tmp_path / "result.json"
    code, _, err = run_cli(
        *("run", "--model", tiny_bert, "--attributors", "alti,alti:distance=l2"),
        *("--limit", "4", "--quiet", "--output", output),
    )
    assert code == 0, err
    methods = json.loads(output.read_text())["methods"]
    assert {"alti", "alti:distance=l2"} <= set(methods), sorted(methods)
