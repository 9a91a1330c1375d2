"""Which faithfulness numbers to believe on MiniLM, SST-2 and HateXplain: the evaluators judged.

    python benchmarks/referee_sst2.py [--dataset sst2|hatexplain] [--limit 64]
        [--max-tokens 10] [--masking 0.1] [--device cpu]

1. Model: MiniLM-L6 fine-tuned on 20,000 SST-2 train sentences (``sst2``, the same cache
   entry as benchmarks/evaluators.py) or on the HateXplain test split (``hatexplain``, 2
   epochs, as benchmarks/evaluators.py's plausibility part); and its masked fine-tune on the
   same data (``finetune --masking``, share ``--masking``), the in-distribution scorer.
2. Data: the first ``--limit`` SST-2 dev sentences or HateXplain val posts (../shared/data) of
   at most ``--max-tokens`` word pieces, written to a temporary folder, so that Normalized
   AOPC's bounds are exact (the paper's exact setting is its short inputs too).
3. One run: the default methods plus DecompX and Integrated Gradients (20 steps), scored by
   every faithfulness evaluator as it is, by comprehensiveness and sufficiency normalised
   (``normalise=naopc``) over the default ratios and over every k (``ratios=all``, the paper's
   AOPC), and by every evaluator that takes ``scorer=`` with the masked fine-tune.
4. The meta-evaluation (``attrib_bench.meta``) of the same evaluators, on the synthetic
   bag-of-tokens model and on this model, base ``saliency``.
5. Writes benchmarks/results/referee_{sst2,hatexplain}.{json,md}: the leaderboards, which
   method rankings normalisation changes (Kendall tau of the rankings, each method's move), the
   meta-evaluation and the evaluator agreement matrix.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import attrib_bench
from attrib_bench.core.plugin_info import evaluator_info
from attrib_bench.core.registry import load_registry
from attrib_bench.model.finetune import (
    METADATA_FILE,
    FinetuneConfig,
    default_model_source,
    finetune,
)
from attrib_bench.model.load import load_model

REGISTRY = load_registry()
ARCHITECTURES = REGISTRY.architecture_specs()
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RESULTS = Path(__file__).parent / "results"
EXTRA_METHODS = ["decompx", "integrated-gradients:steps=20"]
#: The AOPC evaluators Normalized AOPC applies to, each also over every k (the paper's AOPC).
AOPC = ["comprehensiveness", "sufficiency"]
NAOPC = [f"{e}:normalise=naopc" for e in AOPC]
ALL_STEPS = [f"{e}:ratios=all" for e in AOPC] + [f"{e}:ratios=all,normalise=naopc" for e in AOPC]


@dataclass(frozen=True)
class Task:
    """A dataset the referee runs on: how its model is fine-tuned, and how its short examples
    are written to a temporary folder (returning the dataset path and how many were read)."""

    name: str
    training: FinetuneConfig
    model_text: str
    data_text: str
    short_examples: Callable[[object, int, int, Path], tuple[Path, int]]


def sst2_sentences(tokenizer, limit: int, max_tokens: int, folder: Path) -> tuple[Path, int]:
    """The first ``limit`` dev sentences of at most ``max_tokens`` word pieces, as a TSV."""
    kept, read = [], 0
    with open(DATA / "sst2" / "dev.tsv", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            read += 1
            if len(tokenizer.tokenize(row["sentence"])) <= max_tokens:
                kept.append(row)
            if len(kept) == limit:
                break
    path = folder / "dev.tsv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["sentence", "label"], delimiter="\t")
        writer.writeheader()
        writer.writerows({"sentence": r["sentence"], "label": r["label"]} for r in kept)
    return path, read


def hatexplain_posts(tokenizer, limit: int, max_tokens: int, folder: Path) -> tuple[Path, int]:
    """The first ``limit`` val posts of at most ``max_tokens`` word pieces, as an ERASER folder
    (their annotation lines and documents, unchanged)."""
    source = DATA / "hatexplain_eraser"
    with open(source / "docs.jsonl") as handle:
        documents = {r["docid"]: r for r in map(json.loads, handle)}
    kept, read = [], 0
    with open(source / "val.jsonl") as handle:
        for line in handle:
            read += 1
            post = json.loads(line)
            text = documents[post["annotation_id"]]["document"]
            if len(tokenizer.tokenize(text)) <= max_tokens:
                kept.append(post)
            if len(kept) == limit:
                break
    target = folder / "hatexplain"
    target.mkdir()
    (target / "val.jsonl").write_text("".join(json.dumps(p) + "\n" for p in kept))
    lines = [json.dumps(documents[p["annotation_id"]]) + "\n" for p in kept]
    (target / "docs.jsonl").write_text("".join(lines))
    return target, read


TASKS = {
    "sst2": Task(
        "sst2",
        FinetuneConfig(
            model=default_model_source(), dataset=str(DATA / "sst2"), split="train", limit=20000
        ),
        "MiniLM-L6 fine-tuned on 20,000 SST-2 train sentences",
        "SST-2 dev sentences",
        sst2_sentences,
    ),
    "hatexplain": Task(
        "hatexplain",
        FinetuneConfig(
            model=default_model_source(),
            dataset=str(DATA / "hatexplain_eraser"),
            split="test",
            epochs=2,
        ),
        "MiniLM-L6 fine-tuned on the HateXplain test split (2 epochs, toxic/non-toxic)",
        "HateXplain val posts",
        hatexplain_posts,
    ),
}


def trained(config: FinetuneConfig, device: str) -> str:
    return str(finetune(config, device=device, architectures=ARCHITECTURES))


def scorer_summary(scorer: str | None) -> dict | None:
    """The masked fine-tune's share erased and its held-out accuracy beside the model's."""
    if scorer is None:
        return None
    metadata = json.loads((Path(scorer) / METADATA_FILE).read_text())
    keys = ("eval_split", "original_eval_accuracy", "eval_accuracy")
    return {"masking": metadata["config"]["masking"], **{k: metadata.get(k) for k in keys}}


def faithfulness_evaluators(scorer: str | None) -> tuple[list[str], list[str]]:
    """Every built-in faithfulness evaluator as it is, and (with a scorer, where an evaluator
    takes one) its in-distribution form."""
    raw, scored = [], []
    for name, registered in REGISTRY.evaluators.items():
        info = evaluator_info(registered.obj)
        if info.family != "faithfulness" or not registered.shipped:
            continue
        raw.append(name)
        if scorer is not None and "scorer" in registered.obj.parameters:
            scored.append(f"{name}:scorer={scorer}")
    return raw, scored


def summaries(document: dict) -> dict:
    """The run without its per-example values, its paired comparisons and its agreement
    between methods (the tables here do not read them): the committed file stays small."""
    for method in document["methods"].values():
        method.pop("per_example", None)
    for key in ("example_ids", "paired", "agreement"):
        document.pop(key, None)
    return document


def label(spec: str) -> str:
    """An evaluator's spec as the tables show it: the scorer's cache path as ``masked``."""
    name, _, params = spec.partition(":")
    shown = [
        "scorer=masked" if part.startswith("scorer=") else part
        for part in params.split(",")
        if part
    ]
    return ":".join([name, ",".join(shown)]) if shown else name


def fmt(score) -> str:
    if score.mean != score.mean:  # NaN
        return "-"
    return f"{score.mean:.3f} [{score.ci95[0]:.3f}, {score.ci95[1]:.3f}]"


def ranking(result, evaluator: str) -> list[str]:
    """The methods best first under ``evaluator`` (its direction)."""
    sign = 1 if result.evaluator_info[evaluator]["higher_is_better"] else -1
    specs = [s for s, m in result.methods.items() if evaluator in m.scores]
    return sorted(specs, key=lambda s: -sign * result.methods[s].score(evaluator).mean)


def markdown(document: dict, result, meta, raw: list[str], scored: list[str]) -> str:
    data = document["data"]
    lines = [
        f"{document['model']}; the first {data['examples']} {data['name']} of at most "
        f"{data['max_tokens']} word pieces ({data['read']} read to find them), so every "
        "Normalized AOPC bound is exact. Removal: [MASK]; the last "
        "aggregated row of each method; mean [95% bootstrap CI]. Run "
        f"{document['seconds']['run']:.0f} s, meta-evaluation {document['seconds']['meta']:.0f} "
        f"s (2-core CPU; 1-minute load average {document['load_average']['before'][0]:.1f} "
        f"before, {document['load_average']['after'][0]:.1f} after).",
        *scorer_line(document["scorer"]),
        "",
        "## Leaderboards",
        "",
    ]
    columns = [*raw, *NAOPC, *ALL_STEPS, *scored]
    lines += [
        "| method | " + " | ".join(f"`{label(c)}`" for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for spec in ranking(result, "comprehensiveness"):
        method = result.methods[spec]
        cells = [fmt(method.score(c)) if c in method.scores else "-" for c in columns]
        lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
    agreement = result.evaluator_agreement
    lines += [
        "",
        "## What normalisation changes",
        "",
        "Kendall tau-b between the method rankings of an evaluator and of its normalised form "
        "(1: the same order), with its 95% bootstrap CI over examples, and each method's rank "
        "before and after.",
        "",
        "| pair | tau [95% CI] | methods | rank moves (raw -> normalised) |",
        "|---|---|---|---|",
    ]
    pairs = list(zip(AOPC, NAOPC, strict=True)) + list(
        zip(ALL_STEPS[:2], ALL_STEPS[2:], strict=True)
    )
    for a, b in pairs:
        found = agreement.pair("aggregated", a, b) if agreement else None
        before, after = ranking(result, a), ranking(result, b)
        moves = [
            f"`{s}` {before.index(s) + 1}->{after.index(s) + 1}"
            for s in before
            if s in after and before.index(s) != after.index(s)
        ]
        tau = (
            "-"
            if found is None
            else f"{found.tau:+.2f} [{found.ci95[0]:+.2f}, {found.ci95[1]:+.2f}]"
        )
        count = "-" if found is None else str(found.methods)
        lines.append(f"| `{a}` vs `{b}` | {tau} | {count} | {', '.join(moves) or 'none'} |")
    lines += ["", "## Meta-evaluation", "", meta.to_document()["rule"], ""]
    for run in meta.runs:
        title = "synthetic bag-of-tokens model" if run.synthetic else run.model
        lines += [
            f"**{title}** (base `{run.base}`, {run.examples} examples): Kendall tau of each "
            "evaluator's order of the degraded explainers with the known order.",
            "",
            "| evaluator | tau per example [CI] | tau corpus [CI] | base best | flagged | s "
            "| inputs run / distinct |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in run.evaluators.items():
            if row.status != "ok":
                lines.append(f"| `{label(name)}` | {row.status}: {row.error} | | | | | |")
                continue
            example, corpus = row.tau_example, row.tau_corpus
            lines.append(
                f"| `{label(name)}` | {interval(example.get('mean'), example.get('ci95'))} | "
                f"{interval(corpus.get('value'), corpus.get('ci95'))} | "
                f"{'yes' if row.base_best else 'no'} | {'**yes**' if row.flagged else 'no'} | "
                f"{row.cost.seconds:.1f} | {row.cost.inputs} / {row.cost.distinct} |"
            )
        lines.append("")
    if agreement is not None:
        names = agreement.evaluators.get("aggregated", [])
        matrix = agreement.matrix("aggregated")
        lines += [
            "## Agreement between evaluators",
            "",
            "Kendall tau-b between the method rankings of every two evaluators "
            f"({agreement.to_json()['disagree']} marks a disagreeing pair).",
            "",
            "| | " + " | ".join(str(i + 1) for i in range(len(names))) + " |",
            "|---|" + "---|" * len(names),
        ]
        for i, name in enumerate(names):
            cells = [f"{v:+.2f}" if v == v else "-" for v in matrix[i]]
            lines.append(f"| {i + 1} `{label(name)}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def accuracy(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4f}"


def scorer_line(scorer: dict | None) -> list[str]:
    if scorer is None:
        return []
    return [
        "",
        f"`scorer=masked`: the model fine-tuned again with {scorer['masking']:g} of each "
        "input's tokens erased at every step (`finetune --masking`); held-out accuracy on "
        f"{scorer['eval_split']} {accuracy(scorer['original_eval_accuracy'])} before, "
        f"{accuracy(scorer['eval_accuracy'])} after.",
    ]


def interval(value, ci) -> str:
    if value is None or ci is None or ci[0] is None:
        return "-" if value is None else f"{value:+.2f}"
    return f"{value:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(TASKS), default="sst2")
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--masking",
        type=float,
        default=0.1,
        help="the share erased by the masked fine-tune that scores the scorer= evaluators "
        "(F-Fidelity's 0.1); 0: no scorer= evaluators",
    )
    args = parser.parse_args()
    task = TASKS[args.dataset]
    load_before = list(os.getloadavg())
    model = trained(task.training, args.device)
    masked = dataclasses.replace(task.training, model=model, masking=args.masking)
    scorer = trained(masked, args.device) if args.masking else None
    raw, scored = faithfulness_evaluators(scorer)
    evaluators = raw + NAOPC + ALL_STEPS + scored
    methods = list(REGISTRY.defaults("attributors")) + EXTRA_METHODS
    tokenizer = load_model(model, "cpu", architectures=ARCHITECTURES).tokenizer
    with tempfile.TemporaryDirectory() as folder:
        data, read = task.short_examples(tokenizer, args.limit, args.max_tokens, Path(folder))
        common = dict(model=model, dataset=str(data), device=args.device, seed=0)
        start = time.perf_counter()
        result = attrib_bench.run(
            **common,
            attributors=methods,
            evaluators=evaluators,
            batch_size=16,
            cache=False,
            output=Path(folder) / "run.json",
        )
        run_seconds = time.perf_counter() - start
        start = time.perf_counter()
        meta = attrib_bench.meta(base="saliency", evaluators=raw + NAOPC + scored, **common)
        meta_seconds = time.perf_counter() - start
        run_document = summaries(json.loads((Path(folder) / "run.json").read_text()))
    document = {
        "model": task.model_text,
        "scorer": scorer_summary(scorer),
        "load_average": {"before": load_before, "after": list(os.getloadavg())},
        "data": {
            "name": task.data_text,
            "read": read,
            "examples": len(result.example_ids),
            "max_tokens": args.max_tokens,
        },
        "seconds": {"run": run_seconds, "meta": meta_seconds},
        "run": run_document,
        "meta": meta.to_document(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"referee_{task.name}.json").write_text(json.dumps(document, indent=1) + "\n")
    text = markdown(document, result, meta, raw, scored)
    (RESULTS / f"referee_{task.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
