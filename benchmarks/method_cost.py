"""Seconds per example and peak memory of each method at n = 32, 128 and 512 tokens, against the
plain forward pass of the same batch (issue 13).

    python benchmarks/method_cost.py [--lengths 32,128,512] [--methods alti,decompx:head=false]
        [--device cpu|cuda] [--batch-size 4 | --batch-size 32=4,128=4,512=2] [--repeats 3]
        [--max-seconds 120] [--model DIR] [--output benchmarks/results/method_cost.json]

Inputs: ERASER movie reviews (``/work/shared/data/eraser_movies``, split ``val``, in file order,
those of at least 512 word pieces), truncated by the tokenizer to exactly n tokens ([CLS], n - 2
word pieces, [SEP]); the same reviews at every n, so no padding. Batch size: 4 at n <= 128 and 2
above, unless ``--batch-size`` says otherwise.

Per length: the plain forward pass (``model(**inputs)`` under no_grad, no extra outputs), then per
method what the runner does (runner/engine.py ``attribution_stream``): one ``trace_batch`` with the
fields the method requires, then ``attribute``, both timed, on a fresh trace each time (nothing
memoised carries over). Seconds are medians of ``--repeats`` runs after a warm-up; peak memory is
``attrib_bench.runner.memory.PeakMemory`` (CUDA's allocator peak, or on the CPU the kernel's
reset resident high-water mark, a sampled resident set where it cannot be reset) above the start:
the trace's own peak, and the attribute step's as the leaderboard counts it
(``standalone_megabytes``: its peak plus the trace fields it reads); a method's peak is the
larger of the two.

Each run starts with a plain forward pass of the same batch, and the ratio to the forward pass is
the median over runs of (trace + attribute) / that forward: on a shared CPU a burst of someone
else's work then slows numerator and denominator alike.

Budget: ``--max-seconds`` of wall time per method and length. A method first runs on one example
(the warm-up), aborted at the budget ("over budget": nothing measured). If the full measurement
(the batch, repeats + 1 times) does not fit what is left of the budget, or is cut off by it, that
one-example run is the measurement ("1 example"). Writes method_cost.json and method_cost.md beside
each other, and prints which methods cost under 10x a forward pass at n = 128.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

# torch's OpenMP threads spin while they wait; on cores other jobs share, the spinning thread
# starves the one it waits for (tests/conftest.py measured a tiny forward pass 200x slower at a
# load of 2 on 2 cores). Passive waiting changes no number, only how idle threads wait. Set
# before torch is imported; an OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from attrib_bench import UsageError
from attrib_bench.core.interfaces import Batch
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.registry import Registry, Spec, load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.trace import trace_batch
from attrib_bench.runner.engine import resolve_model
from attrib_bench.runner.memory import CPU_SOURCE, PeakMemory, standalone_megabytes

MOVIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "eraser_movies"
RESULTS = Path(__file__).parent / "results"
#: The new methods of issue 13, then reference rows from the families they join.
METHODS = (
    "alti",
    "decompx",
    "decompx:head=false",
    "value-zeroing",
    "attention-flow",
    "deeplift",
    "gradient-shap",
    "occlusion",
    "shapley-value-sampling",
    "kernel-shap",
    "lime",
    "attention",
    "rollout",
    "globenc",
    "saliency",
    "integrated-gradients",
)
#: The issue's rule: a method runs in the default leaderboard if it costs under this many forward
#: passes at n = 128.
DEFAULT_RUN_RATIO = 10.0
RULE_LENGTH = 128
#: Runs of the plain forward pass per batch: it is cheap and the denominator of every ratio, and
#: on a shared CPU a few runs can all land in someone else's burst.
FORWARD_REPEATS = 10


class OverBudget(BaseException):
    """Raised by the timer when one example runs past ``--max-seconds`` (a BaseException, so
    that no ``except Exception`` in a method or in Captum swallows it)."""


@dataclass
class Run:
    """One forward pass, trace and attribute of a batch: seconds, and megabytes when memory was
    measured."""

    forward_s: float
    trace_s: float
    attribute_s: float
    trace_mb: float | None = None
    attribute_mb: float | None = None


def sync(device: torch.device) -> None:
    """CUDA runs asynchronously: wait for it before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine(device: torch.device) -> dict[str, Any]:
    """What the numbers were measured on; the load average is taken again at the end."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if "model name" in line)
    except (OSError, StopIteration):
        pass
    info = {
        "device": str(device),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "torch": torch.__version__,
        "cpu_memory_source": CPU_SOURCE,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def batch_sizes(text: str | None, lengths: list[int]) -> dict[int, int]:
    """``--batch-size``: one size for every length, or ``n=size`` pairs (default 4, 2 above 128)."""
    sizes = {n: 4 if n <= 128 else 2 for n in lengths}
    if text is None:
        return sizes
    try:
        if "=" not in text:
            return dict.fromkeys(lengths, int(text)) if int(text) >= 1 else {}
        pairs = dict(item.split("=") for item in text.split(","))
        sizes.update({int(n): int(size) for n, size in pairs.items()})
    except ValueError:
        sizes = {}
    if not sizes or min(sizes.values()) < 1 or set(sizes) - set(lengths):
        raise UsageError(f"bad --batch-size {text!r}; write 4 or 32=4,128=4,512=2 (for --lengths)")
    return sizes


def review_batch(loaded: LoadedModel, n: int, size: int) -> Batch:
    """The first ``size`` long reviews, truncated to exactly n tokens, on the model's device."""
    limit = loaded.tokenizer.model_max_length
    if not 3 <= n <= min(limit, 512):
        raise UsageError(f"length {n} out of range; choose 3..{min(limit, 512)}")
    reviews = load_examples(str(MOVIES), "val").examples
    long = [e for e in reviews if len(loaded.tokenizer(e.text)["input_ids"]) >= 512][:size]
    if len(long) < size:
        raise UsageError(f"only {len(long)} reviews of >= 512 tokens; use a smaller --batch-size")
    batches, _ = make_batches(long, loaded.tokenizer, size, n)
    batch = batches[0].to(loaded.device)
    assert batch.input_ids_BN.shape == (size, n) and bool(batch.attention_mask_BN.all())
    return batch


def forward_seconds(loaded: LoadedModel, batch: Batch) -> float:
    """One plain forward pass: the logits only, under no_grad."""
    start = time.perf_counter()
    with torch.no_grad():
        loaded.model(**batch.model_inputs())
    sync(loaded.device)
    return time.perf_counter() - start


def plain_forward(loaded: LoadedModel, batch: Batch) -> dict[str, float]:
    """Median seconds per example and peak MB of the plain forward pass, after a warm-up."""
    forward_seconds(loaded, batch)
    with PeakMemory(loaded.device) as peak:
        forward_seconds(loaded, batch)
    seconds = statistics.median(forward_seconds(loaded, batch) for _ in range(FORWARD_REPEATS))
    return {"s_per_example": seconds / len(batch.examples), "peak_mb": peak.megabytes}


def run_once(
    loaded: LoadedModel, registry: Registry, attributor: Any, batch: Batch, memory: bool
) -> Run:
    """A plain forward pass (the paired denominator), then trace and attribute as the runner
    does for one method alone on a batch; memory only when asked (timed runs go without
    PeakMemory, whose fallback sampler thread takes CPU time)."""
    forward_s = forward_seconds(loaded, batch)
    fields = registry.trace_field_specs()
    with PeakMemory(loaded.device) if memory else nullcontext() as trace_peak:
        start = time.perf_counter()
        trace = trace_batch(loaded, batch, attributor.requires, 0, fields)
        sync(loaded.device)
        trace_s = time.perf_counter() - start
    _ = trace.target_foils_B  # as the runner: the target classes, before any method
    trace.accessed = set()
    with PeakMemory(loaded.device) if memory else nullcontext() as attribute_peak:
        start = time.perf_counter()
        attributor.attribute(trace)
        sync(loaded.device)
        attribute_s = time.perf_counter() - start
    if not memory:
        return Run(forward_s, trace_s, attribute_s)
    attribute_mb = standalone_megabytes(trace, attributor.requires, attribute_peak.megabytes, set())
    return Run(forward_s, trace_s, attribute_s, trace_peak.megabytes, attribute_mb)


def _alarm(_signum: int, _frame: Any) -> None:
    raise OverBudget


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise OverBudget in the block after ``seconds`` of wall time."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def measure(
    loaded: LoadedModel,
    registry: Registry,
    attributor: Any,
    batch: Batch,
    single: Batch,
    repeats: int,
    budget: float,
) -> dict[str, Any]:
    """A method's row at one length, within ``budget`` seconds (see the module docstring)."""
    size, start = len(batch.examples), time.perf_counter()
    status = None
    try:
        with time_limit(budget):
            runs = [run_once(loaded, registry, attributor, single, memory=True)]
            memory, status, examples = runs[0], "1 example", 1
            left = budget - (time.perf_counter() - start)
            if (runs[0].trace_s + runs[0].attribute_s) * size * (repeats + 1) < left:
                rerun = partial(run_once, loaded, registry, attributor, batch)
                with_memory = rerun(memory=True)
                timed = [rerun(memory=False) for _ in range(repeats)]
                runs, memory, status, examples = timed, with_memory, "ok", size
    except OverBudget:  # in the one-example run: nothing measured; later: that run stands
        if status is None:
            return {"status": "over budget", "examples": 1, "repeats": 0}
    return {
        "status": status,
        "examples": examples,
        "repeats": len(runs),
        "trace_s_per_example": statistics.median(r.trace_s for r in runs) / examples,
        "attribute_s_per_example": statistics.median(r.attribute_s for r in runs) / examples,
        "paired_forward_s_per_example": statistics.median(r.forward_s for r in runs) / examples,
        "ratio_to_forward": statistics.median(
            (r.trace_s + r.attribute_s) / r.forward_s for r in runs
        ),
        "trace_peak_mb": memory.trace_mb,
        "attribute_peak_mb": memory.attribute_mb,
        "peak_mb": max(memory.trace_mb, memory.attribute_mb),
    }


def compare(row: dict[str, Any], forward: dict[str, float]) -> dict[str, Any]:
    """The row's peak against the plain forward pass of a batch of the same size."""
    row["forward_s_per_example"] = forward["s_per_example"]
    row["forward_peak_mb"] = forward["peak_mb"]
    if "peak_mb" in row:
        row["peak_ratio"] = row["peak_mb"] / forward["peak_mb"] if forward["peak_mb"] else None
    return row


def benchmark(
    args: argparse.Namespace,
    registry: Registry,
    loaded: LoadedModel,
    save: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Every method at every length; ``save`` gets the results so far after each row (a long
    run cut short keeps what it measured)."""
    attributors, skipped = {}, {}
    for spec in args.methods:
        name = Spec.parse(spec).name
        if name not in registry.attributors:
            skipped[spec] = "not registered"
        elif (problem := loaded.unmet_needs(attributor := registry.attributor(spec))) is not None:
            skipped[spec] = problem
        else:
            attributors[spec] = attributor
    for spec, why in skipped.items():
        print(f"note: skipping {spec}: {why}", flush=True)
    results: dict[str, Any] = {"forward": {}, "rows": [], "skipped": skipped}
    for n in args.lengths:
        batch = review_batch(loaded, n, args.batch_size[n])
        single = review_batch(loaded, n, 1)
        forward = {1: plain_forward(loaded, single)}
        if len(batch.examples) > 1:
            forward[len(batch.examples)] = plain_forward(loaded, batch)
        results["forward"][str(n)] = {str(size): value for size, value in forward.items()}
        print(f"n={n} forward: {forward}", flush=True)
        for spec, attributor in attributors.items():
            torch.manual_seed(0)
            load, start = round(os.getloadavg()[0], 2), time.perf_counter()
            try:
                row = measure(
                    loaded, registry, attributor, batch, single, args.repeats, args.max_seconds
                )
            except UsageError:
                raise
            except Exception as error:  # one method failing must not sink the benchmark
                row = {"status": f"failed: {type(error).__name__}: {error}", "examples": 0}
            row = {"method": spec, "n": n, "batch_size": len(batch.examples), "load": load, **row}
            results["rows"].append(compare(row, forward[row["examples"] or 1]))
            print(f"{_line(row)}  [{time.perf_counter() - start:.0f} s]", flush=True)
            save(results)
    return results


def _number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['method']:<24} n={row['n']:<4} trace {_number(row.get('trace_s_per_example'))} s/ex"
        f"  attribute {_number(row.get('attribute_s_per_example'))} s/ex"
        f"  x{_number(row.get('ratio_to_forward'), 3)} forward"
        f"  peak {_number(row.get('peak_mb'), 4)} MB ({row['status']})"
    )


def under_rule(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Methods under and at-or-over 10x a forward pass at n = 128 (the default-run rule)."""
    measured = [r for r in rows if r["n"] == RULE_LENGTH]
    under = [r["method"] for r in measured if r.get("ratio_to_forward", 1e9) < DEFAULT_RUN_RATIO]
    over = [r["method"] for r in measured if r["method"] not in under]
    return {"under": under, "not_under": over}


def markdown(report: dict[str, Any]) -> str:
    info = report["machine"]
    cuda = info["device"].startswith("cuda")
    cpu_sources = {"vmhwm": "resident peak (VmHWM, reset)", "malloc": "sampled malloc'd bytes"}
    cpu = cpu_sources.get(info["cpu_memory_source"], info["cpu_memory_source"])
    source = "CUDA max_memory_allocated" if cuda else cpu
    lines = [
        "# Method cost against the plain forward pass (issue 13)",
        "",
        f"`{report['command']}`",
        "",
        f"Model: {report['model']}. Inputs: {report['inputs']}. Device: {info['device']}"
        f" ({info.get('gpu', info['cpu'])}, {info['cores']} cores, {info['torch_threads']}"
        f" torch threads, torch {info['torch']}); load average before"
        f" {info['load_average_before']}, after {info['load_average_after']}. Seconds are"
        f" medians of {report['repeats']} runs after a warm-up ({FORWARD_REPEATS} for the forward"
        " pass); peak MB is"
        f" {source} above the start (the larger of the trace's and the attribute"
        " step's, which counts the trace fields it reads), against the plain forward pass of a"
        " batch of the same size. The time ratio is the median over runs of (trace + attribute) /"
        ' a plain forward pass run just before. "1 example": measured once on one example (the'
        f' batch would exceed {report["max_seconds"]:g} s); "over budget": one example did not'
        f" finish in {report['max_seconds']:g} s. Load: the 1-minute load average as the row"
        " started (the machine is shared).",
        "",
        "| n | batch | forward s/ex | forward peak MB | batch 1: s/ex | batch 1: peak MB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, forward in report["forward"].items():
        size = max(forward, key=int)
        lines.append(
            f"| {n} | {size} | {_number(forward[size]['s_per_example'])}"
            f" | {_number(forward[size]['peak_mb'])} | {_number(forward['1']['s_per_example'])}"
            f" | {_number(forward['1']['peak_mb'])} |"
        )
    lines += [
        "",
        "| method | n | trace s/ex | attribute s/ex | (trace + attribute) / forward | peak MB"
        " | peak / forward's | status | load |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['method']} | {row['n']} | {_number(row.get('trace_s_per_example'))}"
            f" | {_number(row.get('attribute_s_per_example'))}"
            f" | {_number(row.get('ratio_to_forward'), 3)} | {_number(row.get('peak_mb'))}"
            f" | {_number(row.get('peak_ratio'), 3)} | {row['status']} | {row['load']} |"
        )
    rule = report["default_run_rule"]
    lines += [
        "",
        f"Under {DEFAULT_RUN_RATIO:g}x a forward pass at n = {RULE_LENGTH} (the default-run rule):"
        f" {', '.join(rule['under']) or 'none'}."
        f" Not under: {', '.join(rule['not_under']) or 'none'}.",
    ]
    if not report["complete"]:
        lines += [
            "",
            f"Incomplete: the run stopped (or is still going) after {len(report['rows'])} rows.",
        ]
    if report["skipped"]:
        skipped = "; ".join(f"{spec} ({why})" for spec, why in report["skipped"].items())
        lines += ["", f"Skipped: {skipped}."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="default: the default run's MiniLM classifier")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda")
    parser.add_argument("--lengths", default="32,128,512")
    parser.add_argument("--methods", default=",".join(METHODS), help="specs, name:key=value")
    parser.add_argument("--batch-size", help="4, or 32=4,128=4,512=2 (the default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="per method and length")
    parser.add_argument("--output", type=Path, default=RESULTS / "method_cost.json")
    args = parser.parse_args(argv)
    args.command = " ".join(["python benchmarks/method_cost.py", *(argv or sys.argv[1:])])
    try:
        args.lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        raise UsageError(f"bad --lengths {args.lengths!r}; write e.g. 32,128,512") from None
    args.methods = _methods(args.methods)
    args.batch_size = batch_sizes(args.batch_size, args.lengths)
    if args.repeats < 1 or args.max_seconds <= 0 or (args.threads or 1) < 1:
        raise UsageError("--repeats and --threads must be >= 1 and --max-seconds > 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but torch sees no CUDA device")
    return args


def _methods(text: str) -> list[str]:
    """Specs split on commas that start a new method (``decompx:head=false,alti``)."""
    specs: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" in part and ":" not in part and specs:
            specs[-1] += "," + part
        else:
            specs.append(part)
    if not specs:
        raise UsageError("--methods is empty; leave it out for every method")
    return [str(Spec.parse(spec)) for spec in specs]


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        registry = load_registry()
        architectures = registry.architecture_specs()
        loaded = resolve_model(args.model, args.device, True, architectures=architectures)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    info, start = machine(loaded.device), time.perf_counter()

    def save(results: dict[str, Any], complete: bool = False) -> None:
        info["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        report = {
            "command": args.command,
            "complete": complete,
            "model": loaded.name,
            "inputs": f"ERASER movie reviews ({MOVIES.name}/val, >= 512 tokens) truncated to n"
            " tokens",
            "batch_sizes": {str(n): size for n, size in args.batch_size.items()},
            "repeats": args.repeats,
            "max_seconds": args.max_seconds,
            "machine": info,
            "wall_seconds": round(time.perf_counter() - start, 1),
            **_rounded(results),
            "default_run_rule": under_rule(results["rows"]),
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
        args.output.with_suffix(".md").write_text(markdown(report))

    try:
        results = benchmark(args, registry, loaded, save)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    save(results, complete=True)
    rule = under_rule(results["rows"])
    if any(r["n"] == RULE_LENGTH for r in results["rows"]):
        print(f"under {DEFAULT_RUN_RATIO:g}x a forward pass at n = {RULE_LENGTH}: {rule['under']}")
        print(f"not under: {rule['not_under']}")
    print(f"wrote {args.output} and {args.output.with_suffix('.md')}")
    return 0


def _rounded(value: Any) -> Any:
    """Floats to 4 significant digits, in nested dicts and lists (the JSON stays readable)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
