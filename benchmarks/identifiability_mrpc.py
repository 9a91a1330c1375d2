"""Token identifiability and HTA (Brunner et al., ICLR 2020) on every MRPC dev pair, at a budget.

    python benchmarks/identifiability_mrpc.py [--folds 5] [--learning-rates 3e-3,1e-3,3e-4]
        [--rate-search first-fold] [--patience 20] [--max-epochs 30] [--frobenius-pairs 5]

1. Fine-tunes MiniLM-L6 on the MRPC training pairs (3 epochs; cached like
   ``attrib-bench finetune``): the paper analyses a model fine-tuned on MRPC.
2. Token identifiability on all 408 dev pairs: the naive baseline and the four learned maps per
   layer, on a true K-fold partition with the learning-rate grid and early stopping of
   ``attrib-bench identifiability``; rates with t intervals over the folds.
3. HTA with ``norm=sum`` (a projection of the Jacobian) on every pair, and Brunner et al.'s
   Frobenius HTA on the ``--frobenius-pairs`` shortest pairs only (minutes per pair on a CPU,
   see hta_cost.py), with ``norm=sum`` on those same pairs beside it.
Writes benchmarks/results/identifiability/identifiability.{json,md,png}, with the seconds of each
step and the machine's load.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from attrib_bench.analyses.identifiability import (
    IdentifiabilityConfig,
    hta_analysis,
    identifiability,
    plot,
    sentence_states,
    summarize_rates,
)
from attrib_bench.core.registry import load_registry
from attrib_bench.model.finetune import (
    FinetuneConfig,
    default_model_source,
    finetune,
    read_metadata,
)
from attrib_bench.model.load import load_model
from attrib_bench.results import write_json

MRPC = Path(__file__).resolve().parents[2] / "shared" / "data" / "mrpc"
RESULTS = Path(__file__).parent / "results" / "identifiability"
ARCHITECTURES = load_registry().architecture_specs()


def floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(","))


def fmt_row(name: str, rows: list[dict]) -> str:
    cells = [f"{r['mean']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]" for r in rows]
    return f"| `{name}` | " + " | ".join(cells) + " |"


def markdown(report: dict) -> str:
    config, seconds = report["config"], report["seconds"]
    layers = len(report["identifiability"]["naive-l2"])
    header = "| map | " + " | ".join(f"L{i}" for i in range(layers)) + " |"
    rule = "|---|" + "---|" * layers
    lines = [
        "# Token identifiability and HTA: MiniLM-L6 fine-tuned on MRPC, all dev pairs",
        "",
        "`python benchmarks/identifiability_mrpc.py` on "
        f"{report['machine']}; load average {report['load_average']['before'][0]:.1f} before, "
        f"{report['load_average']['after'][0]:.1f} after; seconds: {seconds}"
        + ("." if "hta_frobenius" in report else " (a run cut short: the stages so far)."),
        "",
        f"Model: MiniLM-L6 fine-tuned on the MRPC training pairs (held-out accuracy "
        f"{report['finetune_accuracy']:.3f}). Data: {report['dataset']['sentences']} dev pairs, "
        f"{report['dataset']['tokens']} tokens. Budget: {config['folds']}-fold "
        f"{config['fold_scheme']} partition, learning rates {list(config['learning_rates'])} "
        f"searched {config['rate_search']}, patience {config['patience']}, at most "
        f"{config['max_epochs']} epochs, batch {config['batch_size']}, MLP width "
        f"{config['hidden_units']}.",
        "",
        "## Identifiability rate (test tokens; mean over folds [t 95% interval])",
        "",
        "Candidates: the input tokens of the same pair. L0 is the embedding output itself.",
        "",
        header,
        rule,
        *(fmt_row(name, rows) for name, rows in report["identifiability"].items()),
        "",
        "Learning rates chosen (per layer, by fold):",
        "",
        *(
            f"- `{name}`: " + "; ".join(f"L{i} {v}" for i, v in enumerate(by_layer))
            for name, by_layer in report["learning_rates_chosen"].items()
        ),
        "",
        "## Hidden-token attribution",
        "",
        "| norm | pairs | measure | " + " | ".join(f"L{i}" for i in range(1, layers)) + " |",
        "|---|---|---|" + "---|" * (layers - 1),
    ]
    for key in ("hta", "hta_frobenius", "hta_sum_same_pairs"):
        if key not in report:
            continue
        hta = report[key]
        for measure in ("own_contribution", "own_is_top_share"):
            values = " | ".join(f"{v:.3f}" for v in hta[measure])
            lines.append(f"| {hta['norm']} | {hta['sentences']} | {measure} | {values} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--learning-rates", type=floats, default=(3e-3, 1e-3, 3e-4))
    parser.add_argument("--rate-search", default="first-fold")
    parser.add_argument("--patience", type=int, default=20)
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--limit", type=int, default=None, help="dev pairs (default: all)")
    parser.add_argument("--frobenius-pairs", type=int, default=5)
    parser.add_argument("--finetune-epochs", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    seconds: dict[str, float] = {}

    start = time.perf_counter()
    tuned = FinetuneConfig(
        model=default_model_source(),
        dataset=str(MRPC),
        split="train",
        epochs=args.finetune_epochs,
    )
    model = finetune(tuned, device="cpu", architectures=ARCHITECTURES)
    seconds["finetune"] = round(time.perf_counter() - start, 1)
    accuracy = read_metadata(model)["eval_accuracy"]

    config = IdentifiabilityConfig(
        model=str(model),
        dataset=str(MRPC),
        split="dev",
        limit=args.limit,
        folds=args.folds,
        learning_rates=args.learning_rates,
        rate_search=args.rate_search,
        max_epochs=args.max_epochs,
        patience=args.patience,
        hta_limit=10**9,
        device="cpu",
    )
    loaded = load_model(config.model, "cpu", architectures=ARCHITECTURES)
    data, sentences = sentence_states(loaded, config)
    report = {
        "config": asdict(config) | {"hta_limit": None},
        "model": {"id": loaded.model_id, "weights_sha256": loaded.weights_sha256},
        "finetune_accuracy": accuracy,
        "dataset": {
            "name": data.name,
            "split": data.split,
            "sentences": len(sentences),
            "tokens": sum(s.shape[1] for s in sentences),
        },
        "candidates": "the input tokens of the same sentence",
        "seconds": seconds,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, no GPU",
        "load_average": {"before": list(load_before)},
    }
    # Each stage is written as soon as it ends: a run cut short keeps what it measured.
    start = time.perf_counter()
    learned = identifiability(loaded, sentences, config)
    seconds["maps"] = round(time.perf_counter() - start, 1)
    report["identifiability"] = summarize_rates(learned["rates"])
    report["learning_rates_chosen"] = learned["learning_rates_chosen"]
    write(report)
    start = time.perf_counter()
    report["hta"] = hta_analysis(loaded, sentences, config)
    seconds["hta_sum_all"] = round(time.perf_counter() - start, 1)
    write(report)
    shortest = sorted(sentences, key=lambda states: states.shape[1])[: args.frobenius_pairs]
    few = replace(config, hta_limit=args.frobenius_pairs)
    start = time.perf_counter()
    report["hta_frobenius"] = hta_analysis(loaded, shortest, replace(few, hta_norm="frobenius"))
    seconds["hta_frobenius"] = round(time.perf_counter() - start, 1)
    report["hta_frobenius"]["tokens_per_pair"] = [states.shape[1] for states in shortest]
    report["hta_sum_same_pairs"] = hta_analysis(loaded, shortest, few)
    write(report)
    print(markdown(report))


def write(report: dict) -> None:
    """The JSON, the Markdown and (once HTA is there) the plot of what is measured so far."""
    report["load_average"]["after"] = list(os.getloadavg())
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(report, RESULTS / "identifiability.json")
    (RESULTS / "identifiability.md").write_text(markdown(report))
    if "hta" in report:
        plot(report, RESULTS / "identifiability.png")


if __name__ == "__main__":
    main()
