"""Does a run's resident memory stay flat as the dataset grows? (issue 14)

Runs ``attrib-bench run`` in a fresh process per size on the first N SST-2 train sentences
(``/work/shared/data/sst2``, N = 1,000 / 5,000 / 20,000 by default) with the same methods and
evaluators, and reads each process's own peak resident set (its VmHWM at exit, through
benchmarks/ferret_speed.py's wrapper: a forked child's ``ru_maxrss`` starts at its parent's).
The batches are tokenised one at a time as the run reads them, per-example scores live in one
float array per (method, evaluator, kind) (``attrib_bench.runner.scores``), and the bootstrap
draws its resamples in bounded blocks (``attrib_bench.results.stats.resample_blocks``), so what
grows with N is the dataset's own rows and the per-example numbers the result holds.

    python benchmarks/memory_scaling.py [--sizes 1000,5000,20000] [--model DIR]
        [--methods attention,rollout,saliency] [--evaluators spearman,sufficiency:ratios=0.2]
        [--lengths 256,512 [--reviews 24]] [--output benchmarks/results/memory_scaling.json]

Long inputs (issue 29): ``--lengths`` runs, in a fresh process per length N instead of per size,
the first ``--reviews`` ERASER movie reviews (``/work/shared/data/eraser_movies``, val: all but a
few longer than 512 tokens) truncated to N tokens (``--max-length``), so the peak shows what a
pass of long inputs holds:

    python benchmarks/memory_scaling.py --lengths 256,512 --batch-size 8 \
        --methods saliency,integrated-gradients --evaluators loo-tau \
        --output benchmarks/results/memory_scaling_long.json

The model is the cached MiniLM SST-2 classifier of benchmarks/evaluators.py (fine-tuned on
first use). Writes the JSON and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluators import DATA, sst2_model  # the same cached SST-2 classifier
from ferret_speed import timed  # one fresh process: wall seconds and its own peak (VmHWM)

RESULTS = Path(__file__).resolve().parent / "results"


def markdown_lengths(report: dict[str, Any]) -> str:
    """The table of a ``--lengths`` run: one row per input length."""
    rows = report["rows"]
    lines = [
        "# Resident memory against input length (issue 29)",
        "",
        f"`{report['command']}`",
        "",
        f"Model: {report['model']}. Data: the first {rows[0]['examples']} ERASER movie reviews "
        f"(val) truncated to N tokens. Methods: {', '.join(report['methods'])}; evaluators: "
        f"{', '.join(report['evaluators'])}; batch size {report['batch_size']}, no cache, one "
        f"fresh process per N. Peak RSS: the process's own VmHWM at exit. Machine: "
        f"{report['machine']}.",
        "",
        "| tokens | peak RSS MB | wall s | s per example | load before | load after |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['tokens']} | {row['peak_rss_mb']:.0f} | {row['seconds']:.0f} | "
            f"{row['seconds'] / row['examples']:.2f} | {row['load_before'][0]:.2f} | "
            f"{row['load_after'][0]:.2f} |"
        )
    return "\n".join([*lines, ""])


def markdown(report: dict[str, Any]) -> str:
    if "tokens" in report["rows"][0]:
        return markdown_lengths(report)
    rows = report["rows"]
    first = rows[0]["peak_rss_mb"]
    lines = [
        "# Resident memory against dataset size (issue 14)",
        "",
        f"`{report['command']}`",
        "",
        f"Model: {report['model']}. Data: the first N SST-2 train sentences. Methods: "
        f"{', '.join(report['methods'])}; evaluators: {', '.join(report['evaluators'])}; "
        f"batch size {report['batch_size']}, no cache, one fresh process per N. Peak RSS: the "
        f"process's own VmHWM at exit. Machine: {report['machine']}.",
        "",
        "| examples | peak RSS MB | vs the first size | wall s | s per example | load before |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['examples']:,} | {row['peak_rss_mb']:.0f} | "
            f"{row['peak_rss_mb'] / first:.3f} | {row['seconds']:.0f} | "
            f"{row['seconds'] / row['examples']:.4f} | {row['load_before'][0]:.2f} |"
        )
    growth = rows[-1]["peak_rss_mb"] - first
    lines += [
        "",
        f"From {rows[0]['examples']:,} to {rows[-1]['examples']:,} examples the peak grows by "
        f"{growth:.0f} MB ({growth / first:.1%}); the result JSON of the largest run is "
        f"{rows[-1]['result_mb']:.1f} MB.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--model", help="a model directory (default: the cached SST-2 model)")
    parser.add_argument("--methods", default="attention,rollout,saliency")
    parser.add_argument("--evaluators", default="spearman,sufficiency:ratios=0.2")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lengths", help="input lengths of movie reviews, e.g. 256,512")
    parser.add_argument("--reviews", type=int, default=24, help="reviews per --lengths run")
    parser.add_argument("--output", type=Path, default=RESULTS / "memory_scaling.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = args.model or sst2_model("cpu")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "2")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        lengths = [int(n) for n in args.lengths.split(",")] if args.lengths else []
        runs = [(args.reviews, n) for n in lengths] or [
            (int(size), None) for size in args.sizes.split(",")
        ]
        for size, tokens in runs:
            output = Path(folder) / f"run-{size}-{tokens}.json"
            data = ["--dataset", str(DATA / "sst2"), "--split", "train"]
            if tokens is not None:
                data = ["--dataset", str(DATA / "eraser_movies"), "--split", "val",
                        "--max-length", str(tokens)]  # fmt: skip
            command = [
                sys.executable, "-m", "attrib_bench", "run", "--model", model,
                *data, "--limit", str(size),
                "--attributors", args.methods, "--evaluators", args.evaluators,
                "--reference", "saliency", "--batch-size", str(args.batch_size),
                "--device", "cpu", "--no-cache", "--no-floor", "--quiet",
                "--output", str(output),
            ]  # fmt: skip
            row = {"examples": size, **timed(command, env, Path(folder) / "stats.json")}
            if tokens is not None:
                row["tokens"] = tokens
            row["result_mb"] = round(output.stat().st_size / 2**20, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    report = {
        "command": "python benchmarks/memory_scaling.py " + " ".join(argv or sys.argv[1:]),
        "model": model,
        "methods": args.methods.split(","),
        "evaluators": args.evaluators.split(","),
        "batch_size": args.batch_size,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}, torch {version('torch')}",
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
