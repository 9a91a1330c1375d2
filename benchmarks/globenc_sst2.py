"""Reproduce the GlobEnc comparison (Modarressi et al. 2022, Figure 3) with MiniLM on SST-2.

    python benchmarks/globenc_sst2.py [--train-limit 20000] [--epochs 1] [--device cpu]
        [--model SOURCE --label NAME --stem globenc_sst2]

1. Fine-tunes the MiniLM encoder (or ``--model``: any encoder source, such as the ONNX
   paraphrase-MiniLM-L3 package) on the first ``--train-limit`` SST-2 train sentences
   (``../shared/data/sst2``, seed 0; cached like ``attrib-bench finetune``) and reports dev
   accuracy.
2. Scores the eight variants against gradient x input saliency on all 872 dev sentences, per
   layer, with bootstrap CIs, plus the residual-ratio sweep r = 0.5 ... 0.99 for ``rollout`` and
   ``norm-fixedres`` (all from the same traced pass per batch).
3. Writes benchmarks/results/{--stem}.{json,md,png} (default globenc_sst2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attrib_bench.core.registry import load_registry
from attrib_bench.model.finetune import (
    FinetuneConfig,
    default_model_source,
    finetune,
    read_metadata,
)
from attrib_bench.results import write_json
from attrib_bench.runner.engine import run_benchmark
from attrib_bench.runner.state import RunConfig

#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = load_registry().architecture_specs()

SST2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2"
RESULTS = Path(__file__).parent / "results"
#: Our names, the paper's names, and the published BERT-base last-layer aggregated Spearman.
VARIANTS = [
    ("globenc", "N-Enc", 0.77),
    ("norm-res", "N-Res", 0.73),
    ("norm-fixedres", "N-FixedRes", 0.48),
    ("norm", "N", 0.44),
    ("attention-res", "W-Res", 0.19),
    ("attention", "W", -0.11),
    ("norm-resln", "N-ResLN", -0.21),
    ("rollout", "W-FixedRes", -0.24),
]
SWEEP = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]


def fmt(entry: dict) -> str:
    if entry["mean"] is None:
        return "n/a"
    low, high = entry["ci95"]
    return f"{entry['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


def markdown(document: dict, accuracy: float, train: int, label: str, epochs: int) -> str:
    methods = document["methods"]
    layers = len(methods["globenc"]["scores"]["spearman"]["aggregated"])
    dev = document["provenance"]["dataset"]["examples"]
    lines = [
        f"{label} fine-tuned on {train} SST-2 train sentences, {epochs} epoch(s) (dev accuracy "
        f"{accuracy:.3f}); "
        f"Spearman with gradient x input saliency on {dev} SST-2 dev sentences, "
        "mean [95% bootstrap CI].",
        "",
        "| ours | paper | aggregated, last layer | local, last layer | best aggregated (layer) "
        "| paper BERT-base |",
        "|---|---|---|---|---|---|",
    ]
    for name, paper, published in VARIANTS:
        scores = methods[name]["scores"]["spearman"]
        aggregated = scores["aggregated"]
        best = max(aggregated, key=lambda x: x["mean"] if x["mean"] is not None else -9)
        lines.append(
            f"| `{name}` | {paper} | {fmt(aggregated[-1])} | {fmt(scores['local'][-1])} | "
            f"{best['mean']:+.3f} ({best['layer']}) | {published:+.2f} |"
        )
    lines += [
        "",
        f"Per layer (aggregated, layers 1..{layers}):",
        "",
        "| method | " + " | ".join(f"L{i + 1}" for i in range(layers)) + " |",
        "|---|" + "---|" * layers,
    ]
    for name, _paper, _ in VARIANTS:
        row = methods[name]["scores"]["spearman"]["aggregated"]
        lines.append(f"| `{name}` | " + " | ".join(f"{x['mean']:+.3f}" for x in row) + " |")
    lines += [
        "",
        "Residual-ratio sweep (aggregated, last layer):",
        "",
        "| r | " + " | ".join(str(r) for r in SWEEP) + " |",
        "|---|" + "---|" * len(SWEEP),
    ]
    for base in ("rollout", "norm-fixedres"):
        cells = [
            methods[f"{base}:residual={r}"]["scores"]["spearman"]["aggregated"][-1] for r in SWEEP
        ]
        lines.append(f"| `{base}` | " + " | ".join(f"{c['mean']:+.3f}" for c in cells) + " |")
    seconds = {n: methods[n]["seconds_per_example"] for n, _, _ in VARIANTS}
    lines += [
        "",
        "Seconds per example, standalone (forward pass, own time, and the shared family "
        "intermediates each method reads): "
        + ", ".join(f"`{n}` {s:.4f}" for n, s in seconds.items()),
    ]
    return "\n".join(lines) + "\n"


def plot(document: dict, path: Path, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    for axis, kind in zip(axes, ("aggregated", "local"), strict=True):
        for name, paper, _ in VARIANTS:
            rows = document["methods"][name]["scores"]["spearman"][kind]
            layers = [r["layer"] for r in rows]
            means = [r["mean"] for r in rows]
            low = [r["ci95"][0] for r in rows]
            high = [r["ci95"][1] for r in rows]
            axis.plot(layers, means, marker="o", label=f"{paper} ({name})")
            axis.fill_between(layers, low, high, alpha=0.15)
        axis.axhline(0, color="grey", linewidth=0.6)
        axis.set_xlabel("layer")
        axis.set_title(f"{kind} rows")
    axes[0].set_ylabel("Spearman with gradient x input")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    figure.suptitle(f"{label} on SST-2 dev: attention-family agreement with saliency")
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-limit", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--limit", type=int, help="dev sentences (default: all 872)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", help="the encoder to fine-tune (default: MiniLM-L6)")
    parser.add_argument("--label", default="MiniLM-L6", help="the model's name in the report")
    parser.add_argument("--stem", default="globenc_sst2", help="the result files' name")
    args = parser.parse_args()
    model_dir = finetune(
        FinetuneConfig(
            model=args.model or default_model_source(),
            dataset=str(SST2),
            split="train",
            limit=args.train_limit,
            epochs=args.epochs,
        ),
        device=args.device,
        architectures=ARCHITECTURES,
    )
    metadata = read_metadata(model_dir)
    specs = [name for name, _, _ in VARIANTS] + [
        f"{base}:residual={r}" for base in ("rollout", "norm-fixedres") for r in SWEEP
    ]
    document = run_benchmark(
        RunConfig(
            model=str(model_dir),
            dataset=str(SST2),
            split="dev",
            limit=args.limit,
            attributors=specs,
            evaluators=["spearman"],
            reference="saliency",
            batch_size=args.batch_size,
            device=args.device,
        )
    )
    document["finetune"] = metadata
    RESULTS.mkdir(exist_ok=True)
    # Summaries only: the per-example scores of 22 methods would make the file megabytes.
    for method in document["methods"].values():
        method.pop("per_example")
    document.pop("example_ids")
    document.pop("cache", None)  # this machine's cache paths: not part of the measurement
    write_json(document, RESULTS / f"{args.stem}.json")
    text = markdown(
        document, metadata["eval_accuracy"], metadata["train_examples"], args.label, args.epochs
    )
    (RESULTS / f"{args.stem}.md").write_text(text)
    plot(document, RESULTS / f"{args.stem}.png", args.label)
    print(text)
    print(json.dumps({"model": str(model_dir), **metadata}, indent=1))


if __name__ == "__main__":
    main()
