"""One prepared check for a lent GPU: the methods' throughput and peak memory on CUDA.

    python benchmarks/gpu.py [--device cuda] [--examples 512] [--batch-size 64] [--smoke]

Nothing is downloaded and no data set is read, so the check needs only the project, torch,
transformers and captum on the machine. Models with random weights (seeded) in the shapes of
real ones, and a word-level tokenizer over a synthetic vocabulary of 8,000 words:

- ``minilm``: a MiniLM-L6-shaped BERT classifier (6 layers, hidden 384, 12 heads), the default
  model's shape;
- ``bert-base``: a BERT-base-shaped classifier (12 layers, hidden 768);
- ``smollm2``: a SmolLM2-135M-shaped LLaMA causal LM (30 layers, hidden 576, 9 heads, 3
  key-value heads), explained at its last token;
- ``context``: the same SmolLM2-shaped model on a decoder continuation (``attrib-bench
  context``): ``--contexts`` contexts of 16 segments of 12 to 24 words, a query, and an answer
  of 16 words (16 tokens) whose log-probability is attributed to the segments; the segment
  methods (leave-one-segment-out through the key-value cache and whole, input x gradient
  summed and per step, integrated gradients per step, context-cite) with ``--batch-size``
  ablations at once, against one forward pass of the full prompt and answer.

Inputs: ``--examples`` random sentences of 16 to 64 words, in batches of ``--batch-size``. Per
model, each method as the runner runs it alone (``trace_batch`` with its fields, then
``attribute``) over every batch, after a warm-up batch; the floors are one forward pass without
gradients and one forward plus one backward pass of the predicted logit. Reports examples per
second, the ratio to the forward-and-backward floor and the peak memory above the model's
(``torch.cuda.max_memory_allocated``), and writes ``gpu.json`` to ``$OUT`` (the device tool's
folder) or ``--output``. ``--smoke`` runs a few tiny batches on any device, to check the script
itself before device time is spent. Budget: about 3 minutes on an H200 at the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from attrib_bench.core.batch import Example
from attrib_bench.core.registry import load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch

REGISTRY = load_registry()
ARCHITECTURES = REGISTRY.architecture_specs()
FIELDS = REGISTRY.trace_field_specs()
#: The default run's attention family and the gradient methods, then the issue-32 methods.
METHODS = [
    "attention",
    "rollout",
    "norm",
    "globenc",
    "alti",
    "decompx",
    "saliency",
    "gradient",
    "integrated-gradients",
    "gae",
    "grad-sam",
    "attention-x-gradient",
    "attcat",
    "cp-lrp",
    "attnlrp",
    "atman",
    "random",
]
WORDS = [f"w{i}" for i in range(8000)]


def tokenizer(wrap: bool = True):
    """A word-level tokenizer over WORDS with BERT's special tokens; ``wrap``: around every
    text ([CLS] ... [SEP]), which a decoder explaining a continuation must not have."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if wrap:
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def save_model(name: str, directory: Path, smoke: bool) -> Path:
    """A seeded random model of ``name``'s shape (tiny with ``smoke``), with the tokenizer."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        LlamaConfig,
        LlamaForCausalLM,
    )

    vocab = len(WORDS) + 5
    torch.manual_seed(0)
    if name in ("smollm2", "context"):
        size = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)
        if smoke:
            size = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2)
        config = LlamaConfig(
            vocab_size=vocab,
            num_attention_heads=9 if not smoke else 4,
            num_key_value_heads=3 if not smoke else 2,
            max_position_embeddings=1024,
            pad_token_id=0,
            **size,
        )
        model = LlamaForCausalLM(config)
    else:
        layers, hidden = (6, 384) if name == "minilm" else (12, 768)
        if smoke:
            layers, hidden = 2, 48
        config = BertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=12 if not smoke else 4,
            intermediate_size=4 * hidden,
            num_labels=2,
        )
        model = BertForSequenceClassification(config)
    model.save_pretrained(directory)
    tokenizer(wrap=name != "context").save_pretrained(directory)
    return directory


def sentences(count: int, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    return [
        Example(id=str(i), text=" ".join(rng.choices(WORDS, k=rng.randint(16, 64))))
        for i in range(count)
    ]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured(device: torch.device, run) -> tuple[float, float]:
    """Seconds and peak megabytes above the memory held before, of ``run()``."""
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = 0.0
    if device.type == "cuda":
        peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    return seconds, peak


def floors(loaded) -> dict:
    """The floors as functions of the batches they run over."""

    def forward(batches) -> None:
        with torch.no_grad():
            for batch in batches:
                loaded.model(**batch.model_inputs())

    def forward_backward(batches) -> None:
        lookup = loaded.model.get_input_embeddings()
        for batch in batches:
            kept = []
            handle = lookup.register_forward_hook(
                lambda _m, _i, output, kept=kept: kept.append(output.requires_grad_())
            )
            try:
                out = loaded.model(**batch.model_inputs()).logits
            finally:
                handle.remove()
            if loaded.is_language_model:
                out = out[:, -1]
            score = out.gather(1, out.argmax(dim=1, keepdim=True)).sum()
            torch.autograd.grad(score, kept[0])

    return {"forward": forward, "forward + backward": forward_backward}


def method(loaded, attributor):
    """``attributor`` as the runner runs it alone, as a function of the batches."""

    def run(batches) -> None:
        for batch in batches:
            trace = trace_batch(loaded, batch, attributor.requires, fields=FIELDS)
            attributor.attribute(trace)
            trace.release_graph()

    return run


def check_model(name: str, device: torch.device, args, scratch: Path) -> dict:
    directory = save_model(name, scratch / name, args.smoke)
    loaded = load_model(str(directory), str(device), architectures=ARCHITECTURES)
    examples = sentences(args.examples)
    batches, _ = make_batches(examples, loaded.tokenizer, args.batch_size, 128)
    batches = [batch.to(loaded.device) for batch in batches]
    rows: dict[str, dict] = {}
    settings = floors(loaded)
    for spec in METHODS:
        attributor = REGISTRY.attributor(spec)
        problem = loaded.unmet_needs(attributor)
        if problem:
            rows[spec] = {"skipped": problem}
        else:
            settings[spec] = method(loaded, attributor)
    for label, run in settings.items():
        try:
            run(batches[:1])  # warm-up
            seconds, peak = measured(device, lambda run=run: run(batches))
        except Exception as error:  # one method's failure is its row, not the check's end
            rows[label] = {"error": f"{type(error).__name__}: {error}"[:300]}
            print(f"{name:10s} {label:28s} {rows[label]['error']}", flush=True)
            continue
        rows[label] = {
            "seconds": round(seconds, 4),
            "examples_per_second": round(len(examples) / seconds, 1),
            "peak_mb": round(peak, 1),
        }
        print(
            f"{name:10s} {label:28s} {seconds:8.3f} s {len(examples) / seconds:9.1f} ex/s "
            f"{peak:9.1f} MB",
            flush=True,
        )
    floor = rows["forward + backward"]["seconds"]
    for row in rows.values():
        if "seconds" in row:
            row["ratio_to_forward_backward"] = round(row["seconds"] / floor, 3)
    return rows


def contexts(count: int, seed: int = 0) -> list:
    """Synthetic context examples: 16 segments, a two-word query, a 16-word answer."""
    from attrib_bench.segments.data import SegmentExample

    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choices(WORDS, k=k))

    return [
        SegmentExample(
            id=str(i),
            segments=tuple(words(rng.randint(12, 24)) for _ in range(16)),
            query=words(2),
            answer=" " + words(16),
        )
        for i in range(count)
    ]


#: The segment methods the context check times, as ``attrib-bench context`` names them; ``:steps``
#: marks a per-step run (``--per-step``).
CONTEXT_METHODS = [
    "leave-one-segment-out",
    "leave-one-segment-out:cache=false",
    "input-x-gradient",
    "input-x-gradient:steps",
    "integrated-gradients:steps=16:steps",
    "context-cite",
]


def check_context(device: torch.device, args, scratch: Path) -> dict:
    """Each segment method over every context (a fresh scorer each: no ablation shared)."""
    from attrib_bench.segments.scorer import SegmentScorer

    directory = save_model("context", scratch / "context", args.smoke)
    loaded = load_model(str(directory), str(device), architectures=ARCHITECTURES)
    examples = contexts(args.contexts)

    def scorers() -> list:
        return [SegmentScorer(loaded, e, batch_size=args.batch_size) for e in examples]

    def forward() -> None:
        for scorer in scorers():
            scorer.full_score  # noqa: B018 (one forward pass of the prompt and the answer)

    def segment_method(spec: str):
        per_step = spec.endswith(":steps")
        name, _, settings = spec.removesuffix(":steps").partition(":")
        raw = dict(item.split("=") for item in settings.split(":")) if settings else {}
        attributor = REGISTRY.segment_attributors[name].obj.configure(raw)
        call = attributor.attribute_steps if per_step else attributor.attribute_segments
        return lambda: [call(scorer) for scorer in scorers()]

    runs = {"forward": forward} | {spec: segment_method(spec) for spec in CONTEXT_METHODS}
    rows: dict[str, dict] = {}
    for label, run in runs.items():
        try:
            run()  # warm-up
            seconds, peak = measured(device, run)
        except Exception as error:  # one method's failure is its row, not the check's end
            rows[label] = {"error": f"{type(error).__name__}: {error}"[:300]}
            print(f"{'context':10s} {label:36s} {rows[label]['error']}", flush=True)
            continue
        rows[label] = {
            "seconds": round(seconds, 4),
            "contexts_per_second": round(len(examples) / seconds, 2),
            "peak_mb": round(peak, 1),
        }
        print(
            f"{'context':10s} {label:36s} {seconds:8.3f} s {len(examples) / seconds:7.2f} ctx/s "
            f"{peak:9.1f} MB",
            flush=True,
        )
    floor = rows["forward"].get("seconds")
    for row in rows.values():
        if "seconds" in row and floor:
            row["ratio_to_forward"] = round(row["seconds"] / floor, 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--models", default="minilm,bert-base,smollm2,context")
    parser.add_argument("--contexts", type=int, default=16, help="contexts of the context check")
    parser.add_argument("--smoke", action="store_true", help="tiny models, any device")
    parser.add_argument("--output", type=Path, help="where gpu.json goes (default: $OUT or .)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu.py: no CUDA device here (use --smoke --device cpu to check the script)")
        sys.exit(2)
    if args.smoke:
        args.examples, args.batch_size = min(args.examples, 16), min(args.batch_size, 8)
        args.contexts = min(args.contexts, 2)
    start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            if name == "context":
                results[name] = check_context(device, args, Path(scratch))
            else:
                results[name] = check_model(name, device, args, Path(scratch))
    document = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "examples": args.examples,
        "batch_size": args.batch_size,
        "contexts": args.contexts,
        "smoke": args.smoke,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "models": results,
    }
    output = args.output or Path(os.environ.get("OUT", ".")) / "gpu.json"
    output.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {output} ({document['wall_seconds']} s)")


if __name__ == "__main__":
    main()
