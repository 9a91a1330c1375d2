"""Attention flow: max flows checked against a linear program written from the definition
(maximise the flow out of the source subject to capacities and conservation), on random graphs
and on a tiny BERT's residual attention built with explicit loops."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, full_trace, one_batch
from scipy.optimize import linprog

from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.attention_flow import AttentionFlow, flow_rows


def _lp_max_flow(matrices_LNN: np.ndarray, layer: int, source: int, sink: int) -> float:
    """Max flow from (layer, source) to (0, sink) as an LP over the layered graph's edges."""
    L, n, _ = matrices_LNN.shape
    edges = [(k, i, j) for k in range(1, L + 1) for i in range(n) for j in range(n)]
    index = {edge: k for k, edge in enumerate(edges)}
    nodes = [(k, i) for k in range(L + 1) for i in range(n)]
    rows, rhs = [], []
    for node in nodes:  # conservation at every node but the source and the sink
        if node in ((layer, source), (0, sink)):
            continue
        row = np.zeros(len(edges))
        k, i = node
        for j in range(n):
            if k >= 1:
                row[index[(k, i, j)]] += 1  # out of the node
            if k + 1 <= L:
                row[index[(k + 1, j, i)]] -= 1  # into the node
        rows.append(row)
        rhs.append(0.0)
    objective = np.zeros(len(edges))
    for j in range(n):
        objective[index[(layer, source, j)]] = -1  # maximise what leaves the source
    bounds = [(0.0, float(matrices_LNN[k - 1, i, j])) for (k, i, j) in edges]
    result = linprog(objective, A_eq=np.array(rows), b_eq=rhs, bounds=bounds, method="highs")
    assert result.status == 0
    return -result.fun


def _lp_rows(matrices_LNN: np.ndarray, target: int) -> np.ndarray:
    L, n, _ = matrices_LNN.shape
    out = np.array(
        [[_lp_max_flow(matrices_LNN, k, target, j) for j in range(n)] for k in range(1, L + 1)]
    )
    return out / out.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flows_equal_a_linear_program_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    matrices = rng.random((3, 4, 4)) * (rng.random((3, 4, 4)) > 0.3)
    matrices /= matrices.sum(axis=-1, keepdims=True) + 1e-12
    target = seed % 4
    np.testing.assert_allclose(flow_rows(matrices, target), _lp_rows(matrices, target), atol=1e-8)


def test_flows_equal_the_official_codes_edmonds_karp():
    """The official code's algorithm (networkx's Edmonds-Karp in float64, one nx.maximum_flow
    per sink) on a residual-attention graph of MiniLM's depth: the same rows up to the integer
    capacities' rounding (2^-30 of the largest capacity per edge; 4e-10 here)."""
    import networkx as nx
    from networkx.algorithms.flow import edmonds_karp

    rng = np.random.default_rng(7)
    layers, n, target = 6, 10, 0
    matrices = 0.5 * rng.dirichlet(np.ones(n), size=(layers, n)) + 0.5 * np.eye(n)
    graph = nx.DiGraph()
    for k in range(1, layers + 1):
        for i in range(n):
            for j in range(n):
                graph.add_edge((k, i), (k - 1, j), capacity=float(matrices[k - 1, i, j]))
    official = np.array(
        [
            [
                nx.maximum_flow_value(graph, (k, target), (0, j), flow_func=edmonds_karp)
                for j in range(n)
            ]
            for k in range(1, layers + 1)
        ]
    )
    official /= official.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(flow_rows(matrices, target), official, rtol=0, atol=2e-9)


def test_the_first_layer_row_is_the_residual_attention_row():
    rng = np.random.default_rng(3)
    matrices = rng.random((2, 5, 5))
    matrices /= matrices.sum(axis=-1, keepdims=True)
    rows = flow_rows(matrices, 2)
    np.testing.assert_allclose(rows[0], matrices[0, 2] / matrices[0, 2].sum(), atol=1e-12)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-12)


def test_rows_on_a_tiny_bert_equal_explicit_loops(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    items = examples()[:3]
    trace = full_trace(loaded, items)
    rows = AttentionFlow().attribute(trace).aggregated_BLN.double()
    for b, length in enumerate(trace.batch.lengths):
        attentions = [a[b].double().numpy() for a in trace.attentions]  # (H, N, N) per layer
        L = len(attentions)
        residual = np.zeros((L, length, length))
        for k in range(L):  # head mean, then 0.5 A + 0.5 I on the real tokens, rows normalised
            H = attentions[k].shape[0]
            for i in range(length):
                for j in range(length):
                    mean = sum(attentions[k][h, i, j] for h in range(H)) / H
                    residual[k, i, j] = 0.5 * mean + 0.5 * (i == j)
                residual[k, i] /= residual[k, i].sum()
        expected = _lp_rows(residual, 0)
        np.testing.assert_allclose(rows[b, :, :length].numpy(), expected, atol=1e-5)
        assert not rows[b, :, length:].any()


def test_an_example_alone_gets_its_rows_in_a_padded_batch(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    items = examples()[:4]
    trace = full_trace(loaded, items)
    together = AttentionFlow().attribute(trace).aggregated_BLN
    for b, item in enumerate(trace.batch.examples):  # the batch's own order
        batch = one_batch(loaded, [item])
        alone = AttentionFlow().attribute(trace_batch(loaded, batch, {"attentions"}))
        n = batch.lengths[0]
        torch.testing.assert_close(
            alone.aggregated_BLN[0, :, :n], together[b, :, :n], atol=1e-5, rtol=1e-4
        )


def test_a_cli_run_only_when_named(run_cli, tiny_bert, tmp_path):
    output = tmp_path / "result.json"
    args = ("run", "--model", tiny_bert, "--limit", "3", "--quiet", "--output", output)
    code, _, err = run_cli(*args, "--attributors", "attention-flow,rollout")
    assert code == 0, err
    methods = json.loads(output.read_text())["methods"]
    assert methods["attention-flow"]["status"] == "ok"
    code, _, err = run_cli(*args)  # the default run leaves the costly flow out
    assert code == 0, err
    assert "attention-flow" not in json.loads(output.read_text())["methods"]
