"""Do ``discretized-integrated-gradients`` and ``sequential-integrated-gradients`` equal Inseq's?

Runs Inseq 0.7.1 (github.com/inseq-team/inseq) itself on the same tiny random float64 causal
language models (GPT-2 and LLaMA, tests/helpers.py ``save_tiny_decoder``) and prompts as
attrib-bench, explaining the logit of the predicted next token at the last prompt position
(Inseq: ``attributed_fn="logit"``, the prompt plus that token as ``generated_texts``; its
tokenisation is checked to give the same ids). Inseq's raw attributions (the Captum-level
output, before Inseq stores them in float32) are summed over the hidden dimension, as
``reduce=sum`` does. Prints and writes the largest difference per family and method, relative
to the largest |Inseq| attribution of the prompt.

Settings, aligned where a setting exists: Inseq's DIG ``n_steps=50`` (its default) is a path of
50 points with 48 anchors (``find_path`` takes ``n_steps - 2`` anchors), so ours is ``steps=48``;
``n_neighbors`` is 50 (Inseq's default; ``inseq.load_model`` cannot change it), so ours is
``neighbours=50``; greedy strategy on both sides. SIG: ``n_steps=50`` Gauss-Legendre on both
sides. Baseline: Inseq replaces every token but EOS by UNK, falling back to PAD; the tiny
tokenizer has neither, so both become ``<|endoftext|>`` (the tiny models' configs name BOS/EOS
ids 50256 or 1/2 that their tokenizer does not use; the Inseq side sets them to the tokenizer's
``<|endoftext|>`` id), which is attrib-bench's PAD here (``baseline=pad`` for SIG).

Definitional differences no setting aligns (DIG), measured by patching Inseq in its own
process: (1) Inseq makes an anchor monotonic with ``1 / n_steps`` = 1/(m + 2) of the way to the
baseline where the official ``monotonic_paths.py`` (and attrib-bench) use 1/m, in the greedy
distance and on the path; (2) Inseq casts the path's points to float32 (``scale_inputs``'s
``.float()``). Rows: Inseq as shipped; with (1) undone; with (1) and (2) undone.

Inseq runs in an environment of its own (``--venv``, default ``$ATTRIB_BENCH_CACHE/inseq-venv``,
made on first use): this environment's packages (``--system-site-packages``, the same torch,
transformers, Captum and scikit-learn) with ``inseq==0.7.1``, ``typeguard==2.13.3``, treescope
and wadler_lindig without dependencies, then jaxtyping.

    python benchmarks/inseq_reference.py [--venv DIR]

Outputs: benchmarks/results/inseq_reference.json and .md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import ARCHITECTURES, examples, one_batch, save_tiny_decoder  # the test fixtures

from attrib_bench.core.cache_dir import cache_root
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.results import write_json
from attrib_bench_plugins.gradient import (
    DiscretizedIntegratedGradients,
    SequentialIntegratedGradients,
)

RESULTS = Path(__file__).parent / "results"
NO_DEPS = ["inseq==0.7.1", "typeguard==2.13.3", "treescope", "wadler_lindig"]
FAMILIES = ("gpt2", "llama")
TEXTS = ["the cat sat on the", "a dog", "john gave a drink to"]
N_STEPS = 50  # Inseq's default for both methods
N_NEIGHBORS = 50  # Inseq's DIG default
#: (Inseq method, variant): the patches applied to Inseq (see the module docstring).
RUNS = {
    ("discretized_integrated_gradients", "as shipped"): [],
    ("discretized_integrated_gradients", "official 1/m step"): ["1/m"],
    ("discretized_integrated_gradients", "official 1/m step, float64 path"): ["1/m", "float64"],
    ("sequential_integrated_gradients", "as shipped"): [],
}
OURS = {
    "discretized_integrated_gradients": lambda: DiscretizedIntegratedGradients().configure(
        {"steps": str(N_STEPS - 2), "neighbours": str(N_NEIGHBORS), "reduce": "sum"}
    ),
    "sequential_integrated_gradients": lambda: SequentialIntegratedGradients().configure(
        {"steps": str(N_STEPS), "baseline": "pad", "layer": "word_embeddings", "reduce": "sum"}
    ),
}
NAMES = {
    "discretized_integrated_gradients": "discretized-integrated-gradients",
    "sequential_integrated_gradients": "sequential-integrated-gradients",
}

INSEQ_SCRIPT = r"""
import functools, importlib.metadata, json, sys
import torch
import inseq
from inseq.attr.feat.ops.monotonic_path_builder import MonotonicPathBuilder
from transformers import AutoModelForCausalLM, AutoTokenizer

job = json.load(open(sys.argv[1]))
patches = job["patches"]
if "float64" in patches:  # scale_inputs ends with torch.stack(...).float(): keep the dtype
    shipped_scale = MonotonicPathBuilder.scale_inputs
    def scale_inputs(self, *args, **kwargs):
        saved = torch.Tensor.float
        torch.Tensor.float = lambda tensor: tensor
        try:
            return shipped_scale(self, *args, **kwargs)
        finally:
            torch.Tensor.float = saved
    MonotonicPathBuilder.scale_inputs = scale_inputs
if "1/m" in patches:  # make_monotonic_vec(..., n_steps) moves 1/n_steps; the official 1/m
    shipped_vec = MonotonicPathBuilder.make_monotonic_vec.__func__
    def make_monotonic_vec(cls, anchor, baseline, input, n_steps=30):
        return shipped_vec(cls, anchor, baseline, input, n_steps - 2)
    MonotonicPathBuilder.make_monotonic_vec = classmethod(make_monotonic_vec)

model = AutoModelForCausalLM.from_pretrained(job["directory"]).double().eval()
tokenizer = AutoTokenizer.from_pretrained(job["directory"])
tokenizer.pad_token = tokenizer.unk_token = tokenizer.eos_token
for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
    setattr(model.config, key, tokenizer.eos_token_id)
method = job["method"]
extra = {"cache_dir": job["knn_cache"]} if method.startswith("discretized") else {}
wrapped = inseq.load_model(model, method, tokenizer=tokenizer, **extra)
op = wrapped.attribution_method.method
kept = []
shipped_attribute = op.attribute
@functools.wraps(shipped_attribute)  # Inseq passes on only the arguments in its signature
def attribute(*args, **kwargs):
    out = shipped_attribute(*args, **kwargs)
    kept.append(out[0] if isinstance(out, tuple) else out)
    return out
op.attribute = attribute
rows, dtypes = [], set()
for item in job["examples"]:
    prompt = tokenizer.decode(item["ids"])
    generated = tokenizer.decode(item["ids"] + [item["label"]])
    assert tokenizer(generated)["input_ids"] == item["ids"] + [item["label"]], generated
    kept.clear()
    wrapped.attribute(
        prompt, generated_texts=generated, attributed_fn="logit", n_steps=job["n_steps"],
        show_progress=False,
    )
    (raw,) = kept  # (1, prompt length, hidden): one generation step
    assert raw.shape[1] == len(item["ids"]), raw.shape
    dtypes.add(str(raw.dtype))
    rows.append(raw[0].double().sum(-1).tolist())
json.dump(
    {"rows": rows, "dtypes": sorted(dtypes), "inseq": importlib.metadata.version("inseq")},
    open(sys.argv[2], "w"),
)
"""


def inseq_python(venv: Path) -> Path:
    """The environment's Python; made with Inseq on first use."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import inseq"]).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", *NO_DEPS], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "jaxtyping"], check=True)
    return python


def compare(family: str, directory: Path, python: Path, scratch: Path) -> dict:
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    trace = trace_batch(loaded, one_batch(loaded, examples(TEXTS)), frozenset())
    items = []
    for row in range(len(TEXTS)):
        real_N = trace.batch.attention_mask_BN[row].bool()
        assert not trace.batch.special_tokens_mask_BN[row][real_N].any()  # no BOS: same inputs
        assert int(real_N[: trace.target_positions_B[row]].sum()) == int(real_N.sum()) - 1
        ids = trace.batch.input_ids_BN[row][real_N].tolist()
        items.append({"ids": ids, "label": int(trace.target_classes_B[row]), "real": real_N})
    shipped = [{k: v for k, v in item.items() if k != "real"} for item in items]
    script = scratch / "inseq_side.py"
    script.write_text(INSEQ_SCRIPT)
    ours_BN = {
        method: make().attribute(trace).aggregated_BLN[:, 0].double()
        for method, make in OURS.items()
    }
    out: dict[str, dict] = {}
    for (method, variant), patches in RUNS.items():
        tag = f"{family}-{method}-{len(patches)}"
        job, result = scratch / f"{tag}.json", scratch / f"{tag}-inseq.json"
        job.write_text(
            json.dumps(
                {
                    "directory": str(directory),
                    "method": method,
                    "patches": patches,
                    "n_steps": N_STEPS,
                    "knn_cache": str(scratch / f"knn-{tag}"),
                    "examples": shipped,
                }
            )
        )
        subprocess.run([python, str(script), str(job), str(result)], check=True)
        inseq = json.loads(result.read_text())
        worst = 0.0
        for row, item in enumerate(items):
            theirs = torch.tensor(inseq["rows"][row], dtype=torch.float64)
            ours = ours_BN[method][row][item["real"]]
            worst = max(worst, float((ours - theirs).abs().max() / theirs.abs().max()))
        out.setdefault(NAMES[method], {})[variant] = {
            "largest_relative_difference": worst,
            "inseq_raw_dtype": inseq["dtypes"],
            "inseq": inseq["inseq"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=cache_root() / "inseq-venv")
    args = parser.parse_args()
    python = inseq_python(args.venv)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for family in FAMILIES:
            directory = Path(scratch) / family
            directory.mkdir()
            save_tiny_decoder(directory, family)
            results[family] = compare(family, directory, python, Path(scratch))
    import transformers

    version = results["gpt2"]["sequential-integrated-gradients"]["as shipped"]["inseq"]
    document = {
        "inseq": version,
        "transformers": transformers.__version__,
        "texts": TEXTS,
        "n_steps": N_STEPS,
        "n_neighbors": N_NEIGHBORS,
        "ours": {NAMES[method]: dict(make().params) for method, make in OURS.items()},
        "results": results,
    }
    lines = [
        f"Inseq {version} against `discretized-integrated-gradients` (`steps={N_STEPS - 2}`, "
        f"`neighbours={N_NEIGHBORS}`) and `sequential-integrated-gradients` (`steps={N_STEPS}`, "
        "`baseline=pad`, `layer=word_embeddings`), `reduce=sum`, on tiny random float64 GPT-2 "
        f"and LLaMA causal LMs, {len(TEXTS)} prompts each, explaining the logit of the "
        f'predicted next token (Inseq `n_steps={N_STEPS}`, `attributed_fn="logit"`, '
        f"transformers {transformers.__version__} on both sides). Largest |ours - Inseq| over "
        "every prompt token, relative to the largest |Inseq| attribution of the prompt. DIG "
        "rows: Inseq as shipped, then with its 1/(m + 2) monotonic step replaced by the "
        "official 1/m, then also with its float32 cast of the path's points removed.",
        "",
        "| family | method | Inseq | largest relative difference |",
        "|---|---|---|---|",
    ]
    for family, methods in results.items():
        for method, variants in methods.items():
            for variant, entry in variants.items():
                lines.append(
                    f"| {family} | `{method}` | {variant} | "
                    f"{entry['largest_relative_difference']:.1e} |"
                )
    RESULTS.mkdir(exist_ok=True)
    write_json(document, RESULTS / "inseq_reference.json")
    (RESULTS / "inseq_reference.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
