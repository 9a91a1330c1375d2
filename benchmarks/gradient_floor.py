"""The gradient methods against their compute floor, and what measuring their memory costs them
(issue 14).

Gradient and gradient x input as in benchmarks/ferret_speed.py (word-embedding output, ferret's
reductions, the predicted class) over the first ``--limit`` SST-2 dev sentences in the runner's
length-sorted batches of ``--batch-size``, on the cached MiniLM SST-2 classifier, in one process.
Each round, in an order that rotates from round to round so the settings share the machine's
load, times:

- the floor: one forward and one backward pass per batch (``ferret_speed.Floor.gradient``; one
  such pass serves both methods), under sdpa attention, as the runner's trace runs when no
  method reads attention probabilities;
- the runner's own loop (``attrib_bench.runner.engine.attribution_stream``: the traced forward,
  both methods, each charged its standalone cost), as it runs (glibc's ``malloc_trim`` before
  the trace and each method, so that the kernel's peak sees memory an earlier block freed:
  attrib_bench.runner.memory), and with that trim left out, which shows what the pages it
  hands back cost when they are faulted in again.

A method's seconds are its standalone charge (the traced forward and the shared backward, as if
run alone), its peak memory the runner's. Torch runs ``--threads`` threads.

    python benchmarks/gradient_floor.py [--limit 100] [--batch-size 32] [--rounds 5]
        [--threads 2] [--model DIR]

Outputs: benchmarks/results/gradient_floor.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluators import DATA, sst2_model  # the same cached SST-2 classifier
from ferret_speed import METHODS, Floor  # the same settings, the same floor

from attrib_bench.results import write_json
from attrib_bench.runner import memory
from attrib_bench.runner.engine import attribution_stream, prepare
from attrib_bench.runner.state import MethodState, RunConfig

RESULTS = Path(__file__).resolve().parent / "results"
LABELS = ("gradient", "gradient x input")


#: The runner's peak-memory settings: what ``memory._TRIM`` is during the round.
SETTINGS: dict[str, Callable[[], None] | None] = {
    "runner (the trim before each trace and method: the default)": memory._TRIM,
    "runner, no trim": lambda: None,
}


def runner_round(prepared, trim: Callable[[], None] | None) -> dict:
    """Both methods through the runner's loop, ``trim`` standing in for glibc's: wall seconds,
    standalone seconds, peak MB."""
    methods = [
        MethodState(spec, prepared.registry.attributor(spec))
        for spec in (METHODS[label][0] for label in LABELS)
    ]
    default = memory._TRIM
    memory._TRIM = trim
    try:
        began = time.perf_counter()
        for _ in attribution_stream(prepared, methods, seed=0, quiet=True):
            pass
        wall = time.perf_counter() - began
    finally:
        memory._TRIM = default
    return {
        "wall_seconds": wall,
        "method_seconds": {label: m.seconds for label, m in zip(LABELS, methods, strict=True)},
        "peak_memory_mb": {
            label: m.peak_memory_mb for label, m in zip(LABELS, methods, strict=True)
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="classifier directory (default: fine-tuned, cached)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = args.model or sst2_model("cpu")
    floor = Floor(model, args.limit, args.batch_size, evaluators=None)
    config = RunConfig(
        model=model,
        dataset=str(DATA / "sst2"),
        split="dev",
        limit=args.limit,
        attributors=[METHODS[label][0] for label in LABELS],
        batch_size=args.batch_size,
        device="cpu",
    )
    prepared = prepare(config, quiet=True)

    def floor_round() -> float:
        began = time.perf_counter()
        for batch in floor.batches:
            floor.gradient(batch)
        return time.perf_counter() - began

    runner_round(prepared, memory._TRIM)  # warm-up
    names = ["floor", *SETTINGS]
    rounds: list[dict] = []
    for index in range(args.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        measured = {}
        for name in order:
            if name == "floor":
                measured[name] = {"wall_seconds": floor_round()}
            else:
                measured[name] = runner_round(prepared, SETTINGS[name])
            print(f"round {index + 1} {name}: {measured[name]['wall_seconds']:.2f} s", flush=True)
        rounds.append(measured)
    command = "python benchmarks/gradient_floor.py " + " ".join(sys.argv[1:])
    result = {
        "examples": args.limit,
        "batch_size": args.batch_size,
        "batch_shapes": [list(b.input_ids_BN.shape) for b in floor.batches],
        "threads": args.threads,
        "rounds": rounds,
        "load_average_after": os.getloadavg(),
        "wall_seconds": time.perf_counter() - start,
        "command": command,
    }
    output = RESULTS / "gradient_floor.json"
    write_json(result, output)
    output.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def markdown(result: dict) -> str:
    """The table: per setting, the seconds per round and their median ratio to the floor."""
    rounds = result["rounds"]
    floors = [r["floor"]["wall_seconds"] for r in rounds]
    shapes = ", ".join("x".join(map(str, s)) for s in result["batch_shapes"])
    lines = [
        "# The gradient methods against their compute floor",
        "",
        f"Gradient and gradient x input as in benchmarks/ferret_speed.py, the first "
        f"{result['examples']} SST-2 dev sentences in the runner's batches of "
        f"{result['batch_size']} (shapes {shapes}), torch {result['threads']} threads, one "
        f"process, {len(rounds)} rounds in rotating order; load average after: "
        f"{result['load_average_after'][0]:.2f}. Floor: one forward and one backward pass per "
        "batch, which serve both methods. A method's seconds: its standalone charge in the "
        "runner's loop (the traced forward and the shared backward); ratio: over the same "
        "round's floor. Without the trim a block reuses pages an earlier one freed unseen, so "
        "its peak is a lower bound.",
        "",
        "| setting | seconds per round | median ratio to the floor | peak MB (distinct values) |",
        "|---|---|---|---|",
        "| floor | " + ", ".join(f"{s:.2f}" for s in floors) + " | 1.00 | |",
    ]
    for name in SETTINGS:
        for label in LABELS:
            seconds = [r[name]["method_seconds"][label] for r in rounds]
            ratios = [s / f for s, f in zip(seconds, floors, strict=True)]
            peaks = {round(r[name]["peak_memory_mb"][label], 1) for r in rounds}
            lines.append(
                f"| {name}: {label} | "
                + ", ".join(f"{s:.2f}" for s in seconds)
                + f" | **{statistics.median(ratios):.2f}** | "
                + ", ".join(f"{p:g}" for p in sorted(peaks))
                + " |"
            )
    lines += ["", f"`{result['command']}`: {result['wall_seconds']:.0f} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
