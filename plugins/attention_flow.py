"""Attention flow (Abnar & Zuidema 2020, official code github.com/samiraabnar/attention_flow).

The residual-attention graph: one node per (layer l = 0..L, real token), and an edge from
token i at layer l to token j at layer l - 1 with capacity M^l_ij, where M^l is the head mean
of layer l's attention with the residual mixed in and rows normalised (the official notebooks'
``(A + I) / rowsum``, which is 0.5 A + 0.5 I: ``fixed_residual`` with ``residual=0.5``, the
same matrices ``rollout`` multiplies). The row of layer l is, for every input token j, the
maximum flow from the target token at layer l to token j at layer 0 (networkx, as the official
code), normalised to sum 1. The official code finds each flow with Edmonds-Karp; a maximum
flow's value does not depend on the algorithm that finds it, so this uses networkx's shortest
augmenting path: the same rows to 6e-17 and 13.8x faster on MiniLM's graphs at n = 32
(benchmarks/attention_flow_algorithms.py). Rollout multiplies the matrices; flow takes the
bottleneck of every path instead, so it costs L x n max-flow problems per example: it runs
only when selected by name. Layer-wise only as aggregated rows (a flow has no local row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace, UsageError
from attrib_bench.toolkit.aggregation import fixed_residual
from attrib_bench.toolkit.attention_family import head_mean_attention

if TYPE_CHECKING:
    import networkx as nx


def flow_graph(matrices_LNN: np.ndarray) -> nx.DiGraph:
    """The layered graph: nodes (layer, token), layer-l edges (l, i) -> (l - 1, j) carrying
    ``matrices_LNN[l - 1][i, j]`` where it is positive."""
    import networkx as nx  # here, not at import: `attrib-bench list` loads every plugin

    layers, n, _ = matrices_LNN.shape
    graph = nx.DiGraph()
    for layer in range(1, layers + 1):
        for i in range(n):
            for j in range(n):
                capacity = float(matrices_LNN[layer - 1, i, j])
                if capacity > 0:
                    graph.add_edge((layer, i), (layer - 1, j), capacity=capacity)
    return graph


def flow_rows(matrices_LNN: np.ndarray, target: int) -> np.ndarray:
    """Per layer l = 1..L, the max flow from ``target`` at layer l to every token at layer 0 of
    ``flow_graph(matrices_LNN)``, normalised to sum 1 (zeros where nothing flows). (L, N)."""
    from networkx.algorithms.flow import build_residual_network, shortest_augmenting_path

    layers, n, _ = matrices_LNN.shape
    graph = flow_graph(matrices_LNN)
    # One residual network for all L x n problems: each call resets its flows.
    residual = build_residual_network(graph, "capacity")
    rows = np.zeros((layers, n))
    for layer in range(1, layers + 1):
        source = (layer, target)
        if source not in graph:
            continue
        for j in range(n):
            if (0, j) in graph:
                flow = shortest_augmenting_path(graph, source, (0, j), residual=residual)
                rows[layer - 1, j] = flow.graph["flow_value"]
        total = rows[layer - 1].sum()
        if total > 0:
            rows[layer - 1] /= total
    return rows


class AttentionFlow(Configurable):
    name = "attention-flow"
    description = (
        "Attention flow (Abnar & Zuidema 2020): max flow from the target token at layer l to "
        "each input token through the residual-attention graph, normalised; by name only"
    )
    requires = frozenset({"attentions"})
    in_default_run = False
    parameters = {"residual": 0.5}

    def validate(self) -> None:
        if not 0.0 <= self.params["residual"] < 1.0:
            raise UsageError(
                f"attention-flow:residual must be in [0, 1), got {self.params['residual']}"
            )

    def attribute(self, trace: Trace) -> Attribution:
        mask_BN = trace.mask_BN
        means = head_mean_attention(trace)
        matrices = [fixed_residual(w.double(), mask_BN, self.params["residual"]) for w in means]
        matrices_BLNN = torch.stack(matrices, dim=1).cpu().numpy()
        real_BN = mask_BN.bool().cpu().numpy()
        rows_BLN = np.zeros(matrices_BLNN.shape[:3])
        for b, target in enumerate(trace.target_positions_B.tolist()):
            real = np.flatnonzero(real_BN[b])
            matrices_LNN = matrices_BLNN[b][:, real][:, :, real]
            rows_BLN[b][:, real] = flow_rows(matrices_LNN, int(np.searchsorted(real, target)))
        rows = torch.from_numpy(rows_BLN).to(mask_BN.device, means[0].dtype)
        return Attribution(aggregated_BLN=rows)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [AttentionFlow()]
