"""attention-flow's max flows: the official code's algorithm (networkx's Edmonds-Karp, float64
capacities) against the plugin's (scipy's compiled Dinic on integer capacities), on the same
graphs, in one run.

Graphs: the default run's MiniLM classifier's residual-attention graphs (the plugin's own
matrices: head mean, 0.5 A + 0.5 I, rows normalised) of the first ``--examples`` long ERASER
movie reviews truncated to ``--length`` tokens, the [CLS] row as the source. Per example, both
algorithms solve the same L x n flows, in alternating order; the rows are compared.

    python benchmarks/attention_flow_algorithms.py [--examples 4] [--length 32] [--model DIR]

Writes benchmarks/results/attention_flow_algorithms.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from method_cost import machine, review_batch

from attrib_bench.core.registry import load_registry
from attrib_bench.model.trace import trace_batch
from attrib_bench.results import write_json
from attrib_bench.runner.engine import resolve_model
from attrib_bench.toolkit.aggregation import fixed_residual
from attrib_bench.toolkit.attention_family import head_mean_attention
from attrib_bench_plugins.attention_flow import AttentionFlow, flow_rows

#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = load_registry().architecture_specs()

RESULTS = Path(__file__).resolve().parent / "results"


def edmonds_karp_rows(matrices_LNN: np.ndarray, target: int) -> np.ndarray:
    """The official code's loop: one networkx maximum flow per (layer, token), Edmonds-Karp."""
    import networkx as nx
    from networkx.algorithms.flow import edmonds_karp

    layers, n, _ = matrices_LNN.shape
    graph = nx.DiGraph()
    for layer in range(1, layers + 1):
        for i in range(n):
            for j in range(n):
                capacity = float(matrices_LNN[layer - 1, i, j])
                if capacity > 0:
                    graph.add_edge((layer, i), (layer - 1, j), capacity=capacity)
    rows = np.array(
        [
            [
                nx.maximum_flow_value(graph, (layer, target), (0, j), flow_func=edmonds_karp)
                for j in range(n)
            ]
            for layer in range(1, layers + 1)
        ]
    )
    return rows / rows.sum(axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=4)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--model", help="default: the default run's MiniLM classifier")
    args = parser.parse_args()
    started = time.perf_counter()
    loaded = resolve_model(args.model, "cpu", architectures=ARCHITECTURES)
    info = machine(loaded.device)
    batch = review_batch(loaded, args.length, args.examples)
    trace = trace_batch(loaded, batch, AttentionFlow.requires)
    # The plugin's own matrices (AttentionFlow.attribute's), built once for both algorithms.
    means = head_mean_attention(trace)
    matrices_BLNN = torch.stack(
        [fixed_residual(w.double(), trace.mask_BN, 0.5) for w in means], dim=1
    ).numpy()
    rows = []
    for b, matrices_LNN in enumerate(matrices_BLNN):
        timings = {}
        order = [("official", edmonds_karp_rows), ("plugin", flow_rows)]
        for label, function in order if b % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            timings[label] = (function(matrices_LNN, 0), time.perf_counter() - start)
        difference = float(np.abs(timings["official"][0] - timings["plugin"][0]).max())
        rows.append(
            {
                "example": batch.examples[b].id,
                "official_s": timings["official"][1],
                "plugin_s": timings["plugin"][1],
                "ratio": timings["official"][1] / timings["plugin"][1],
                "max_abs_difference": difference,
            }
        )
        print(rows[-1], flush=True)
    info["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    command = "python benchmarks/attention_flow_algorithms.py " + " ".join(sys.argv[1:])
    summary = {
        "command": command.strip(),
        "machine": info,
        "length": args.length,
        "layers": int(matrices_BLNN.shape[1]),
        "rows": rows,
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "max_abs_difference": max(r["max_abs_difference"] for r in rows),
        "seconds": time.perf_counter() - started,
    }
    write_json(summary, RESULTS / "attention_flow_algorithms.json")
    lines = [
        "# attention-flow: Edmonds-Karp (the official code) against scipy's Dinic",
        "",
        f"`{summary['command']}`: MiniLM's {summary['layers']} layers, n = {args.length}, "
        f"{summary['layers'] * args.length} max flows per example, the [CLS] row; "
        f"{info['cpu']}, torch threads {info['torch_threads']}, load average before "
        f"{info['load_average_before']}, after {info['load_average_after']}; "
        f"{summary['seconds']:.0f} s in all.",
        "",
        "| example | networkx Edmonds-Karp s | scipy Dinic s | ratio | max abs difference |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {r['example']} | {r['official_s']:.2f} | {r['plugin_s']:.2f} | "
            f"{r['ratio']:.1f}x | {r['max_abs_difference']:.1e} |"
            for r in rows
        ),
        "",
        f"Median ratio **{summary['median_ratio']:.1f}x**; largest difference of any row entry "
        f"{summary['max_abs_difference']:.1e}.",
    ]
    (RESULTS / "attention_flow_algorithms.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
