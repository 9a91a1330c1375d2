"""Do ``cp-lrp`` and ``attnlrp`` equal LXT's own output?

Runs LXT 2.1 (github.com/rachtibat/LRP-eXplains-Transformers, ``lxt.efficient``) itself on the
same tiny random float64 models and inputs as attrib-bench: BERT (a classifier), LLaMA and GPT-2
(causal language models), each with LXT's ``attnLRP`` patch map and, where LXT ships one
(LLaMA, GPT-2), its ``cp_LRP`` map. Relevance as LXT's README computes it: the word (input)
embeddings times the gradient of the explained logit, summed per token, the backward pass seeded
with 1 (the README seeds it with the logit itself, which scales every relevance by that logit).
attrib-bench's side is ``cp-lrp:layer=word_embeddings`` and ``attnlrp:layer=word_embeddings`` on
the same explained logit (the predicted class, or the predicted next token at the last
position). Prints and writes the largest difference per family and variant, relative to the
largest relevance.

LXT patches transformers' model classes for specific releases (LXT 2.1: transformers 4.5x;
it does not import under transformers 5), so it runs in an environment of its own
(``--venv``, default ``$ATTRIB_BENCH_CACHE/lxt-venv``, made on first use): this environment's
packages (``--system-site-packages``, so the same torch build) with ``transformers==4.51.3``
and ``lxt==2.1`` (without its optional dependencies: zennit, bitsandbytes, open_clip; its
torchvision ViT map is stubbed, since torchvision is not installed).

    python benchmarks/lxt_reference.py [--venv DIR]

Outputs: benchmarks/results/lxt_reference.json and .md.
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
from attrib_bench.testing.conformance import save_tiny_model
from attrib_bench_plugins.gradient import CPLRP, AttnLRP

RESULTS = Path(__file__).parent / "results"
PACKAGES = ["transformers==4.51.3", "lxt==2.1"]
#: LXT's patch maps per family: ``cp_LRP`` exists for the decoders only.
VARIANTS = {"bert": ("attnLRP",), "llama": ("attnLRP", "cp_LRP"), "gpt2": ("attnLRP", "cp_LRP")}
OURS = {"attnLRP": AttnLRP, "cp_LRP": CPLRP}
TEXTS = ["the film was good", "a dull , dull movie", "fine acting but a weak plot"]

LXT_SCRIPT = r"""
import json, sys, types, importlib
import torch
vit = types.ModuleType("lxt.efficient.models.vit_torch")  # torchvision is not installed
vit.vision_transformer = types.ModuleType("vision_transformer_unavailable")
vit.cp_LRP = {}
sys.modules["lxt.efficient.models.vit_torch"] = vit
from lxt.efficient import monkey_patch
import transformers

job = json.load(open(sys.argv[1]))
family, variant = job["family"], job["variant"]
module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
patches = importlib.import_module(f"lxt.efficient.models.{family}")
monkey_patch(module, getattr(patches, variant))
auto = transformers.AutoModelForSequenceClassification if family == "bert" else (
    transformers.AutoModelForCausalLM)
model = auto.from_pretrained(job["directory"], attn_implementation="eager").double().eval()
rows = []
for item in job["examples"]:
    ids = torch.tensor([item["ids"]])
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    logits = model(inputs_embeds=embeds).logits[0]
    logit = logits[item["label"]] if family == "bert" else logits[item["position"], item["label"]]
    logit.backward()
    rows.append((embeds.grad * embeds).sum(-1)[0].tolist())
json.dump({"rows": rows, "transformers": transformers.__version__}, open(sys.argv[2], "w"))
"""


def lxt_python(venv: Path) -> Path:
    """The environment's Python; made with LXT and its transformers on first use."""
    python = venv / "bin" / "python"
    probe = "import transformers, lxt; assert transformers.__version__.startswith('4.')"
    if python.exists() and subprocess.run([python, "-c", probe]).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", PACKAGES[0]], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", PACKAGES[1]], check=True)
    return python


def family_directory(family: str, root: Path) -> Path:
    directory = root / family
    directory.mkdir()
    if family == "bert":
        return save_tiny_model(directory, "bert")
    return save_tiny_decoder(directory, family)


def compare(family: str, directory: Path, python: Path, scratch: Path) -> dict:
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    trace = trace_batch(loaded, one_batch(loaded, examples(TEXTS)), frozenset())
    items = []
    for row in range(len(TEXTS)):
        real_N = trace.batch.attention_mask_BN[row].bool()
        items.append(
            {
                "ids": trace.batch.input_ids_BN[row][real_N].tolist(),
                "label": int(trace.target_classes_B[row]),
                "position": int(real_N[: trace.target_positions_B[row]].sum()),
                "real": real_N,
            }
        )
    out = {}
    for variant in VARIANTS[family]:
        job = scratch / f"{family}-{variant}.json"
        result = scratch / f"{family}-{variant}-lxt.json"
        shipped = [{k: v for k, v in item.items() if k != "real"} for item in items]
        job.write_text(
            json.dumps(
                {
                    "family": family,
                    "variant": variant,
                    "directory": str(directory),
                    "examples": shipped,
                }
            )
        )
        script = scratch / "lxt_side.py"
        script.write_text(LXT_SCRIPT)
        subprocess.run([python, str(script), str(job), str(result)], check=True)
        lxt = json.loads(result.read_text())
        method = OURS[variant]().configure({"layer": "word_embeddings", "reduce": "sum"})
        rows_BN = method.attribute(trace).aggregated_BLN[:, 0].double()
        worst = 0.0
        for row, item in enumerate(items):
            theirs = torch.tensor(lxt["rows"][row], dtype=torch.float64)
            ours = rows_BN[row][item["real"]]
            worst = max(worst, float((ours - theirs).abs().max() / theirs.abs().max()))
        out[variant] = {
            "largest_relative_difference": worst,
            "lxt_transformers": lxt["transformers"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=cache_root() / "lxt-venv")
    args = parser.parse_args()
    python = lxt_python(args.venv)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for family in VARIANTS:
            directory = family_directory(family, Path(scratch))
            results[family] = compare(family, directory, python, Path(scratch))
    import transformers

    document = {"ours_transformers": transformers.__version__, "texts": TEXTS, "results": results}
    lines = [
        "LXT 2.1 against `cp-lrp` / `attnlrp` (`layer=word_embeddings`, `reduce=sum`) on tiny "
        "random float64 models, "
        f"{len(TEXTS)} inputs each; LXT under transformers "
        f"{next(iter(results['bert'].values()))['lxt_transformers']}, attrib-bench under "
        f"{transformers.__version__}. Largest |ours - LXT| over every token, relative to the "
        "largest |LXT| relevance of the input.",
        "",
        "| family | LXT patch map | largest relative difference |",
        "|---|---|---|",
    ]
    for family, variants in results.items():
        for variant, entry in variants.items():
            lines.append(f"| {family} | `{variant}` | {entry['largest_relative_difference']:.1e} |")
    RESULTS.mkdir(exist_ok=True)
    write_json(document, RESULTS / "lxt_reference.json")
    (RESULTS / "lxt_reference.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
