"""Time and peak memory of the eight attention-family variants against a plain forward pass.

    python benchmarks/norm_speed.py [--model DIR] [--device cpu|cuda] [--batch-size 16]

Same process, same batches: (1) a plain batched forward with attentions; (2) the full trace
(attentions, values, pre-LN vectors, hidden states) plus all eight variants (attention, rollout,
norm, norm-res, norm-resln, globenc, norm-fixedres, attention-res). Then the per-sentence cost at
fixed lengths n = 8, 25, 58, 128, 512 tokens. Writes benchmarks/results/norm_speed.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from attrib_bench.core.interfaces import Example
from attrib_bench.core.registry import load_registry
from attrib_bench.core.trace_fields import TRACE_FIELDS
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.runner.memory import PeakMemory
from attrib_bench_plugins.norm import GLOBENC_EIGHT

#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = load_registry().architecture_specs()

SST2_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2"
RESULTS = Path(__file__).parent / "results"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_forward(loaded, batches) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            loaded.model(**batch.model_inputs(), output_attentions=True)
    sync(loaded.device)
    return time.perf_counter() - start


def family(loaded, batches, attributors) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            trace = trace_batch(loaded, batch, TRACE_FIELDS)
            for attributor in attributors:
                attributor.attribute(trace)
    sync(loaded.device)
    return time.perf_counter() - start


def measure(loaded, batches, attributors) -> dict:
    plain_forward(loaded, batches[:2])  # warm-up
    family(loaded, batches[:2], attributors)
    with PeakMemory(loaded.device) as plain_peak:
        plain = plain_forward(loaded, batches)
    with PeakMemory(loaded.device) as family_peak:
        full = family(loaded, batches, attributors)
    return {
        "plain_forward_s": round(plain, 3),
        "family_s": round(full, 3),
        "ratio": round(full / plain, 2),
        "plain_peak_mb": round(plain_peak.megabytes, 1),
        "family_peak_mb": round(family_peak.megabytes, 1),
    }


def by_length(loaded, attributors, lengths, repeats: int) -> dict:
    """Per-sentence cost at exactly n tokens (a sentence of n - 2 words plus [CLS], [SEP])."""
    out = {}
    for n in lengths:
        text = " ".join(["word"] * (n - 2))
        batches, _ = make_batches([Example("x", text)], loaded.tokenizer, 1, n)
        batches = [batches[0].to(loaded.device)] * repeats
        assert batches[0].input_ids_BN.shape[1] == n
        row = measure(loaded, batches, attributors)
        out[n] = {
            "plain_ms": round(1000 * row["plain_forward_s"] / repeats, 2),
            "family_ms": round(1000 * row["family_s"] / repeats, 2),
            "ratio": row["ratio"],
            "family_peak_mb": row["family_peak_mb"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="default: the embedded MiniLM classifier")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS / "norm_speed.json")
    args = parser.parse_args()
    if args.model is None:
        from attrib_bench.model.finetune import ensure_default_model

        args.model = str(ensure_default_model(args.device, architectures=ARCHITECTURES))
    loaded = load_model(args.model, args.device, architectures=ARCHITECTURES)
    registry = load_registry()
    attributors = [registry.attributor(name) for name in GLOBENC_EIGHT]
    data = load_examples(str(SST2_DEV), "dev")
    batches, _ = make_batches(data.examples, loaded.tokenizer, args.batch_size, 512)
    batches = [b.to(loaded.device) for b in batches]
    report = {
        "device": str(loaded.device),
        "torch_threads": torch.get_num_threads(),
        "model": args.model,
        "sst2_dev": {"sentences": len(data.examples), **measure(loaded, batches, attributors)},
        "by_length": by_length(loaded, attributors, [8, 25, 58, 128, 512], args.repeats),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
