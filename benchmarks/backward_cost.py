"""The single-backward methods and AtMan against their compute floors (issue 32, "Speed and
memory").

    python benchmarks/backward_cost.py [--limit 64] [--batch-size 16] [--rounds 5]

Model: MiniLM-L6 fine-tuned on 20,000 SST-2 train sentences (the cache entry
benchmarks/referee_sst2.py and benchmarks/evaluators.py use). Data: the first ``--limit`` SST-2
dev sentences in batches of ``--batch-size``. Each round, in an order that rotates from round to
round so the settings share the machine's load, times over all batches:

- the floors: one forward and one backward pass of the explained logit (the predicted class)
  with respect to the embedding output, under sdpa attention and under eager attention (the
  methods need the attention probabilities, which only eager attention materialises; the
  backward then also reaches them);
- each method as the runner runs it alone: ``trace_batch`` with its fields, then ``attribute``
  (the attention x gradient methods backpropagate through the traced pass, the LRP methods
  through the traced pass run under their rules);
- the three attention x gradient methods on one trace (one shared backward pass);
- AtMan's floor: per example, n + 1 forward passes of its unpadded input (no gradient), batched
  as ``atman`` batches them, under sdpa and under eager attention; and ``atman`` as the runner
  runs it (a traced pass that captures nothing, then ``attribute``).

Reports the median seconds over rounds and the ratios to each floor; writes
benchmarks/results/backward_cost.{json,md} with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from referee_sst2 import ARCHITECTURES, REGISTRY, TASKS, trained

from attrib_bench.core.attention_kernels import EAGER, FAST, attention_implementation
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.budget import per_pass

ATTENTION_GRADIENT = ("gae", "grad-sam", "attention-x-gradient")
METHODS = (*ATTENTION_GRADIENT, "cp-lrp", "attnlrp")
RESULTS = Path(__file__).parent / "results"


def floor(loaded, batches, implementation: str) -> None:
    """One forward pass with autograd and one backward pass of the predicted logits."""
    lookup = loaded.model.get_input_embeddings()
    for batch in batches:
        kept = []
        handle = lookup.register_forward_hook(
            lambda _m, _i, output, kept=kept: kept.append(output.requires_grad_())
        )
        try:
            with attention_implementation(loaded.model, implementation):
                logits = loaded.model(**batch.model_inputs()).logits
        finally:
            handle.remove()
        score = logits.gather(1, logits.argmax(dim=1, keepdim=True)).sum()
        torch.autograd.grad(score, kept[0])


def forward_copies(loaded, batches, implementation: str, chunk_tokens: int = 8192) -> None:
    """AtMan's floor: per example, n + 1 copies of its real tokens through the model, in passes
    of at most ``chunk_tokens`` tokens, without gradients."""
    with attention_implementation(loaded.model, implementation), torch.no_grad():
        for batch in batches:
            for row in range(batch.input_ids_BN.shape[0]):
                real_N = batch.attention_mask_BN[row].bool()
                ids_1N = batch.input_ids_BN[row : row + 1, real_N]
                n = ids_1N.shape[1]
                rows = per_pass(n + 1, n, chunk_tokens)
                for start in range(0, n + 1, rows):
                    copies = min(rows, n + 1 - start)
                    loaded.model(input_ids=ids_1N.expand(copies, -1))


def methods_alone(loaded, batches, names: tuple[str, ...]) -> None:
    attributors = [REGISTRY.attributor(name) for name in names]
    requires = frozenset().union(*(a.requires for a in attributors))
    for batch in batches:
        trace = trace_batch(loaded, batch, requires)
        for attributor in attributors:
            attributor.attribute(trace)
        trace.release_graph()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    load_before = os.getloadavg()
    model = trained(TASKS["sst2"].training, "cpu")
    loaded = load_model(model, "cpu", architectures=ARCHITECTURES)
    data = load_examples(TASKS["sst2"].training.dataset, "dev", limit=args.limit)
    batches, _ = make_batches(data.examples, loaded.tokenizer, args.batch_size, 128)
    settings: dict[str, Callable[[], None]] = {
        "floor (sdpa)": lambda: floor(loaded, batches, FAST),
        "floor (eager)": lambda: floor(loaded, batches, EAGER),
        **{name: (lambda name=name: methods_alone(loaded, batches, (name,))) for name in METHODS},
        "gae, grad-sam, attention-x-gradient on one trace": lambda: methods_alone(
            loaded, batches, ATTENTION_GRADIENT
        ),
        "n + 1 forward passes (sdpa)": lambda: forward_copies(loaded, batches, FAST),
        "n + 1 forward passes (eager)": lambda: forward_copies(loaded, batches, EAGER),
        "atman": lambda: methods_alone(loaded, batches, ("atman",)),
    }
    for run in settings.values():  # warm-up
        run()
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    names = list(settings)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            settings[name]()
            seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    document = {
        "examples": len(data.examples),
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "seconds": seconds,
        "median": median,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
    }
    lines = [
        f"MiniLM-L6 (SST-2), the first {len(data.examples)} SST-2 dev sentences in batches of "
        f"{args.batch_size}; median seconds of {args.rounds} rounds (rotating order) over all "
        f"batches; {document['machine']}; 1-minute load average {load_before[0]:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after.",
        "",
        "| setting | seconds | / floor (sdpa) | / floor (eager) |",
        "|---|---|---|---|",
    ]
    for name, value in median.items():
        if name == "n + 1 forward passes (sdpa)":
            lines += [
                "",
                "| setting | seconds | / n + 1 forwards (sdpa) | / n + 1 forwards (eager) |",
                "|---|---|---|---|",
            ]
        floors = ("floor (sdpa)", "floor (eager)")
        if name in ("n + 1 forward passes (sdpa)", "n + 1 forward passes (eager)", "atman"):
            floors = ("n + 1 forward passes (sdpa)", "n + 1 forward passes (eager)")
        lines.append(
            f"| {name} | {value:.3f} | {value / median[floors[0]]:.2f} | "
            f"{value / median[floors[1]]:.2f} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "backward_cost.json").write_text(json.dumps(document, indent=1) + "\n")
    (RESULTS / "backward_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
