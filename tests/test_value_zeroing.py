"""Value zeroing: a float64 loop reference from the definition, batching, padding, precision."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, full_trace, one_batch, rows_by_id

from attrib_bench.core.adapter import unmet_capabilities
from attrib_bench.core.interfaces import Example
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.architectures import attrib_bench_architectures
from attrib_bench_plugins.value_zeroing import ValueZeroing, layer_matrix, zeroed_outputs


@pytest.fixture(scope="module")
def tiny64(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _norm(module: torch.nn.Module) -> tuple[np.ndarray, np.ndarray, float]:
    return (
        module.weight.detach().double().numpy(),
        module.bias.detach().double().numpy(),
        module.eps,
    )


def _reference_layer(layer: torch.nn.Module, x: np.ndarray, zeroed: int | None, heads: int):
    """One BERT layer by hand in float64, head by head, with token ``zeroed``'s values 0."""

    def w(module):
        return module.weight.detach().double().numpy(), module.bias.detach().double().numpy()

    attention = layer.attention
    (wq, bq), (wk, bk) = w(attention.self.query), w(attention.self.key)
    wv, bv = w(attention.self.value)
    n, d = x.shape
    e = d // heads
    context = np.zeros((n, d))
    for h in range(heads):
        cols = slice(h * e, (h + 1) * e)
        q = x @ wq[cols].T + bq[cols]
        k = x @ wk[cols].T + bk[cols]
        v = x @ wv[cols].T + bv[cols]
        if zeroed is not None:
            v[zeroed] = 0.0
        for i in range(n):
            logits = np.array([q[i] @ k[j] / math.sqrt(e) for j in range(n)])
            weights = np.exp(logits - logits.max())
            weights /= weights.sum()
            context[i, cols] = sum(weights[j] * v[j] for j in range(n))
    wo, bo = w(attention.output.dense)
    h1 = _layer_norm(context @ wo.T + bo + x, *_norm(attention.output.LayerNorm))
    (w1, b1), (w2, b2) = w(layer.intermediate.dense), w(layer.output.dense)
    pre = h1 @ w1.T + b1
    gelu = 0.5 * pre * (1.0 + np.vectorize(math.erf)(pre / math.sqrt(2.0)))
    return _layer_norm(gelu @ w2.T + b2 + h1, *_norm(layer.output.LayerNorm))


def _reference_rows(trace, row: int) -> tuple[np.ndarray, np.ndarray]:
    """Local and rolled-out target rows (L, n) of example ``row``: a separate layer run per
    zeroed token, sklearn's cosine distance 1 - x.y / (|x||y|), rows normalised, R^l = M^l R^l-1."""
    n = trace.batch.lengths[row]
    target = int(trace.target_positions_B[row])
    heads = trace.model.config.num_attention_heads
    local, aggregated, product = [], [], None
    for index, layer in enumerate(trace.adapter.layer_sequence):
        x = trace.hidden_states[index][row, :n].double().numpy()
        clean = _reference_layer(layer, x, None, heads)
        matrix = np.zeros((n, n))
        for j in range(n):
            out = _reference_layer(layer, x, j, heads)
            for i in range(n):
                cos = out[i] @ clean[i] / (np.linalg.norm(out[i]) * np.linalg.norm(clean[i]))
                matrix[i, j] = 1.0 - cos
        matrix /= matrix.sum(axis=1, keepdims=True)
        product = matrix if product is None else matrix @ product
        local.append(matrix[target])
        aggregated.append(product[target])
    return np.array(local), np.array(aggregated)


def test_matches_a_float64_loop_reference(tiny64):
    trace = full_trace(tiny64, examples())
    assert trace.hidden_states[0].dtype == torch.float64
    attribution = ValueZeroing().attribute(trace)
    for row, n in enumerate(trace.batch.lengths):
        local, aggregated = _reference_rows(trace, row)
        np.testing.assert_allclose(attribution.local_BLN[row, :, :n].numpy(), local, atol=1e-8)
        np.testing.assert_allclose(
            attribution.aggregated_BLN[row, :, :n].numpy(), aggregated, atol=1e-8
        )
        assert not attribution.local_BLN[row, :, n:].any()
    np.testing.assert_allclose(attribution.local_BLN.sum(-1).numpy(), 1.0, atol=1e-12)


def test_batched_reruns_equal_one_at_a_time(tiny64):
    trace = full_trace(tiny64, examples())
    batched = ValueZeroing().attribute(trace)
    single = ValueZeroing().configure({"chunk_size": "1"}).attribute(trace)
    for kind in ("local", "aggregated"):
        torch.testing.assert_close(batched.rows(kind), single.rows(kind), rtol=0, atol=1e-12)


def test_model_precision_is_float64_up_to_float32_rounding(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, examples())
    assert trace.hidden_states[0].dtype == torch.float32
    high = ValueZeroing().attribute(trace)
    model = ValueZeroing().configure({"precision": "model"}).attribute(trace)
    for kind in ("local", "aggregated"):
        assert model.rows(kind).dtype == torch.float64
        torch.testing.assert_close(model.rows(kind), high.rows(kind), rtol=1e-4, atol=1e-5)
        assert not torch.equal(model.rows(kind), high.rows(kind))


def test_padding_and_companions_do_not_matter(tiny64):
    items = examples()
    together = rows_by_id(trace := full_trace(tiny64, items), ValueZeroing().attribute(trace))
    for item in items:
        alone = full_trace(tiny64, [item])
        rows = rows_by_id(alone, ValueZeroing().attribute(alone))[item.id]
        for kind, expected in rows.items():
            torch.testing.assert_close(together[item.id][kind], expected, rtol=0, atol=1e-10)


def test_zeroing_hook_leaves_the_clean_copy_alone(tiny64):
    layer = tiny64.adapter.layer_sequence[0]
    hidden = full_trace(tiny64, examples()[:1]).hidden_states[0][0]
    value = layer.get_submodule(tiny64.adapter.spec.value)
    with torch.no_grad():
        outputs = zeroed_outputs(layer, value, hidden, torch.tensor([-1, 2]))
        clean = layer(hidden[None])
    clean = clean[0] if isinstance(clean, tuple) else clean
    torch.testing.assert_close(outputs[0], clean[0], rtol=0, atol=1e-12)
    assert (outputs[1] - clean[0]).abs().max() > 1e-3


def _sst2(count: int) -> list[Example]:
    from conftest import SHARED_DATA

    lines = (SHARED_DATA / "sst2" / "dev.tsv").read_text().splitlines()[1 : count + 1]
    return [Example(id=str(i), text=line.split("\t")[0]) for i, line in enumerate(lines)]


def test_float64_resolves_minilm_lower_layer_rankings(minilm):
    """In MiniLM's first layers zeroing one token moves [CLS] by distances summing to ~1e-5:
    1 - cos in float32 scrambles their ranking, the float64 rerun's ranking is batching-proof."""
    loaded = load_model(minilm, "cpu", architectures=ARCHITECTURES)
    batch = one_batch(loaded, _sst2(8), 128)
    trace = trace_batch(loaded, batch, {"hidden_states"})
    path = loaded.adapter.spec.value
    scrambled = 0
    for index in range(2):
        layer = loaded.adapter.layer_sequence[index]
        high = copy.deepcopy(layer).double()
        for row, n in enumerate(batch.lengths):
            hidden = trace.hidden_states[index][row, :n]
            with torch.no_grad():
                rows = [
                    layer_matrix(high, high.get_submodule(path), hidden.double(), chunk)[0]
                    for chunk in (1, 5, 64)
                ]
                outputs = zeroed_outputs(
                    layer, layer.get_submodule(path), hidden, torch.arange(-1, n)
                )
            for other in rows[1:]:
                torch.testing.assert_close(other, rows[0], rtol=0, atol=1e-12)
                assert torch.equal(other.argsort(), rows[0].argsort())
            cos = torch.nn.functional.cosine_similarity(outputs[1:, 0], outputs[:1, 0], dim=-1)
            float32 = 1.0 - cos
            assert float32.dtype == torch.float32 and float32.sum() < 5e-4
            scrambled += int(not torch.equal(float32.argsort(), rows[0].argsort()))
    assert scrambled >= len(batch.lengths), scrambled  # most of the 2 x 8 rankings


def test_decoders_are_refused_by_needs():
    specs = {spec.model_types[0]: spec for spec in attrib_bench_architectures()}
    assert unmet_capabilities(ValueZeroing(), specs["bert"]) == []
    assert unmet_capabilities(ValueZeroing(), specs["gpt2"])
    assert unmet_capabilities(ValueZeroing(), specs["llama"])


def test_a_cli_run(run_cli, tiny_bert, tmp_path):
    output = tmp_path / "result.json"
    code, _, err = run_cli(
        *("run", "--model", tiny_bert, "--attributors", "value-zeroing,value-zeroing:chunk_size=3"),
        *("--limit", "4", "--quiet", "--output", output),
    )
    assert code == 0, err
    methods = json.loads(output.read_text())["methods"]
    assert {"value-zeroing", "value-zeroing:chunk_size=3"} <= set(methods), sorted(methods)
