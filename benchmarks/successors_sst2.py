"""The successors of GlobEnc under DecompX's protocol: faithfulness of every method on SST-2 dev.

    python benchmarks/successors_sst2.py [--limit N] [--device cpu] [--methods a,b,...]
        [--name successors_sst2]

On MiniLM-L6 fine-tuned on 20,000 SST-2 train sentences (the model of
benchmarks/globenc_sst2.py and benchmarks/evaluators.py, one cache entry), all 872 dev
sentences, [MASK] removal of the top 10%, 20%, ..., 90% of each method's last aggregated row
(special tokens never removed), as DecompX (Modarressi et al. 2023) Table 1:

- AOPC comprehensiveness (the drop of the predicted class's probability; higher is better),
- sufficiency (its drop when only the top tokens are kept, DecompX's "PRED"; lower is better),
- the accuracy after removing the top tokens (DecompX's "ACC"; lower is better),

plus comprehensiveness at ALTI's (ERASER's) bins 1/5/10/20/50%, the protocol of ALTI's own
table (Ferrando et al. 2022, RoBERTa-base; there deletion, here [MASK]). Every old and new
method runs; ``random`` is the floor. Methods share one traced forward pass per batch and every
erasure's prediction is cached per example, so a rerun after adding a method costs that method.
Writes benchmarks/results/<name>.{json,md,png} (summaries only; ``--name``, default
successors_sst2) and prints the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the shared model and table helpers

from evaluators import DATA, RESULTS, cell, run, sst2_model

from attrib_bench.model.finetune import read_metadata
from attrib_bench.results import write_json
from attrib_bench.runner.state import RunConfig

ALTI_BINS = "comprehensiveness:ratios=0.01/0.05/0.1/0.2/0.5"
EVALUATORS = ["comprehensiveness", "sufficiency", "masked-accuracy", ALTI_BINS]
METHODS = [
    "decompx",
    "decompx:head=false",
    "alti",
    "value-zeroing",
    "globenc",
    "norm-res",
    "norm",
    "attention",
    "rollout",
    "integrated-gradients",
    "saliency",
    "gradient",
    "deeplift",
    "gradient-shap",
    "occlusion",
    "gae",
    "grad-sam",
    "attention-x-gradient",
    "attcat",
    "cp-lrp",
    "attnlrp",
    "smoothgrad",
    "vargrad",
    "atman",
    "discretized-integrated-gradients",
    "random",
]
#: By name only and too slow for all 872 sentences on a CPU (benchmarks/results/method_cost.md:
#: 160x to 800x a forward pass at n = 32; sequential IG: 50 steps per token); ``--methods``
#: runs them.
LEFT_OUT = [
    "attention-flow",
    "kernel-shap",
    "lime",
    "shapley-value-sampling",
    "sequential-integrated-gradients",
]
#: DecompX Table 1 (BERT-base, SST-2, [MASK] at 10%..90%): AOPC, by our method names.
DECOMPX_AOPC = {
    "decompx": 0.627,
    "alti": 0.416,
    "integrated-gradients": 0.340,
    "saliency": 0.310,
    "globenc": 0.307,
    "decompx:head=false": 0.288,
}
#: ALTI's table (RoBERTa-base, SST-2, deletion at 1/5/10/20/50%): comprehensiveness.
ALTI_COMPREHENSIVENESS = {
    "alti": 0.269,
    "integrated-gradients": 0.231,
    "gradient": 0.190,
    "rollout": 0.076,
}


def markdown(document: dict, accuracy: float | None, wall: float) -> str:
    methods = document["methods"]
    ok = [spec for spec in methods if methods[spec]["status"] == "ok"]

    def comprehensiveness(spec: str) -> float:
        mean = methods[spec]["scores"]["comprehensiveness"]["aggregated"][-1]["mean"]
        return -mean if mean is not None else 0.0

    examples = document["provenance"]["dataset"]["examples"]
    accuracy_text = f" (dev accuracy {accuracy:.3f})" if accuracy is not None else ""
    lines = [
        f"MiniLM-L6 fine-tuned on 20,000 SST-2 train sentences{accuracy_text}; {examples} SST-2 "
        "dev sentences; [MASK] replaces the top tokens of each method's last aggregated row "
        "(special tokens never removed); AOPC over 10%..90% for comprehensiveness (↑), "
        "sufficiency (↓) and the accuracy after removal (↓); comprehensiveness at ALTI's bins "
        "1/5/10/20/50% (↑); mean [95% bootstrap CI]. Published: DecompX Table 1 (BERT-base, "
        "AOPC) and ALTI's table (RoBERTa-base, deletion).",
        "",
        "| method | comprehensiveness ↑ | sufficiency ↓ | accuracy after removal ↓ "
        "| comprehensiveness, ALTI bins ↑ | DecompX AOPC (BERT-base) "
        "| ALTI comprehensiveness (RoBERTa-base) | s/ex | peak MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in sorted(ok, key=comprehensiveness):
        method = methods[spec]
        cells = [cell(document, spec, evaluator) for evaluator in EVALUATORS]
        cells += [
            f"{DECOMPX_AOPC[spec]:.3f}" if spec in DECOMPX_AOPC else "",
            f"{ALTI_COMPREHENSIVENESS[spec]:.3f}" if spec in ALTI_COMPREHENSIVENESS else "",
            f"{method['seconds_per_example']:.4f}",
            f"{method['peak_memory_mb']:.1f}",
        ]
        lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
    failed = [f"`{spec}`: {methods[spec].get('error')}" for spec in methods if spec not in ok]
    if failed:
        lines += ["", "Failed: " + "; ".join(failed)]
    left_out = [spec for spec in LEFT_OUT if spec not in methods]
    if left_out:
        lines += ["", "Not run (too slow for every sentence on a CPU): " + ", ".join(left_out)]
    lines += [
        "",
        f"Wall time {wall / 60:.1f} min on {os.cpu_count()} CPU cores "
        f"(torch threads {document['provenance']['hardware'].get('torch_threads', '?')}).",
    ]
    return "\n".join(lines) + "\n"


def plot(document: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = document["methods"]
    ok = [spec for spec in methods if methods[spec]["status"] == "ok"]
    rows = sorted(
        ok, key=lambda s: methods[s]["scores"]["comprehensiveness"]["aggregated"][-1]["mean"]
    )
    figure, axes = plt.subplots(1, 2, figsize=(12, 0.35 * len(rows) + 1.6), sharey=True)
    for axis, evaluator, title in (
        (axes[0], "comprehensiveness", "AOPC comprehensiveness ↑ (10%..90%)"),
        (axes[1], "sufficiency", "sufficiency ↓ (10%..90%)"),
    ):
        entries = [methods[s]["scores"][evaluator]["aggregated"][-1] for s in rows]
        means = [e["mean"] for e in entries]
        errors = [
            [m - e["ci95"][0] for m, e in zip(means, entries, strict=True)],
            [e["ci95"][1] - m for m, e in zip(means, entries, strict=True)],
        ]
        axis.barh(range(len(rows)), means, xerr=errors, color="tab:blue", alpha=0.7)
        axis.set_title(title, fontsize=10)
    published = [DECOMPX_AOPC.get(spec) for spec in rows]
    marked = [(i, p) for i, p in enumerate(published) if p is not None]
    axes[0].scatter(
        [p for _, p in marked],
        [i for i, _ in marked],
        marker="x",
        color="tab:red",
        label="DecompX Table 1 (BERT-base)",
        zorder=3,
    )
    axes[0].legend(fontsize=8, loc="lower right")
    axes[0].set_yticks(range(len(rows)), rows, fontsize=8)
    figure.suptitle("MiniLM-L6 on SST-2 dev, [MASK] removal")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="dev sentences (default: all 872)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--methods", help="comma-separated specs (default: all of METHODS)")
    parser.add_argument("--model", help="a classifier directory (default: the SST-2 fine-tune)")
    parser.add_argument("--name", default="successors_sst2", help="the results' file stem")
    args = parser.parse_args()
    start = time.perf_counter()
    model = args.model or sst2_model(args.device)
    document = run(
        RunConfig(
            model=model,
            dataset=str(DATA / "sst2"),
            split="dev",
            limit=args.limit,
            attributors=args.methods.split(",") if args.methods else METHODS,
            evaluators=EVALUATORS,
            device=args.device,
            batch_size=args.batch_size,
        )
    )
    wall = time.perf_counter() - start
    document.pop("cache", None)  # this machine's cache paths: not part of the measurement
    document["wall_seconds"] = round(wall, 1)
    accuracy = read_metadata(Path(model)).get("eval_accuracy")  # on all 872 dev sentences
    RESULTS.mkdir(exist_ok=True)
    write_json(document, RESULTS / f"{args.name}.json")
    text = markdown(document, accuracy, wall)
    (RESULTS / f"{args.name}.md").write_text(text)
    plot(document, RESULTS / f"{args.name}.png")
    print(text)


if __name__ == "__main__":
    main()
