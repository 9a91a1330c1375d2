"""Seconds per example of the robustness and infidelity evaluators, against the method's own
attribution of the same batch (issue 31, item 5).

    python benchmarks/robustness_cost.py [--limit 16] [--samples 10] [--device cpu]
        [--methods attention,saliency,integrated-gradients:steps=20] [--models tiny,default]

Models: ``tiny`` (attrib_bench.testing.conformance.save_tiny_model: 3 layers, hidden size 32)
and ``default`` (the embedded default, MiniLM-L6 fine-tuned on the generated data: cached, or
fine-tuned once). Data: the first ``--limit`` held-out sentences of the default dataset, one
batch. Per method: one ``trace_batch`` and ``attribute`` (the method's own cost), then each
evaluator's ``score`` on a fresh trace (nothing memoised carries over: sensitivity-avg and
local-lipschitz share sensitivity-max's re-attributions in a run, so they cost nothing more
there). Wall-clock seconds of one run each, divided by the examples; a shared CPU makes them
rough. Prints the tables and writes them to benchmarks/results/robustness_cost.md with the
machine's load.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import captum.metrics  # noqa: F401  # imported before the clock starts (infidelity's import)

from attrib_bench import EvalContext
from attrib_bench.core.registry import load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.finetune import ensure_default_model
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing.conformance import save_tiny_model

EVALUATORS = ("sensitivity-max", "local-lipschitz", "infidelity")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--methods", default="attention,saliency,integrated-gradients:steps=20")
    parser.add_argument("--models", default="tiny,default")
    args = parser.parse_args()
    registry = load_registry()
    architectures = registry.architecture_specs()
    data = load_examples("default", split="test", limit=args.limit)
    folders = {}
    lines: list[str] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            folders[name] = (
                save_tiny_model(Path(tmp), "bert")
                if name == "tiny"
                else ensure_default_model(args.device, quiet=True, architectures=architectures)
            )
        for name, folder in folders.items():
            loaded = load_model(str(folder), args.device, architectures=architectures)
            batches, _ = make_batches(data.examples, loaded.tokenizer, args.limit, 128)
            batch = batches[0].to(loaded.device)
            count = len(batch.examples)
            lines += [
                f"\n{name}: {count} examples, {batch.input_ids_BN.shape[1]} tokens padded",
                f"{'method':32} {'attribute':>10} " + " ".join(f"{e:>16}" for e in EVALUATORS),
            ]
            print("\n".join(lines[-2:]))
            for spec in args.methods.split(","):
                method = registry.attributor(spec)
                start = time.perf_counter()
                trace = trace_batch(loaded, batch, method.requires)
                attribution = method.attribute(trace)
                own = (time.perf_counter() - start) / count
                cells = []
                for evaluator_name in EVALUATORS:
                    samples = f"samples={args.samples}"
                    evaluator = registry.evaluator(f"{evaluator_name}:{samples}")
                    trace = trace_batch(loaded, batch, method.requires)
                    context = EvalContext(trace, None, 0, method)
                    start = time.perf_counter()
                    evaluator.score(attribution, context)
                    seconds = (time.perf_counter() - start) / count
                    cells.append(f"{seconds:8.3f} ({seconds / own:4.0f}x)")
                lines.append(f"{spec:32} {own:10.4f} " + " ".join(f"{c:>16}" for c in cells))
                print(lines[-1])
    header = (
        f"Seconds per example (and the ratio to the method's own attribution), samples="
        f"{args.samples}, device {args.device} ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores); 1-minute load average {load_before[0]:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after.\n\n```"
    )
    results = Path(__file__).parent / "results" / "robustness_cost.md"
    results.write_text(header + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
