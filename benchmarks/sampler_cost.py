"""What measuring the CPU peak memory costs the method it measures (issue 14).

Integrated Gradients (50 steps, signed sum, word-embedding output: benchmarks/ferret_speed.py's
settings) over the first ``--limit`` SST-2 dev sentences in the runner's batches of 16, on the
cached MiniLM SST-2 classifier, in one process with the traces made once: each round runs IG
over every batch with no measurement, then under ``PeakMemory`` reading the kernel's reset
resident peak (the default on Linux), then under its fallback sampler (the resident set every
``SAMPLE_SECONDS``), alternating, so the three share the machine's load. The 2026-12-01 run of
this script, before the kernel's peak replaced the sampler (then malloc's bytes via mallinfo2),
measured 1.43x at 1 ms and 1.26x at 10 ms. Torch runs ``--threads`` threads.

    python benchmarks/sampler_cost.py [--limit 100] [--rounds 2] [--threads 2] [--model DIR]

Outputs: benchmarks/results/sampler_cost.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluators import DATA, sst2_model  # the same cached SST-2 classifier
from ferret_speed import METHODS  # the same IG settings

from attrib_bench.core.registry import Spec, load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.results import write_json
from attrib_bench.runner import memory
from attrib_bench_plugins.gradient import IntegratedGradients

#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = load_registry().architecture_specs()

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="classifier directory (default: fine-tuned, cached)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    loaded = load_model(args.model or sst2_model("cpu"), "cpu", architectures=ARCHITECTURES)
    examples = load_examples(str(DATA / "sst2"), "dev", limit=args.limit).examples
    batches, _ = make_batches(examples, loaded.tokenizer, 16, loaded.max_length)
    traces = [trace_batch(loaded, batch, set()) for batch in batches]
    spec = METHODS["integrated gradients"][0]
    method = IntegratedGradients().configure(dict(Spec.parse(spec).params))

    def run(source: str | None) -> float:
        began = time.perf_counter()
        for trace in traces:
            if source is None:
                method.attribute(trace)
                continue
            memory.CPU_SOURCE = source
            with memory.PeakMemory(torch.device("cpu")):
                method.attribute(trace)
        return time.perf_counter() - began

    default = memory.CPU_SOURCE
    settings = {
        "no measurement": None,
        f"PeakMemory ({default})": default,
        f"sampled resident set every {memory.SAMPLE_SECONDS * 1000:g} ms": "sampled-rss",
    }
    run(None)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, source in settings.items():
            seconds[name].append(run(source))
            print(f"{name}: {seconds[name][-1]:.1f} s", flush=True)
    memory.CPU_SOURCE = default
    command = "python benchmarks/sampler_cost.py " + " ".join(sys.argv[1:])
    result = {
        "examples": len(examples),
        "threads": args.threads,
        "seconds": seconds,
        "load_average_after": os.getloadavg(),
        "wall_seconds": time.perf_counter() - start,
        "command": command,
    }
    output = RESULTS / "sampler_cost.json"
    write_json(result, output)
    base = statistics.median(seconds["no measurement"])
    lines = [
        "# What measuring the CPU peak memory costs the method it measures",
        "",
        f"Integrated Gradients as in benchmarks/ferret_speed.py over the first {len(examples)} "
        f"SST-2 dev sentences (batches of 16), torch {args.threads} threads, one process, "
        f"rounds alternating; load average after: {result['load_average_after'][0]:.2f}.",
        "",
        "| setting | seconds per round | median / no measurement |",
        "|---|---|---|",
    ]
    for name, values in seconds.items():
        per_round = ", ".join(f"{v:.1f}" for v in values)
        lines.append(f"| {name} | {per_round} | {statistics.median(values) / base:.2f} |")
    lines += ["", f"`{command}`: {result['wall_seconds']:.0f} s.", ""]
    output.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
