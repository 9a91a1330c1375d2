"""Does ``comprehensiveness:protocol=ferret`` reproduce ferret 0.4.2's numbers?

Runs ferret 0.4.2 itself (``AOPC_Comprehensiveness_Evaluation`` and
``AOPC_Sufficiency_Evaluation`` with their default arguments) in a virtual environment of its
own, on the MiniLM SST-2 classifier of benchmarks/globenc_sst2.py (cached) and the first
``--limit`` SST-2 dev sentences, with identical attributions: signed gradient x input
(``saliency:reduce=sum``) computed by attrib-bench and handed to ferret as its explanations'
scores. ferret explains the class it predicts, the run's target here. Prints and writes the
largest per-example difference between ferret and attrib-bench under ``protocol=ferret`` and
under the default protocol.

ferret pins transformers<5 and numpy<2 and needs pyarrow<20 to import, so it gets its own
environment (``--venv``, default ``$ATTRIB_BENCH_CACHE/ferret-venv``, made on first use) with
this environment's torch build (``torch==<this version>``: here the local CPU wheel).

    python benchmarks/ferret_protocol.py [--limit 50] [--venv DIR] [--model DIR]

Outputs: benchmarks/results/ferret_protocol.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluators import DATA, sst2_model  # the same cached SST-2 classifier

from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.registry import Spec
from attrib_bench.data.load import load_examples
from attrib_bench.model.finetune import read_metadata
from attrib_bench.results import write_json
from attrib_bench.runner.attribute import write_attributions
from attrib_bench.runner.engine import run_benchmark
from attrib_bench.runner.state import RunConfig
from attrib_bench_plugins.faithfulness import AOPC_RATIOS

RESULTS = Path(__file__).resolve().parent / "results"
METHOD = "saliency:reduce=sum"
EVALUATORS = ("comprehensiveness", "sufficiency")
#: Row label -> the parameters after the evaluator's name: ferret's protocol, the default, and
#: ferret's protocol with one switch set back to attrib-bench's (what each switch accounts for).
VARIANTS = {
    "protocol=ferret": "protocol=ferret",
    "default protocol": "",
    "ferret, but rationale=top-k": "protocol=ferret,rationale=top-k",
    "ferret, but rounding=ceil": "protocol=ferret,rounding=ceil",
    "ferret, but repeats=keep": "protocol=ferret,repeats=keep",
    "ferret, but empty=score": "protocol=ferret,empty=score",
    "ferret, but removal=mask": "protocol=ferret,removal=mask",
    "ferret, but ratios=0.1/…/0.9": "protocol=ferret,ratios=" + AOPC_RATIOS,
}
PACKAGES = ["ferret-xai==0.4.2", "pyarrow<20"]

#: Run by the ferret environment's Python: ferret's own evaluators on attrib-bench's scores.
FERRET_SIDE = r"""
import json, sys
import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
import ferret
from ferret import AOPC_Comprehensiveness_Evaluation, AOPC_Sufficiency_Evaluation
from ferret.explainers.explanation import Explanation

model_dir, records_path, output = sys.argv[1:]
model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
tokenizer = AutoTokenizer.from_pretrained(model_dir)
evaluators = {
    "comprehensiveness": AOPC_Comprehensiveness_Evaluation(model, tokenizer),
    "sufficiency": AOPC_Sufficiency_Evaluation(model, tokenizer),
}
out = {"versions": {name: __import__(name).__version__
                    for name in ("transformers", "torch", "numpy")}, "examples": {}}
out["versions"]["ferret-xai"] = __import__("importlib.metadata").metadata.version("ferret-xai")
for line in open(records_path):
    record = json.loads(line)
    with torch.no_grad():
        logits = model(**tokenizer(record["text"], return_tensors="pt", truncation=True)).logits
    target = int(logits.argmax(-1))
    explanation = Explanation(record["text"], record["tokens"], np.array(record["scores"]),
                              "attrib-bench", target)
    out["examples"][record["id"]] = {
        "target": target,
        **{name: float(e.compute_evaluation(explanation, target).score)
           for name, e in evaluators.items()},
    }
json.dump(out, open(output, "w"))
"""


def ferret_python(venv: Path) -> tuple[Path, bool]:
    """The environment's Python, and whether it was made now (ferret did not import there)."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import ferret"]).returncode == 0:
        return python, False
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pins = [f"torch=={torch.__version__}", *PACKAGES]
    subprocess.run([python, "-m", "pip", "install", *pins], check=True)
    return python, True


def spec(evaluator: str, label: str) -> str:
    """The evaluator spec of a row of ``VARIANTS``, as the result keys it."""
    params = VARIANTS[label]
    return str(Spec.parse(f"{evaluator}:{params}" if params else evaluator))


def ours(model: str, limit: int) -> tuple[dict, list[dict]]:
    """attrib-bench's per-example scores under both protocols, and the attributions."""
    common = dict(model=model, dataset=str(DATA / "sst2"), split="dev", limit=limit)
    evaluators = [spec(name, label) for name in EVALUATORS for label in VARIANTS]
    config = RunConfig(**common, attributors=[METHOD], evaluators=evaluators, floor=False)
    document = run_benchmark(config)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "attributions.jsonl"
        write_attributions(RunConfig(**common, attributors=[METHOD]), path, quiet=True)
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    texts = {e.id: e.text for e in load_examples(str(DATA / "sst2"), "dev", limit=limit).examples}
    records = [
        {"id": r["id"], "text": texts[r["id"]], "tokens": r["tokens"], "scores": r["aggregated"][0]}
        for r in rows
        if r.get("method") == METHOD
    ]
    return document, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--model", help="classifier directory (default: fine-tuned, cached)")
    parser.add_argument("--venv", type=Path, default=cache_root() / "ferret-venv")
    args = parser.parse_args()
    os.environ.setdefault("ATTRIB_BENCH_NO_CACHE", "1")
    start = time.perf_counter()
    python, built = ferret_python(args.venv)
    venv_seconds = time.perf_counter() - start
    model = args.model or sst2_model("cpu")
    document, records = ours(model, args.limit)
    with tempfile.TemporaryDirectory() as folder:
        records_path, output = Path(folder) / "records.jsonl", Path(folder) / "ferret.json"
        records_path.write_text("".join(json.dumps(r) + "\n" for r in records))
        subprocess.run([python, "-c", FERRET_SIDE, model, records_path, output], check=True)
        theirs = json.loads(output.read_text())
    ids = document["example_ids"]
    per_example = document["methods"][METHOD]["per_example"]
    summary: dict = {}
    for name in EVALUATORS:
        reference = np.array([theirs["examples"][i][name] for i in ids])
        row = {}
        for label in VARIANTS:
            values = np.array(per_example[spec(name, label)]["aggregated"][0], dtype=float)
            difference = np.abs(values - reference)
            row[label] = {
                "spec": spec(name, label),
                "max_abs_difference": float(difference.max()),
                "mean_abs_difference": float(difference.mean()),
                "mean": float(values.mean()),
            }
        row["ferret mean"] = float(reference.mean())
        summary[name] = row
    result = {
        "model": model,
        "dataset": "sst2/dev",
        "examples": len(ids),
        "method": METHOD,
        "ferret_environment": theirs["versions"],
        "venv": {"built_now": built, "seconds": round(venv_seconds, 1)},
        "model_finetune": read_metadata(Path(model)),
        "seconds": round(time.perf_counter() - start, 1),
        "summary": summary,
        "per_example": {
            i: {
                "ferret": theirs["examples"][i],
                **{
                    spec(name, label): per_example[spec(name, label)]["aggregated"][0][j]
                    for name in EVALUATORS
                    for label in VARIANTS
                },
            }
            for j, i in enumerate(ids)
        },
    }
    write_json(result, RESULTS / "ferret_protocol.json")
    accuracy = result["model_finetune"]["eval_accuracy"]
    lines = [
        "# ferret 0.4.2's AOPC against attrib-bench's",
        "",
        f"MiniLM-L6 fine-tuned on SST-2 (benchmarks/globenc_sst2.py's recipe, dev accuracy "
        f"{accuracy:.3f}), first {len(ids)} SST-2 dev sentences, identical attributions "
        f"(`{METHOD}`, signed gradient x input, computed by attrib-bench and handed to ferret), "
        "the predicted class. ferret ran in its own environment: "
        + ", ".join(f"{k} {v}" for k, v in sorted(theirs["versions"].items()))
        + ".",
        "",
        "| evaluator | attrib-bench protocol | max abs difference to ferret | mean abs difference "
        "| attrib-bench mean | ferret mean |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        for label in VARIANTS:
            cell = row[label]
            lines.append(
                f"| {name} | `{cell['spec']}` | {cell['max_abs_difference']:.2e} "
                f"| {cell['mean_abs_difference']:.2e} | {cell['mean']:+.4f} "
                f"| {row['ferret mean']:+.4f} |"
            )
    command = f"python benchmarks/ferret_protocol.py --limit {args.limit}"
    command += " --model <that model>" if args.model else ""
    venv = f"{'made' if built else 'found'} in {venv_seconds:.0f} s"
    lines += ["", f"`{command}`: {result['seconds']} s (the ferret environment {venv})."]
    (RESULTS / "ferret_protocol.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
