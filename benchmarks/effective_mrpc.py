"""Effective vs raw attention on MRPC dev, and the cost of effective attention and HTA.

    python benchmarks/effective_mrpc.py [--model DIR] [--timing-limit 10]

1. Mean relative Frobenius difference ||A_eff - A|| / ||A|| per layer (all heads of each
   example), over MRPC dev sentence pairs longer than 32 tokens (MiniLM's head size).
2. Seconds per example of ``effective-attention``, ``hta:norm=sum`` and ``hta`` (Frobenius) on
   the first ``--timing-limit`` pairs, through ``run_benchmark`` (standalone cost).
Writes benchmarks/results/effective_mrpc.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from attrib_bench.core.registry import load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.runner.engine import run_benchmark
from attrib_bench.runner.state import RunConfig
from attrib_bench_plugins.effective import effective_attention

#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = load_registry().architecture_specs()

MRPC = Path(__file__).resolve().parents[2] / "shared" / "data" / "mrpc"
RESULTS = Path(__file__).parent / "results"


def relative_differences(model: str, device: str) -> dict:
    loaded = load_model(model, device, architectures=ARCHITECTURES)
    data = load_examples(str(MRPC), "dev")
    batches, _ = make_batches(data.examples, loaded.tokenizer, 16, 512)
    head_dim = loaded.model.config.hidden_size // loaded.model.config.num_attention_heads
    per_layer: list[list[float]] = []
    for batch in batches:
        trace = trace_batch(loaded, batch.to(loaded.device), {"attentions", "values"})
        for layer in range(trace.num_layers):
            effective = effective_attention(trace, layer)
            if len(per_layer) <= layer:
                per_layer.append([])
            for row, n in enumerate(batch.lengths):
                if n <= head_dim:
                    continue
                raw = trace.attentions[layer][row, :, :n, :n]
                gap = (effective[row, :, :n, :n] - raw).norm() / raw.norm()
                per_layer[layer].append(float(gap))
    return {
        "sentences_longer_than_head_dim": len(per_layer[0]),
        "head_dim": head_dim,
        "mean_relative_difference": [sum(v) / len(v) for v in per_layer],
        "min": [min(v) for v in per_layer],
        "max": [max(v) for v in per_layer],
    }


def timings(model: str, device: str, limit: int) -> dict:
    document = run_benchmark(
        RunConfig(
            model=model,
            dataset=str(MRPC),
            split="dev",
            limit=limit,
            attributors=["effective-attention", "hta:norm=sum", "hta", "attention"],
            evaluators=["spearman"],
            reference="hta",
            batch_size=8,
            device=device,
        ),
        quiet=True,
    )
    return {
        spec: {
            "seconds_per_example": method["seconds_per_example"],
            "spearman_vs_hta_by_layer": [
                round(x["mean"], 3) for x in method["scores"]["spearman"]["aggregated"]
            ],
        }
        for spec, method in document["methods"].items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="default: the embedded MiniLM classifier")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timing-limit", type=int, default=10)
    args = parser.parse_args()
    if args.model is None:
        from attrib_bench.model.finetune import ensure_default_model

        args.model = str(ensure_default_model(args.device, architectures=ARCHITECTURES))
    torch.manual_seed(0)
    report = {
        "model": args.model,
        "effective_vs_raw": relative_differences(args.model, args.device),
        "timing_examples": args.timing_limit,
        "methods": timings(args.model, args.device, args.timing_limit),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "effective_mrpc.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
