"""Faithfulness (SST-2 dev) and plausibility (HateXplain val) leaderboards, every built-in method.

    python benchmarks/evaluators.py faithfulness [--model DIR] [--limit 300] [--device cpu]
    python benchmarks/evaluators.py plausibility [--model DIR] [--limit 400] [--device cpu]

``faithfulness``: the first ``--limit`` SST-2 dev sentences (../shared/data/sst2), scored by
comprehensiveness, sufficiency, deletion, insertion, log-odds and the accuracy after masking
([MASK] removal, DecompX's protocol), plus the model-randomisation sanity check on the first
``--sanity-limit`` of them. The model defaults to MiniLM-L6 fine-tuned on 20,000 SST-2 train
sentences exactly as benchmarks/globenc_sst2.py does (same cache entry).

``plausibility``: the first ``--limit`` HateXplain val posts (../shared/data/hatexplain_eraser),
scored against the union of the annotators' rationales by token F1, IOU F1 (ERASER's macro
figure, and the mean of per-post F1 beside it) and AUPRC. HateXplain ships no train split here,
model defaults to MiniLM-L6 fine-tuned on the test split (two epochs, seed 0, cached); val stays
unseen.

Methods: the twelve documented built-ins, Integrated Gradients at 20 steps (50 costs 2.5x the
time for rankings that barely move); ``random`` is the floor. Writes
benchmarks/results/evaluators_{sst2,hatexplain}.{json,md} (summaries only) and prints the tables.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from attrib_bench.core.registry import load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.finetune import FinetuneConfig, default_model_source, finetune
from attrib_bench.model.load import load_model
from attrib_bench.results import write_json
from attrib_bench.runner.engine import run_benchmark
from attrib_bench.runner.state import RunConfig

#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = load_registry().architecture_specs()

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RESULTS = Path(__file__).parent / "results"
IG = "integrated-gradients:steps=20"
METHODS = [
    "globenc",
    "norm-res",
    "norm",
    "norm-fixedres",
    "norm-resln",
    "attention-res",
    "attention",
    "rollout",
    "saliency",
    "gradient",
    IG,
    "random",
]
FAITHFULNESS = [
    "comprehensiveness",
    "sufficiency",
    "masked-accuracy",
    "deletion",
    "insertion",
    "log-odds",
]
PLAUSIBILITY = ["token-f1", "iou-f1", "iou-f1:part=instance-f1", "auprc"]
#: DecompX (Modarressi et al. 2023) Table 1, BERT-base on SST-2: AOPC of [MASK] removal.
DECOMPX_AOPC = {"globenc": 0.307, "saliency": 0.310, IG: 0.340}


def accuracy(model_dir: str, dataset: str, split: str, limit: int | None, device: str) -> float:
    """The model's accuracy on exactly the examples the leaderboard scores."""
    loaded = load_model(model_dir, device, architectures=ARCHITECTURES)
    data = load_examples(dataset, split, limit=limit)
    batches, _ = make_batches(data.examples, loaded.tokenizer, 64, loaded.max_length)
    correct = 0
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(loaded.device)
            predicted = loaded.model(**batch.model_inputs()).logits.argmax(-1)
            correct += int((predicted == batch.labels).sum())
    return correct / len(data.examples)


def cell(document: dict, spec: str, evaluator: str) -> str:
    summary = document["methods"][spec]["scores"].get(evaluator, {}).get("aggregated")
    if not summary or summary[-1]["mean"] is None:
        return "-"
    entry = summary[-1]
    low, high = entry["ci95"]
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None else ""
    return f"{entry['mean']:.3f}{interval}"


def arrow(document: dict, evaluator: str) -> str:
    return "↑" if document["evaluator_info"][evaluator]["higher_is_better"] else "↓"


def table(document: dict, evaluators: list[str], extra: dict[str, dict[str, str]]) -> list[str]:
    """Markdown rows: methods by the first evaluator (best first), then the cost columns."""
    first = evaluators[0]
    sign = 1 if document["evaluator_info"][first]["higher_is_better"] else -1

    def key(spec: str) -> float:
        mean = document["methods"][spec]["scores"][first]["aggregated"][-1]["mean"]
        return -sign * mean

    extra_names = list(next(iter(extra.values()), {}))
    header = [f"{e} {arrow(document, e)}" for e in evaluators] + extra_names
    lines = [
        "| method | " + " | ".join(header) + " | s/ex | peak MB |",
        "|---|" + "---|" * (len(header) + 2),
    ]
    for spec in sorted(document["methods"], key=key):
        method = document["methods"][spec]
        cells = [cell(document, spec, e) for e in evaluators]
        cells += [extra.get(spec, {}).get(name, "") for name in extra_names]
        cells += [f"{method['seconds_per_example']:.4f}", f"{method['peak_memory_mb']:.1f}"]
        lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
    return lines


def run(config: RunConfig) -> dict:
    document = run_benchmark(config)
    for method in document["methods"].values():  # summaries only: keep the files small
        method.pop("per_example")
    document.pop("example_ids")
    return document


def sst2_model(device: str) -> str:
    return str(
        finetune(
            FinetuneConfig(
                model=default_model_source(),
                dataset=str(DATA / "sst2"),
                split="train",
                limit=20000,
            ),
            device=device,
            architectures=ARCHITECTURES,
        )
    )


def hatexplain_model(device: str) -> str:
    return str(
        finetune(
            FinetuneConfig(
                model=default_model_source(),
                dataset=str(DATA / "hatexplain_eraser"),
                split="test",
                epochs=2,
            ),
            device=device,
            architectures=ARCHITECTURES,
        )
    )


def faithfulness(args: argparse.Namespace) -> str:
    model = args.model or sst2_model(args.device)
    dataset = str(DATA / "sst2")
    common = dict(model=model, dataset=dataset, split="dev", device=args.device, batch_size=32)
    document = run(
        RunConfig(**common, limit=args.limit, attributors=METHODS, evaluators=FAITHFULNESS)
    )
    sanity = run(
        RunConfig(**common, limit=args.sanity_limit, attributors=METHODS, evaluators=["sanity"])
    )
    document["sanity_run"] = sanity
    score = accuracy(model, dataset, "dev", args.limit, args.device)
    write_json(document, RESULTS / "evaluators_sst2.json")
    n = document["provenance"]["dataset"]["examples"]
    paper = {spec: {"DecompX AOPC (BERT-base)": f"{v:.3f}"} for spec, v in DECOMPX_AOPC.items()}
    lines = [
        f"MiniLM-L6 fine-tuned on 20,000 SST-2 train sentences; the first {n} SST-2 dev "
        f"sentences (accuracy {score:.3f} on them). Removal: [MASK]; comprehensiveness, "
        "sufficiency and masked accuracy over 10%..90%, deletion/insertion areas over "
        "0%..100%, log-odds at 20%; the last aggregated row of each method; mean [95% "
        "bootstrap CI].",
        "",
        *table(document, FAITHFULNESS, paper),
        "",
        f"Sanity check (cascading randomisation, first {args.sanity_limit} sentences): "
        "Spearman between the attribution on the trained model and after randomising the "
        "head (step 1), then also layers 6..1 (steps 2..7); lower is better.",
        "",
    ]
    steps = len(sanity["methods"]["random"]["scores"]["sanity"]["aggregated"])
    lines += [
        "| method | " + " | ".join(f"step {s}" for s in range(1, steps + 1)) + " |",
        "|---|" + "---|" * steps,
    ]
    for spec, method in sanity["methods"].items():
        row = method["scores"]["sanity"]["aggregated"]
        lines.append(f"| `{spec}` | " + " | ".join(f"{r['mean']:+.2f}" for r in row) + " |")
    return "\n".join(lines) + "\n"


def plausibility(args: argparse.Namespace) -> str:
    model = args.model or hatexplain_model(args.device)
    dataset = str(DATA / "hatexplain_eraser")
    document = run(
        RunConfig(
            model=model,
            dataset=dataset,
            split="val",
            limit=args.limit,
            attributors=METHODS,
            evaluators=PLAUSIBILITY,
            device=args.device,
            batch_size=32,
        )
    )
    score = accuracy(model, dataset, "val", args.limit, args.device)
    write_json(document, RESULTS / "evaluators_hatexplain.json")
    summary = document["methods"]["random"]["scores"]["auprc"]["aggregated"][-1]
    dataset_info = document["provenance"]["dataset"]
    lines = [
        f"MiniLM-L6 fine-tuned on the HateXplain test split (2 epochs); the first "
        f"{dataset_info['examples']} val posts (binary toxic/non-toxic accuracy {score:.3f}), "
        f"of which {summary['n']} toxic posts carry rationales ({summary['nan']} without are "
        "not scored). Word scores: the sum over a word's pieces; top-k with k = the number of "
        "rationale words; the last aggregated row of each method; mean [95% bootstrap CI]. "
        "iou-f1 is ERASER's macro IOU F1 (F1 of the mean precision and mean recall, CI by "
        "bootstrapping posts); iou-f1:part=instance-f1 the mean of per-post F1.",
        "",
        *table(document, PLAUSIBILITY, {}),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("faithfulness", "plausibility"))
    parser.add_argument("--model", help="classifier directory (default: fine-tuned, cached)")
    parser.add_argument("--limit", type=int, help="examples (default: 300 SST-2, 400 HateXplain)")
    parser.add_argument("--sanity-limit", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    os.environ.setdefault("ATTRIB_BENCH_NO_CACHE", "1")  # fresh timings, not cached results
    if args.part == "faithfulness":
        args.limit = args.limit or 300
        text = faithfulness(args)
        (RESULTS / "evaluators_sst2.md").write_text(text)
    else:
        args.limit = args.limit or 400
        text = plausibility(args)
        (RESULTS / "evaluators_hatexplain.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
