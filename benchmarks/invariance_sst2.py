"""Invariance across fine-tuning seeds (Ren et al. 2023) with MiniLM on SST-2.

    python benchmarks/invariance_sst2.py [--seeds 0,1,2,3,4] [--train-limit 8000]
        [--similarity-limit 1200] [--dev-limit N] [--device cpu]
        [--maps linear,mlp,inn] [--map-epochs 300] [--maps-only] [--add-bert-inn]
        [--longer-epochs N]

1. Fine-tunes MiniLM once per seed on the first ``--train-limit`` SST-2 train sentences (one
   epoch; cached like ``attrib-bench finetune --seeds``) and reports each seed's dev accuracy.
2. Representation similarity (``attrib-bench similarity``) between every pair of seeds on the
   first ``--similarity-limit`` SST-2 train sentences, sentence means, every layer pair, with
   the random-init floors; the learned maps ``--maps`` on the diagonal for the first two seeds
   and their floors (they cost minutes per pair), held-out MSE with bootstrap intervals over
   sentences and each map's paired interval against the linear map.
3. The seed-invariance evaluator (``attrib-bench run --models``) for every built-in attributor
   of the default run on the SST-2 dev sentences: Spearman and top-5 Jaccard between every pair
   of seeds, and each seed against a random init (the floor), with bootstrap CIs; and the
   Kendall tau of the method ranking (Spearman with saliency) between seeds.
4. Writes benchmarks/results/invariance_sst2.{json,md,png}.

``--maps-only`` reruns step 2's learned maps alone and keeps every other section of the
committed JSON, after checking that it holds the same seeds and sentences; the maps must then
read the same weights as the committed similarity run (checked by their sha256).
``--add-bert-inn`` keeps the committed maps too and adds the released BERT-INN, one map for
every layer under its own schedule, fitted on the seeds' pair alone (not the floors) beside
the linear map, which must come out as committed.
``--longer-epochs N`` keeps everything committed and adds the linear map and the INN on the
seeds' pair alone trained for at most N epochs (early stopping aside), in a section of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from students_sst2 import (  # the students' tables
    bert_inn_line,
    bert_inn_options,
    check_weights,
    fit_bert_inn,
    map_lines,
    merge_bert_inn,
    pair_maps,
    paired_lines,
    start_line,
)

from attrib_bench.analyses.similarity import SimilarityConfig, run_similarity
from attrib_bench.core.registry import load_registry
from attrib_bench.model.finetune import (
    FinetuneConfig,
    default_model_source,
    finetune_seeds,
    read_metadata,
)
from attrib_bench.results import write_json
from attrib_bench.runner.models import run_models
from attrib_bench.runner.state import RunConfig

#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = load_registry().architecture_specs()

SST2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2"
RESULTS = Path(__file__).parent / "results"
CKA_FAMILY = ("linear_cka", "rbf_cka", "svcca", "pwcca", "procrustes", "linreg_r2")
#: Where ``--add-bert-inn`` writes its fit before merging it (``--bert-inn-run`` rereads it).
KEPT = Path(tempfile.gettempdir()) / "invariance_sst2_bert_inn.json"
JSON, MARKDOWN, PLOT = (RESULTS / f"invariance_sst2.{suffix}" for suffix in ("json", "md", "png"))
INVARIANCE = (
    ("seed-invariance", "Spearman, seeds"),
    ("seed-invariance:against=random-init", "Spearman, floor"),
    ("seed-invariance:measure=jaccard", "top-5 Jaccard, seeds"),
    ("seed-invariance:measure=jaccard,against=random-init", "top-5 Jaccard, floor"),
)


def diagonal(matrix: list[list[float | None]]) -> list[float | None]:
    return [matrix[i][i] for i in range(min(len(matrix), len(matrix[0])))]


def per_layer(report: dict, kind: str, measure: str) -> np.ndarray:
    """Diagonal values of ``measure`` for every pair of ``kind``: (pairs, layers), NaN = null."""
    rows = [
        [np.nan if v is None else v for v in diagonal(p["measures"][measure])]
        for p in report["pairs"]
        if p["kind"] == kind and measure in p["measures"]
    ]
    return np.array(rows, dtype=float)


def fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or np.isnan(value) else f"{value:.{digits}f}"


def similarity_lines(report: dict, measures: tuple[str, ...], title: str) -> list[str]:
    layers = len(diagonal(report["pairs"][0]["measures"][measures[0]]))
    seeds = per_layer(report, "models", measures[0]).shape[0]
    lines = [
        title,
        "",
        f"Layer pair (i, i), i = 0 (embeddings) .. {layers - 1}. `seeds`: mean over the {seeds} "
        "seed pairs [min, max]; `floor`: mean over seeds of seed -> random init; `random`: "
        "random init -> another random init.",
        "",
        "| measure | pairs | " + " | ".join(f"L{i}" for i in range(layers)) + " |",
        "|---|---|" + "---|" * layers,
    ]
    for measure in measures:
        for kind, label in (
            ("models", "seeds"),
            ("random-floor", "floor"),
            ("random-random", "random"),
        ):
            values = per_layer(report, kind, measure)
            if values.size == 0:
                continue
            cells = []
            for column in values.T:
                mean = np.nanmean(column) if np.isfinite(column).any() else np.nan
                cell = fmt(mean)
                if kind == "models" and len(column) > 1 and np.isfinite(column).any():
                    cell += f" [{fmt(np.nanmin(column))}, {fmt(np.nanmax(column))}]"
                cells.append(cell)
            lines.append(f"| `{measure}` | {label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def invariance_lines(document: dict) -> list[str]:
    methods = document["methods"]
    dev = document["provenance"]["dataset"]["examples"]
    models = document["models"]
    lines = [
        f"Seed invariance of attributions on {dev} SST-2 dev sentences: per example, the "
        "agreement of a method's last-layer aggregated row under two of the "
        f"{len(models['models'])} seed models (mean over seed pairs), or under a seed and a "
        "random init of MiniLM (the floor, mean over seeds); mean over examples [95% bootstrap "
        "CI]. Spearman with saliency is the per-model leaderboard score (the first seed's).",
        "",
        "| method | Spearman with saliency | "
        + " | ".join(label for _, label in INVARIANCE)
        + " |",
        "|---|---|" + "---|" * len(INVARIANCE),
    ]

    def cell(spec: str, evaluator: str) -> str:
        entry = methods[spec]["scores"].get(evaluator, {}).get("aggregated")
        if not entry or entry[-1]["mean"] is None:
            return "n/a"
        last = entry[-1]
        low, high = last["ci95"]
        return f"{last['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"

    order = sorted(
        methods,
        key=lambda s: -(methods[s]["scores"]["seed-invariance"]["aggregated"][-1]["mean"] or -9),
    )
    for spec in order:
        cells = [cell(spec, evaluator) for evaluator, _ in INVARIANCE]
        lines.append(f"| `{spec}` | {cell(spec, 'spearman')} | " + " | ".join(cells) + " |")
    ranking = models["ranking"]
    tau = np.array(
        [[np.nan if v is None else v for v in row] for row in ranking["kendall_tau"]], dtype=float
    )
    lines += [
        "",
        f"Stability of the leaderboard: Kendall tau-b between the seeds' rankings of "
        f"{len(ranking['methods'])} methods by Spearman with saliency (last layer, aggregated; "
        f"the reference left out): mean {fmt(ranking['mean'])}, min {fmt(ranking['min'])} over "
        f"{len(tau) * (len(tau) - 1) // 2} seed pairs.",
        "",
        "| method | " + " | ".join(f"seed {i}" for i in range(len(tau))) + " |",
        "|---|" + "---|" * len(tau),
    ]
    for spec in ranking["methods"]:
        values = [entry["last_layer"][spec]["spearman"] for entry in models["per_model"]]
        lines.append(f"| `{spec}` | " + " | ".join(f"{v:+.3f}" for v in values) + " |")
    return [*lines, ""]


def plot(similarity: dict, learned: dict, document: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    labels = {
        "models": "seed pairs",
        "random-floor": "seed -> random init",
        "random-random": "random -> random",
    }
    for kind, label in labels.items():
        values = per_layer(similarity, kind, "linear_cka")
        axes[0].plot(np.nanmean(values, axis=0), marker="o", label=label)
    axes[0].set(
        title="linear CKA, layer i vs layer i", xlabel="layer (0 = embeddings)", ylim=(0, 1.05)
    )
    axes[0].legend(fontsize=8)
    for name in learned["config"]["maps"]:
        for kind, style in (("models", "-"), ("random-floor", ":")):
            values = per_layer(learned, kind, f"{name}_mse")
            if values.size:
                axes[1].plot(
                    np.nanmean(values, axis=0),
                    style,
                    marker="o",
                    label=f"{name} ({labels[kind]})",
                )
    axes[1].set(
        title="held-out MSE of learned maps (seed 0 -> seed 1)", xlabel="layer (0 = embeddings)"
    )
    axes[1].set_yscale("symlog", linthresh=1e-3)  # bert-inn sits orders above the others
    axes[1].legend(fontsize=7)
    methods = document["methods"]
    names = sorted(
        methods,
        key=lambda s: methods[s]["scores"]["seed-invariance"]["aggregated"][-1]["mean"] or -9,
    )
    seeds = [methods[s]["scores"]["seed-invariance"]["aggregated"][-1]["mean"] for s in names]
    floors = [
        methods[s]["scores"]["seed-invariance:against=random-init"]["aggregated"][-1]["mean"]
        for s in names
    ]
    y = np.arange(len(names))
    axes[2].barh(y + 0.2, seeds, height=0.4, label="between seeds")
    axes[2].barh(y - 0.2, floors, height=0.4, label="seed vs random init (floor)")
    axes[2].set_yticks(y, names, fontsize=7)
    axes[2].set(title="seed invariance (Spearman, last layer)", xlim=(-0.2, 1.05))
    axes[2].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def summary(document: dict) -> dict:
    """The run's document without per-example scores and cache paths (12 MB -> 0.4 MB): every
    table and plot reads the per-layer summaries; the per-example scores are in the cache."""
    methods = {
        spec: {k: v for k, v in method.items() if k != "per_example"}
        for spec, method in document["methods"].items()
    }
    return {**{k: v for k, v in document.items() if k != "cache"}, "methods": methods}


def learned_section(learned: dict, maps: list[str], rerun: dict | None) -> list[str]:
    """The learned maps' tables (the students' layout), with how and where they were rerun."""
    lines = ["## Learned alignment maps, seed 0 -> seed 1 (held-out 30% of the sentences)", ""]
    if rerun is not None:
        lines += [
            f"Rerun alone with `{rerun['command']}` ({rerun['seconds']} s; load average "
            f"{rerun['load_before']:.1f} before, {rerun['load_after']:.1f} after): the maps "
            f"read the same weights as the similarity run above (sha256 checked), from the "
            f"cache directories {', '.join(f'`{name}`' for name in rerun['directories'])}.",
            "",
        ]
    epochs = learned["config"].get("map_epochs")
    return [
        *lines,
        f"Each map trained for at most {epochs} epochs. Held-out MSE in standardised units "
        "[bootstrap 95% interval over the held-out sentences]; `floor`: seed 0 -> a random "
        "init; `random`: random init -> another.",
        "",
        *map_lines(learned, maps),
        "",
        *([start_line(learned), ""] if "inn" in maps else []),
        *([bert_inn_line(learned), ""] if "bert_inn" in learned else []),
        f"Each map's held-out MSE minus `{maps[0]}`'s, with the paired bootstrap 95% interval "
        "(each draw of held-out sentences scores both maps); below zero: the map aligns better.",
        "",
        *paired_lines(learned, maps),
        "",
    ]


def longer_section(longer: dict) -> list[str]:
    """The seeds' pair's maps trained longer (``--longer-epochs``)."""
    report = longer["report"]
    maps = report["config"]["maps"]
    return [
        f"## Longer training: seed 0 -> seed 1, at most {report['config']['map_epochs']} epochs",
        "",
        f"`{longer['command']}` ({longer['seconds']} s; load average "
        f"{longer['load_before']:.1f} before, {longer['load_after']:.1f} after), on the seeds' "
        "pair alone (no floor), the same sentences, split and seed as above; early stopping "
        "with the same patience (30 epochs), the cosine schedule stretched to the budget.",
        "",
        *map_lines(report, maps),
        "",
        start_line(report),
        "",
        *paired_lines(report, maps),
        "",
    ]


def markdown(result: dict) -> str:
    """The whole page from the JSON, so a rerun of one stage renders it again."""
    similarity, learned = result["similarity"], result["learned_maps"]
    maps = learned["config"]["maps"]
    directories = [Path(model["name"]).name for model in similarity["models"]]
    lines = [
        "# Invariance across fine-tuning seeds: MiniLM-L6 on SST-2",
        "",
        f"`python benchmarks/invariance_sst2.py` on {os.cpu_count()} CPU cores, no GPU "
        f"(load average {result['load_average']:.1f} at the end of the whole run); seconds: "
        f"{result['timings']}.",
        "",
        "| seed | dev accuracy | fine-tuning seconds | model directory |",
        "|---|---|---|---|",
    ]
    for seed, meta, name in zip(result["seeds"], result["finetune"], directories, strict=True):
        lines.append(f"| {seed} | {meta['eval_accuracy']:.4f} | {meta['seconds']} | `{name}` |")
    lines += [""]
    lines += similarity_lines(
        similarity,
        CKA_FAMILY,
        f"## Representation similarity ({similarity['dataset']['sentences']} SST-2 train "
        "sentences, sentence means)",
    )
    lines += learned_section(learned, maps, result.get("learned_maps_rerun"))
    if "learned_maps_longer" in result:
        lines += longer_section(result["learned_maps_longer"])
    lines += ["## Seed invariance of attributions", "", *invariance_lines(result["invariance"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--train-limit", type=int, default=8000)
    parser.add_argument("--similarity-limit", type=int, default=1200)
    parser.add_argument("--dev-limit", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--maps", default="linear,mlp,inn")
    parser.add_argument("--map-epochs", type=int, default=300, help="each map's most epochs")
    parser.add_argument(
        "--maps-only", action="store_true", help="rerun the learned maps; keep the rest"
    )
    bert_inn_options(parser, "seeds", KEPT)
    parser.add_argument(
        "--longer-epochs",
        type=int,
        help="add the linear map and the INN on the seeds' pair at this many epochs",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    committed = None
    if args.maps_only or args.add_bert_inn or args.longer_epochs is not None:
        committed = json.loads(JSON.read_text())
        sentences = committed["similarity"]["dataset"]["sentences"]
        if committed["seeds"] != seeds or sentences != args.similarity_limit:
            raise SystemExit(
                f"{JSON} holds seeds {committed['seeds']} on {sentences} sentences, not "
                f"{seeds} on {args.similarity_limit}: rerun the whole benchmark instead"
            )
    timings = {}
    load_before = os.getloadavg()[0]

    start = time.perf_counter()
    config = FinetuneConfig(
        model=default_model_source(), dataset=str(SST2), split="train", limit=args.train_limit
    )
    directories = finetune_seeds(config, seeds, device=args.device, architectures=ARCHITECTURES)
    models = [str(d) for d in directories]
    finetuned = [read_metadata(d) for d in directories]
    timings["finetune_s"] = round(time.perf_counter() - start, 1)

    common = dict(dataset=str(SST2), split="train", limit=args.similarity_limit, device=args.device)
    if committed is not None:
        check_weights(models[:2], committed["similarity"])
    else:
        start = time.perf_counter()
        similarity = run_similarity(
            SimilarityConfig(models=models, learned=False, **common), architectures=ARCHITECTURES
        )
        timings["similarity_s"] = round(time.perf_counter() - start, 1)
    if args.add_bert_inn:
        run = (
            json.loads(args.bert_inn_run.read_text())
            if args.bert_inn_run
            else fit_bert_inn(models[:2], committed["learned_maps"], KEPT, **common)
        )
        learned = merge_bert_inn(committed["learned_maps"], run)
        write({**committed, "learned_maps": learned})
        return
    if args.longer_epochs is not None:
        section = longer(models[:2], args.longer_epochs, common)
        write_json(section, Path(tempfile.gettempdir()) / "invariance_sst2_longer.json")
        # the JSON as it is now: another stage's rerun may have been written meanwhile
        write({**json.loads(JSON.read_text()), "learned_maps_longer": section})
        return
    start = time.perf_counter()
    learned = run_similarity(
        SimilarityConfig(
            models=models[:2],
            maps=args.maps.split(","),
            maps_only=True,
            map_epochs=args.map_epochs,
            **common,
        ),
        architectures=ARCHITECTURES,
    )
    seconds = round(time.perf_counter() - start, 1)

    if committed is None:
        timings["learned_maps_s"] = seconds
        start = time.perf_counter()
        run = RunConfig(
            models=models, dataset=str(SST2), split="dev", limit=args.dev_limit, device=args.device
        )
        document = summary(run_models(run))
        timings["invariance_run_s"] = round(time.perf_counter() - start, 1)
        result = {
            "timings": timings,
            "load_average": os.getloadavg()[0],
            "seeds": seeds,
            "finetune": finetuned,
            "similarity": similarity,
            "learned_maps": learned,
            "invariance": document,
        }
    else:
        rerun = {
            "command": "python benchmarks/invariance_sst2.py --maps-only "
            f"--maps {args.maps} --map-epochs {args.map_epochs}",
            "seconds": seconds,
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
            "directories": [Path(model).name for model in models[:2]],
        }
        timings = {k: v for k, v in committed["timings"].items() if k != "learned_maps_s"}
        result = {
            **committed,
            "timings": timings,  # the maps' seconds are the rerun's, in ``rerun``
            "learned_maps": learned,
            "learned_maps_rerun": rerun,
        }
    write(result)


def longer(models: list[str], epochs: int, common: dict) -> dict:
    """The linear map and the INN on the seeds' pair alone, at most ``epochs`` epochs."""
    return {
        "command": f"python benchmarks/invariance_sst2.py --longer-epochs {epochs}",
        **pair_maps(models, ["linear", "inn"], epochs, **common),
    }


def write(result: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    text = markdown(result)
    MARKDOWN.write_text(text)
    write_json(result, JSON)
    plot(result["similarity"], result["learned_maps"], result["invariance"], PLOT)
    print(text)


if __name__ == "__main__":
    main()
