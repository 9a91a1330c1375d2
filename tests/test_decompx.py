"""DecompX: the vectors sum back to every layer's output and the head's to the logits (every
family, float64), a float64 loop reference of the official code's steps, the explained score,
chunking, and the head's first-token requirement."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch, randomize_norms_and_biases
from test_families import FAMILIES, save_family_model

from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.target import DEFAULT_TARGET, Target
from attrib_bench.core.trace import Trace
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.decompx import (
    FIELDS,
    DecompX,
    Traced,
    decompx_vectors,
    head_contributions,
)

PLUGIN_FIELDS = {field.name: field for field in FIELDS}


def decompx_trace(loaded: LoadedModel, items, target: Target = DEFAULT_TARGET) -> Trace:
    batch = one_batch(loaded, items)
    return trace_batch(loaded, batch, DecompX.requires, 0, PLUGIN_FIELDS, target)


def batch_vectors(trace: Trace) -> list[torch.Tensor]:
    """The vectors of the whole padded batch at once (the attributor runs each example on its
    real tokens: the padded computation is checked here)."""
    return decompx_vectors(trace.adapter, Traced.of(trace), 2**24)


def load_double(directory) -> LoadedModel:
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    randomize_norms_and_biases(loaded.model)
    return loaded


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory) -> LoadedModel:
    directory = save_family_model(tmp_path_factory.mktemp(request.param), request.param)
    return load_double(directory)


def test_vectors_sum_back_to_each_layer_and_the_head_to_the_logits(family_model):
    """sum_k x^l_(i<-k) is layer l's real output at every real token i, and the head's
    per-class contributions sum to the real logits: the decomposition is exact (the official
    code's 1e-12 guards aside)."""
    trace = decompx_trace(family_model, examples())
    mask_BN = trace.mask_BN.bool()
    layers = batch_vectors(trace)
    assert len(layers) == trace.num_layers
    for layer, vectors_BNKD in enumerate(layers):
        total_BND = vectors_BNKD.sum(dim=2)
        real_BND = trace.hidden_states[layer + 1]
        torch.testing.assert_close(total_BND[mask_BN], real_BND[mask_BN], rtol=1e-7, atol=1e-7)
        padded_keys = vectors_BNKD.abs().sum(dim=-1)[mask_BN][:, ~mask_BN[0]]
        assert padded_keys.count_nonzero() == 0 or not (~mask_BN[0]).any()
    contributions_BKC = head_contributions(
        trace.loaded, trace.hidden_states[-1][:, 0], layers[-1][:, 0]
    )
    torch.testing.assert_close(contributions_BKC.sum(dim=1), trace.logits_BC, rtol=0, atol=1e-7)


def test_float32_sums_back_within_float32_rounding(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = decompx_trace(loaded, examples())
    layers = batch_vectors(trace)
    contributions_BKC = head_contributions(
        trace.loaded, trace.hidden_states[-1][:, 0], layers[-1][:, 0]
    )
    assert contributions_BKC.dtype == torch.float32
    torch.testing.assert_close(contributions_BKC.sum(dim=1), trace.logits_BC, rtol=0, atol=1e-4)


def split(vectors: list[torch.Tensor], bias: torch.Tensor) -> list[torch.Tensor]:
    """The official ``absdot`` rule, written per vector."""
    weights = [abs(float(v @ bias)) for v in vectors]
    total = sum(weights) + 1e-12
    return [v + (w / total) * bias for v, w in zip(vectors, weights, strict=True)]


def reference(model, inputs: dict) -> tuple[list[list[list[torch.Tensor]]], list[torch.Tensor]]:
    """DecompX of one unpadded example from the official code's steps, with loops over tokens
    and heads in float64 from BERT's Hugging Face modules: every layer's vectors [l][i][k] and
    the per-class logit contributions [k]."""
    layers = model.base_model.encoder.layer
    captured: dict[tuple[str, int], torch.Tensor] = {}
    hooks = []
    for index, layer in enumerate(layers):
        for name, module in (
            ("u1", layer.attention.output.LayerNorm),
            ("u2", layer.output.LayerNorm),
        ):
            hooks.append(
                module.register_forward_pre_hook(
                    lambda _m, args, key=(name, index): captured.__setitem__(key, args[0][0])
                )
            )
        hooks.append(
            layer.intermediate.dense.register_forward_hook(
                lambda _m, _a, out, key=("h", index): captured.__setitem__(key, out[0])
            )
        )
    try:
        with torch.no_grad():
            out = model(**inputs, output_attentions=True, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    heads = model.config.num_attention_heads
    x0 = out.hidden_states[0][0]
    n, d = x0.shape
    e = d // heads
    zero = torch.zeros(d, dtype=torch.float64)
    vectors = [[x0[i] if i == k else zero for k in range(n)] for i in range(n)]
    history = []
    with torch.no_grad():
        for index, layer in enumerate(layers):
            alpha = out.attentions[index][0]
            x = out.hidden_states[index][0]
            wv, bv = layer.attention.self.value.weight, layer.attention.self.value.bias
            wo, bo = layer.attention.output.dense.weight, layer.attention.output.dense.bias
            rows = []
            for i in range(n):
                row = []
                for k in range(n):
                    z = vectors[i][k].clone()
                    for h in range(heads):
                        part = slice(h * e, (h + 1) * e)
                        if index == 0:
                            value = x[k] @ wv[part].T + bv[part]
                            z = z + alpha[h, i, k] * (value @ wo[:, part].T)
                        else:
                            for j in range(n):
                                value = vectors[j][k] @ wv[part].T
                                z = z + alpha[h, i, j] * (value @ wo[:, part].T)
                    row.append(z)
                rows.append(split(row, bo if index == 0 else wo @ bv + bo))
            new = []
            for i in range(n):
                norms = []
                for ln, key in ((layer.attention.output.LayerNorm, "u1"),):
                    std = torch.sqrt(captured[(key, index)][i].var(unbiased=False) + ln.eps)
                    norms = [ln.weight * (v - v.mean()) / std for v in rows[i]]
                    norms = split(norms, ln.bias)
                pre = captured[("h", index)][i]
                theta = layer.intermediate.intermediate_act_fn(pre) / (pre + 1e-12)
                first = split(
                    [layer.intermediate.dense.weight @ v for v in norms],
                    layer.intermediate.dense.bias,
                )
                second = split(
                    [layer.output.dense.weight @ (theta * v) for v in first],
                    layer.output.dense.bias,
                )
                ln2 = layer.output.LayerNorm
                std2 = torch.sqrt(captured[("u2", index)][i].var(unbiased=False) + ln2.eps)
                summed = [a + b for a, b in zip(norms, second, strict=True)]
                new.append(split([ln2.weight * (v - v.mean()) / std2 for v in summed], ln2.bias))
            vectors = new
            history.append(vectors)
        pooler, classifier = model.base_model.pooler.dense, model.classifier
        pre = pooler.weight @ out.hidden_states[-1][0, 0] + pooler.bias
        theta = torch.tanh(pre) / (pre + 1e-12)
        pooled = split([pooler.weight @ v for v in vectors[0]], pooler.bias)
        logits = split([classifier.weight @ (theta * v) for v in pooled], classifier.bias)
    return history, logits


def test_against_a_float64_loop_reference(tiny_bert):
    """Each example of a padded batch against the loops on that example alone: every layer's
    vectors, the head=false rows (norms of the [CLS] row) and the head=true row (the predicted
    class's contributions), to 1e-10."""
    loaded = load_double(tiny_bert)
    items = examples(["the film was not good .", "bad", "a truly wonderful story"])
    trace = decompx_trace(loaded, items)
    assert len(set(trace.batch.lengths)) > 1  # padded
    layers = batch_vectors(trace)
    with_head = DecompX().attribute(trace).aggregated_BLN
    without = DecompX().configure({"head": "false"}).attribute(trace).aggregated_BLN
    inputs = trace.batch.model_inputs()
    close = {"rtol": 0, "atol": 1e-10}
    for row, n in enumerate(trace.batch.lengths):
        solo = {key: value[row : row + 1, :n] for key, value in inputs.items()}
        history, logits = reference(loaded.model, solo)
        for layer, expected in enumerate(history):
            expected_NKD = torch.stack([torch.stack(r) for r in expected])
            torch.testing.assert_close(layers[layer][row, :n, :n], expected_NKD, **close)
            torch.testing.assert_close(without[row, layer, :n], expected_NKD[0].norm(dim=-1))
        predicted = int(trace.logits_BC[row].argmax())
        expected_K = torch.stack([contribution[predicted] for contribution in logits])
        torch.testing.assert_close(with_head[row, 0, :n], expected_K, **close)
        assert with_head[row, :, n:].abs().sum() == 0 and without[row, :, n:].abs().sum() == 0


@pytest.mark.parametrize(
    "target", ["position=first,score=gold", "position=first,score=contrastive,foil=0"]
)
def test_the_row_sums_to_the_explained_score(tiny_bert, target):
    """With the head, a row sums to the score the run explains: the gold class's logit, or the
    class's logit minus the foil's."""
    loaded = load_double(tiny_bert)
    parsed = Target.parse(target)
    trace = decompx_trace(loaded, examples(), parsed)
    rows_BN = DecompX().attribute(trace).aggregated_BLN[:, 0]
    logits_BC = trace.logits_BC
    examples_B = torch.arange(logits_BC.shape[0])
    expected_B = logits_BC[examples_B, trace.target_classes_B]
    if trace.target_foils_B is not None:
        expected_B = expected_B - logits_BC[examples_B, trace.target_foils_B]
    assert (trace.target_classes_B != logits_BC.argmax(dim=-1)).any() or "gold" not in target
    torch.testing.assert_close(rows_BN.sum(dim=-1), expected_B, rtol=0, atol=1e-7)


def test_chunking_changes_nothing(tiny_bert):
    loaded = load_double(tiny_bert)
    trace = decompx_trace(loaded, examples())
    for head in ("true", "false"):
        whole = DecompX().configure({"head": head, "chunk_elements": str(10**12)})
        rowwise = DecompX().configure({"head": head, "chunk_elements": "1"})
        torch.testing.assert_close(
            rowwise.attribute(trace).aggregated_BLN,
            whole.attribute(trace).aggregated_BLN,
            rtol=0,
            atol=1e-12,
        )


def test_the_head_reads_the_first_token_only(tiny_bert):
    """head=true explains the classification head, which reads [CLS]: another target position
    fails the method with a line saying what to do; head=false explains any position."""
    loaded = load_double(tiny_bert)
    trace = decompx_trace(loaded, examples(), Target.parse("position=last"))
    with pytest.raises(ValueError, match="position=first"):
        DecompX().attribute(trace)
    rows_BLN = DecompX().configure({"head": "false"}).attribute(trace).aggregated_BLN
    assert rows_BLN.shape[1] == trace.num_layers and rows_BLN.abs().sum() > 0


def test_a_cli_run_and_a_position_the_head_cannot_explain(run_cli, tiny_bert, tmp_path):
    """Both variants run from the command line; under position=last the head variant fails
    with its one line before any batch while head=false and the other methods run."""
    output = tmp_path / "result.json"
    code, _, err = run_cli(
        *("run", "--model", tiny_bert, "--attributors", "decompx,decompx:head=false"),
        *("--limit", "4", "--quiet", "--output", output),
    )
    assert code == 0, err
    methods = json.loads(output.read_text())["methods"]
    assert methods["decompx"]["status"] == methods["decompx:head=false"]["status"] == "ok"
    last = tmp_path / "last.json"
    code, _, err = run_cli(
        *("run", "--model", tiny_bert, "--attributors", "decompx,decompx:head=false,saliency"),
        *("--target", "position=last", "--limit", "4", "--quiet", "--output", last),
    )
    methods = json.loads(last.read_text())["methods"]
    assert methods["decompx"]["status"] == "failed"
    assert "position=first" in methods["decompx"]["error"], methods["decompx"]
    assert methods["decompx:head=false"]["status"] == methods["saliency"]["status"] == "ok"


def test_both_variants_share_one_computation(tiny_bert, monkeypatch):
    """decompx and decompx:head=false on one trace propagate the vectors once (a memo on the
    trace), and each is charged for it."""
    import attrib_bench_plugins.decompx as module

    calls = []
    real = module.decompx_vectors
    monkeypatch.setattr(module, "decompx_vectors", lambda *a, **k: calls.append(1) or real(*a, **k))
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = decompx_trace(loaded, examples())
    DecompX().attribute(trace)
    DecompX().configure({"head": "false"}).attribute(trace)
    assert len(calls) == len(trace.batch.examples)  # one per example, not two
    assert "decompx.rows" in trace.memo_seconds
