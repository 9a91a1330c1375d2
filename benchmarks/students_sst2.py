"""Seed models that differ from the first layer: students of MiniLM-L6, and how nearly they
compute the teacher's function.

    python benchmarks/students_sst2.py [--seeds 0,1,2] [--reinit-top 6] [--steps 1500]
        [--learning-rate 1e-3] [--train-limit 8000] [--similarity-limit 600]
        [--maps linear,mlp,inn,bert-inn] [--map-epochs 300] [--no-similarity] [--maps-only]
        [--add-bert-inn]

1. Per seed, ``attrib-bench finetune --reinit-top K``: all six layers (``6``, the embeddings
   kept, so layer 0 is the teacher's) or every encoder weight (``all``) re-initialised from the
   seed and distilled on the teacher's last-layer hidden states over the first
   ``--train-limit`` SST-2 train sentences, then fine-tuned on them as the teacher is (one
   epoch). Cached like any fine-tune.
2. The teacher's own fine-tune with the same seeds and data (the plain fine-tuning seeds).
3. Agreement: each student's reconstruction R^2 of the teacher's last hidden states on 256
   held-out dev sentences (1 - MSE / the hidden states' variance), dev accuracy, and the share
   of the 872 dev sentences on which its prediction equals the same seed's fine-tuned teacher.
4. Ren et al.'s question on the students (``attrib-bench similarity --token-level``, every
   real token of the first ``--similarity-limit`` SST-2 train sentences a row): the CKA family
   between every pair of students with the random-init floors, and the learned maps ``--maps``
   from the first student to the second and to its floor, per layer, held-out MSE with
   bootstrap intervals over sentences. Does a bijective map align seeds better than a linear
   one?
Writes benchmarks/results/students_sst2.{json,md}, with seconds and the machine's load.

``--maps-only`` reruns step 4's learned maps alone and keeps every other section of the
committed JSON, after checking that it was made with the same configuration but the maps; the
maps must read the students the committed similarity run read (checked by their sha256).
``--add-bert-inn`` keeps the committed maps too and adds the released BERT-INN, one map for
every layer under its own schedule, fitted on the students' pair alone (not the floors: about
6 minutes a layer here) beside the linear map, which must come out as committed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from attrib_bench.analyses.similarity import SimilarityConfig, run_similarity
from attrib_bench.core.registry import load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.finetune import (
    ALL_LAYERS,
    FinetuneConfig,
    default_model_source,
    finetune_seeds,
    read_metadata,
)
from attrib_bench.model.load import load_model
from attrib_bench.results import write_json

SST2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2"
RESULTS = Path(__file__).parent / "results"
JSON = RESULTS / "students_sst2.json"
#: Where ``--add-bert-inn`` writes its fit before merging it (``--bert-inn-run`` rereads it).
KEPT = Path(tempfile.gettempdir()) / "students_sst2_bert_inn.json"
ARCHITECTURES = load_registry().architecture_specs()


def predictions(model_dir: Path, examples: list) -> torch.Tensor:
    loaded = load_model(str(model_dir), "cpu", architectures=ARCHITECTURES)
    batches, _ = make_batches(examples, loaded.tokenizer, 64, 128)
    out = []
    with torch.no_grad():
        for batch in batches:
            out.append(loaded.model(**batch.model_inputs()).logits.argmax(-1))
    return torch.cat(out)


CKA_FAMILY = ("linear_cka", "rbf_cka", "svcca", "pwcca", "procrustes", "linreg_r2")
KINDS = (("models", "seeds"), ("random-floor", "floor"), ("random-random", "random"))


def diagonal(matrix: list[list]) -> list:
    return [matrix[i][i] for i in range(min(len(matrix), len(matrix[0])))]


def number(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def header(first_column: str, layers: int) -> list[str]:
    """A table's head: the first column, the pair kind, then one column per layer."""
    return [
        f"| {first_column} | pairs | " + " | ".join(f"L{i}" for i in range(layers)) + " |",
        "|---|---|" + "---|" * layers,
    ]


def cka_lines(report: dict) -> list[str]:
    """Per measure and pair kind, the diagonal (i, i): seeds as mean [min, max] over the pairs."""
    layers = len(diagonal(report["pairs"][0]["measures"]["linear_cka"]))
    lines = header("measure", layers)
    for measure in CKA_FAMILY:
        for kind, label in KINDS:
            rows = [diagonal(p["measures"][measure]) for p in report["pairs"] if p["kind"] == kind]
            if not rows:
                continue
            cells = []
            for column in zip(*rows, strict=True):
                known = [v for v in column if v is not None]
                cell = number(sum(known) / len(known) if known else None)
                if kind == "models" and len(known) > 1:
                    cell += f" [{number(min(known))}, {number(max(known))}]"
                cells.append(cell)
            lines.append(f"| `{measure}` | {label} | " + " | ".join(cells) + " |")
    return lines


def fitted(pair: dict, name: str) -> bool:
    """Whether the map was fitted on the pair (a floor's pair may have none: --floor-maps)."""
    values = pair["measures"].get(f"{name}_mse")
    return values is not None and any(v is not None for v in diagonal(values))


def map_lines(report: dict, maps: list[str]) -> list[str]:
    """Per map and pair kind, the held-out MSE on the diagonal with its interval."""
    layers = len(diagonal(report["pairs"][0]["measures"][f"{maps[0]}_mse"]))
    lines = header("map", layers)
    for name in maps:
        for kind, label in KINDS:
            for pair in (p for p in report["pairs"] if p["kind"] == kind):
                if not fitted(pair, name):
                    continue
                values = diagonal(pair["measures"][f"{name}_mse"])
                bounds = diagonal(pair["intervals"][f"{name}_mse"])
                cells = [
                    f"{number(v)} [{number(b[0])}, {number(b[1])}]" if b else number(v)
                    for v, b in zip(values, bounds, strict=True)
                ]
                lines.append(f"| `{name}` | {label} | " + " | ".join(cells) + " |")
                break
    return lines


def start_line(report: dict) -> str:
    """Where the INN began on each pair kind's diagonal (the report's ``starts``)."""
    parts = []
    for kind, label in KINDS:
        for pair in (p for p in report["pairs"] if p["kind"] == kind):
            starts = diagonal(pair.get("starts", {}).get("inn", [[None]]))
            known = [start for start in starts if start is not None]
            if known:
                layers = ", ".join(f"L{i} {start}" for i, start in enumerate(starts))
                same = len(set(known)) == 1 and len(known) == len(starts)
                parts.append(f"{label}: {known[0] + ' at every layer' if same else layers}")
            break
    if not parts:
        return "The report does not record where the INN began (made before it did)."
    return "Where the INN began: " + "; ".join(parts) + "."


def difference(value: float, interval: list[float]) -> str:
    """A difference with its interval: three decimals, or two significant digits where all
    three round to zero (a difference of 2e-4 is not 0.000), and 0 where the maps are equal."""
    largest = max(abs(value), *map(abs, interval))
    if largest == 0:
        return "0 [0, 0]"
    if largest >= 5e-4:
        return f"{value:+.3f} [{interval[0]:+.3f}, {interval[1]:+.3f}]"
    return f"{value:+.1e} [{interval[0]:+.1e}, {interval[1]:+.1e}]"


def paired_lines(report: dict, maps: list[str]) -> list[str]:
    """Per map after the first and pair kind, its held-out MSE minus the first map's on the
    diagonal, with the paired bootstrap interval (one draw of sentences scores both maps)."""
    first = maps[0]
    layers = len(diagonal(report["pairs"][0]["measures"][f"{first}_mse"]))
    lines = header("map", layers)
    for name in maps[1:]:
        for kind, label in KINDS:
            pair = next((p for p in report["pairs"] if p["kind"] == kind), None)
            if pair is None or not fitted(pair, name):
                continue
            ours = diagonal(pair["measures"][f"{name}_mse"])
            theirs = diagonal(pair["measures"][f"{first}_mse"])
            bounds = diagonal(pair["intervals"][f"{name}_mse_minus_{first}"])
            cells = [
                difference(a - b, c) if None not in (a, b, c) else "n/a"
                for a, b, c in zip(ours, theirs, bounds, strict=True)
            ]
            lines.append(f"| `{name}` − `{first}` | {label} | " + " | ".join(cells) + " |")
    return lines


def reinit_top(value: str) -> int:
    return ALL_LAYERS if value == "all" else int(value)


def check_weights(models: list[str], report: dict) -> None:
    """Stop unless ``models`` hold the weights of ``report``'s first models (a similarity
    report's sha256), so that a rerun of one stage reads what the committed run read."""
    expected = [model["weights_sha256"] for model in report["models"]]
    for model, sha in zip(models, expected, strict=False):
        if load_model(model, "cpu", architectures=ARCHITECTURES).weights_sha256 != sha:
            raise SystemExit(f"{model} does not hold the weights the committed run read")


def pair_maps(models: list[str], maps: list[str], epochs: int, **common) -> dict:
    """The learned ``maps`` on the models' pair alone (no floor), timed: the similarity report
    with its seconds, the load before and after, and the torch threads."""
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    report = run_similarity(
        SimilarityConfig(
            models=models,
            maps=maps,
            floor_maps=[],
            maps_only=True,
            map_epochs=epochs,
            **common,
        ),
        architectures=ARCHITECTURES,
    )
    return {
        "report": report,
        "seconds": round(time.perf_counter() - start, 1),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "threads": torch.get_num_threads(),
    }


def bert_inn_options(parser: argparse.ArgumentParser, pair: str, kept: Path) -> None:
    """``--add-bert-inn`` and ``--bert-inn-run``, for the ``pair`` of a seed benchmark."""
    parser.add_argument(
        "--add-bert-inn",
        action="store_true",
        help=f"add the released BERT-INN on the {pair}' pair to the committed maps",
    )
    parser.add_argument(
        "--bert-inn-run", type=Path, help=f"with --add-bert-inn: merge this kept run ({kept})"
    )


def fit_bert_inn(models: list[str], maps_report: dict, kept: Path, **common) -> dict:
    """The released BERT-INN on ``models`` alone (one map for every layer pair) beside the
    linear map (the paired difference's first map), with ``maps_report``'s epochs
    (``pair_maps``), written to ``kept`` before anything else (the fit is the slow part;
    ``--bert-inn-run`` merges it again)."""
    config = maps_report["config"]
    if "bert-inn" in config["maps"] or config["maps"][0] != "linear":
        raise SystemExit("--add-bert-inn needs committed maps led by linear, without bert-inn")
    run = pair_maps(models, ["linear", "bert-inn"], config["map_epochs"], **common)
    write_json(run, kept)
    return run


def merge_bert_inn(maps_report: dict, run: dict) -> dict:
    """``maps_report`` (a committed ``--maps-only`` similarity report) with ``run``'s released
    BERT-INN added on its models' pair. Stops unless both read the same sentences with the same
    seed and epochs; the linear maps' largest difference is recorded (the thread count moves
    the early-stopped fit by up to 6e-4 here). The floors' pairs keep the committed maps only
    (``config.floor_maps``)."""
    report, config = run["report"], maps_report["config"]
    same = ("seed", "map_epochs", "limit", "token_level")
    if report["dataset"] != maps_report["dataset"] or any(
        report["config"][key] != config[key] for key in same
    ):
        raise SystemExit("the BERT-INN run read other sentences or settings than the committed")
    merged = json.loads(json.dumps(maps_report))
    pair = next(p for p in merged["pairs"] if p["kind"] == "models")
    new = next(p for p in report["pairs"] if p["kind"] == "models")
    ours, theirs = (diagonal(p["measures"]["linear_mse"]) for p in (new, pair))
    for part in ("measures", "intervals"):
        pair[part].update({k: v for k, v in new[part].items() if k.startswith("bert-inn_")})
    merged["config"]["floor_maps"] = list(config["maps"])
    merged["config"]["maps"] = [*config["maps"], "bert-inn"]
    merged["config"]["measures"] += ["bert-inn_mse", "bert-inn_r2"]
    merged["bert_inn"] = {
        **{key: value for key, value in run.items() if key != "report"},
        "layer_pairs": sum(v is not None for v in diagonal(new["measures"]["bert-inn_mse"])),
        "linear_difference": max(abs(a - b) for a, b in zip(ours, theirs, strict=True)),
    }
    return merged


def bert_inn_line(maps_report: dict) -> str:
    """How the released BERT-INN's rows were made, where a report holds them."""
    added = maps_report.get("bert_inn")
    if added is None:
        return ""
    parts = [added["note"]] if "note" in added else []
    if added["load_before"] is not None:
        before, after = added["load_before"], added["load_after"]
        parts.insert(0, f"load average {before:.1f} before, {after:.1f} after")
    load = "; ".join(parts)
    return (
        f"`bert-inn` is the released BERT-INN: one map for all {added['layer_pairs']} layer "
        "pairs, trained as the official code trains it (3,000 batches of 64 in order, Adam at "
        "1e-6 decayed by 0.99 a batch, its random start), on the seeds' pair alone, added to "
        f"the other maps by `--add-bert-inn` in {added['seconds']} s on {added['threads']} "
        f"thread(s) ({load}). Its paired difference is against that run's linear map, whose MSE "
        f"is within {added['linear_difference']:.0e} of the one above (early stopping moves "
        "with the thread count)."
    )


def agreement(seeds: list[int], teachers: list[Path], students: list[Path]) -> list[dict]:
    """Per seed, how nearly the student computes its teacher's function (step 3)."""
    dev = load_examples(str(SST2), "dev").examples
    rows = []
    for seed, teacher, student in zip(seeds, teachers, students, strict=True):
        meta, teacher_meta = read_metadata(student), read_metadata(teacher)
        agree = (predictions(student, dev) == predictions(teacher, dev)).double().mean()
        rows.append(
            {
                "seed": seed,
                "r2": 1 - meta["reinit_mse_after"] / meta["reinit_target_variance"],
                "mse_before": meta["reinit_mse_before"],
                "mse_after": meta["reinit_mse_after"],
                "variance": meta["reinit_target_variance"],
                "student_accuracy": meta["eval_accuracy"],
                "teacher_accuracy": teacher_meta["eval_accuracy"],
                "agreement": float(agree),
                "distillation_seconds": meta["reinit_seconds"],
                "student": str(student),
                "teacher": str(teacher),
            }
        )
    return rows


def markdown(report: dict) -> str:
    every = report["config"].get("reinit_top", "all") == "all"
    which = "every weight from the seed" if every else "every layer from the seed"
    if not every:
        which += ", the teacher's embeddings"
    lines = [
        f"# Students of MiniLM-L6 ({which}) against the teacher, SST-2",
        "",
        f"`python benchmarks/students_sst2.py` on {report['machine']}; load average "
        f"{report['load_average']['before'][0]:.1f} before, "
        f"{report['load_average']['after'][0]:.1f} after; seconds: {report['seconds']}.",
        "",
    ]
    if report.get("maps_only"):
        lines += [
            "The learned maps were rerun alone (`--maps-only`, the load above is that run's); "
            "the agreement rows and the similarity section, with their seconds, are the "
            "earlier full run's, on the same students (sha256 checked).",
            "",
        ]
    lines += [
        f"Distillation: {report['config']['steps']} steps of batch 32 at learning rate "
        f"{report['config']['learning_rate']} (AdamW, linear decay to 10%) on the last-layer "
        f"hidden states of {report['config']['train_limit']} SST-2 train sentences; then one "
        "epoch of fine-tuning on them, as the teacher's fine-tune. R^2: 1 - reconstruction MSE / "
        "the teacher's hidden-state variance, on 256 held-out dev sentences. Agreement: share of "
        "the 872 dev sentences where the student predicts what the same seed's fine-tuned "
        "teacher predicts.",
        "",
        "| seed | R^2 of last hidden states | MSE before -> after (variance) | student dev "
        "accuracy | teacher dev accuracy | prediction agreement | distillation seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["seeds"]:
        lines.append(
            f"| {row['seed']} | {row['r2']:.3f} | {row['mse_before']:.3f} -> "
            f"{row['mse_after']:.3f} ({row['variance']:.3f}) | {row['student_accuracy']:.3f} | "
            f"{row['teacher_accuracy']:.3f} | {row['agreement']:.3f} | "
            f"{row['distillation_seconds']} |"
        )
    similarity = report.get("similarity")
    if similarity is not None:
        data = similarity["cka"]["dataset"]
        lines += [
            "",
            f"## Representation similarity between the students ({data['rows']} tokens of "
            f"{data['sentences']} SST-2 train sentences)",
            "",
            "Layer pair (i, i), i = 0 (the embedding output) .. 6"
            + ("." if every else ", layer 0 the teacher's in every student.")
            + " `seeds`: mean over the student pairs [min, max]; `floor`: student -> a random "
            "init of MiniLM-L6 (mean over students); `random`: random init -> another.",
            "",
            *cka_lines(similarity["cka"]),
            "",
            "## Learned maps, student 0 -> student 1 (held-out 30% of the sentences)",
            "",
            "Held-out MSE in standardised units [bootstrap 95% interval over the held-out "
            "sentences]; `floor`: student 0 -> a random init; `random`: random -> random.",
            "",
            *map_lines(similarity["maps"], report["config"]["maps"]),
            "",
            start_line(similarity["maps"]),
            "",
            *([bert_inn_line(similarity["maps"]), ""] if "bert_inn" in similarity["maps"] else []),
            "Each map's held-out MSE minus the first map's, with the paired bootstrap 95% "
            "interval (each draw of held-out sentences scores both maps); below zero: the map "
            "aligns better than the first.",
            "",
            *paired_lines(similarity["maps"], report["config"]["maps"]),
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--reinit-top", default="6", help="6 (every layer) or all (the embeddings too)"
    )
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--train-limit", type=int, default=8000)
    parser.add_argument("--similarity-limit", type=int, default=600)
    parser.add_argument("--maps", default="linear,mlp,inn,bert-inn")
    parser.add_argument("--map-epochs", type=int, default=300, help="each map's most epochs")
    parser.add_argument("--no-similarity", action="store_true")
    parser.add_argument(
        "--maps-only", action="store_true", help="rerun the learned maps; keep the rest"
    )
    bert_inn_options(parser, "students", KEPT)
    args = parser.parse_args()
    maps = args.maps.split(",")
    if args.add_bert_inn:
        maps = [*json.loads(JSON.read_text())["config"]["maps"], "bert-inn"]
    seeds = [int(s) for s in args.seeds.split(",")]
    config = {
        "seeds": seeds,
        "reinit_top": args.reinit_top,
        "steps": args.steps,
        "learning_rate": args.learning_rate,
        "train_limit": args.train_limit,
        "similarity_limit": args.similarity_limit,
        "maps": maps,
        "map_epochs": args.map_epochs,
    }
    committed = json.loads(JSON.read_text()) if args.maps_only or args.add_bert_inn else None
    if committed is not None:
        kept = ("maps", "map_epochs")
        differs = {
            key: value
            for key, value in committed["config"].items()
            if key not in kept and config[key] != value
        }
        if differs or committed["similarity"] is None or args.no_similarity:
            raise SystemExit(
                f"{JSON} was made with {differs or 'no similarity'}: rerun the whole benchmark"
            )
    load_before = os.getloadavg()
    base = FinetuneConfig(
        model=default_model_source(), dataset=str(SST2), split="train", limit=args.train_limit
    )
    start = time.perf_counter()
    teachers = finetune_seeds(base, seeds, device="cpu", architectures=ARCHITECTURES)
    seconds = {"teachers": round(time.perf_counter() - start, 1)}
    start = time.perf_counter()
    student_config = FinetuneConfig(
        **{
            **base.__dict__,
            "reinit_top": reinit_top(args.reinit_top),
            "reinit_steps": args.steps,
            "reinit_learning_rate": args.learning_rate,
        }
    )
    students = finetune_seeds(student_config, seeds, device="cpu", architectures=ARCHITECTURES)
    seconds["students"] = round(time.perf_counter() - start, 1)
    rows = agreement(seeds, teachers, students) if committed is None else committed["seeds"]
    similarity = None
    if not args.no_similarity:
        common = dict(
            dataset=str(SST2),
            split="train",
            limit=args.similarity_limit,
            token_level=True,
            device="cpu",
        )
        models = [str(student) for student in students]
        if committed is not None:
            check_weights(models[:2], committed["similarity"]["cka"])
        start = time.perf_counter()
        if committed is None:
            cka = run_similarity(
                SimilarityConfig(models=models, learned=False, **common),
                architectures=ARCHITECTURES,
            )
            seconds["similarity"] = round(time.perf_counter() - start, 1)
        else:
            cka = committed["similarity"]["cka"]
            seconds["similarity"] = committed["seconds"]["similarity"]
        if args.add_bert_inn:
            maps_report = committed["similarity"]["maps"]
            run = (
                json.loads(args.bert_inn_run.read_text())
                if args.bert_inn_run
                else fit_bert_inn(models[:2], maps_report, KEPT, **common)
            )
            learned = merge_bert_inn(maps_report, run)
            seconds["learned_maps"] = committed["seconds"]["learned_maps"]
        else:
            start = time.perf_counter()
            learned = run_similarity(
                SimilarityConfig(
                    models=models[:2],
                    maps=maps,
                    maps_only=True,
                    map_epochs=args.map_epochs,
                    **common,
                ),
                architectures=ARCHITECTURES,
            )
            seconds["learned_maps"] = round(time.perf_counter() - start, 1)
        similarity = {"cka": cka, "maps": learned}
    report = {
        "config": config,
        "seeds": rows,
        "similarity": similarity,
        "seconds": seconds,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, no GPU",
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "maps_only": committed is not None,
    }
    if args.add_bert_inn:  # the load above is the maps' run's, not this one's
        report["load_average"] = committed["load_average"]
        report["machine"] = committed["machine"]
    write_json(report, JSON)
    (RESULTS / "students_sst2.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
