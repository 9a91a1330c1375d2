"""The ``attrib-bench`` command: thin wrappers over the Python API.

User errors (UsageError) print one line and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from attrib_bench import __version__
from attrib_bench.console import stderr
from attrib_bench.errors import ExitCode, UsageError


def _csv(value: str) -> list[str]:
    return [item.strip() for item in _split_specs(value) if item.strip()]


def _split_specs(value: str) -> list[str]:
    """Split ``a,b:k=1,k2=2,c`` into specs: a comma followed by ``key=`` continues the params."""
    specs: list[str] = []
    for part in value.split(","):
        if specs and "=" in part and ":" in specs[-1] and ":" not in part:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def _add_data_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--dataset", help="hub id (glue/sst2), local file or folder, or 'default'")
    group.add_argument("--split", help="split name (default: validation, dev, test or train)")
    group.add_argument("--text-column", help="text column (default: detected)")
    group.add_argument("--text-pair-column", help="second text column for sentence pairs")
    group.add_argument("--label-column", help="label column (default: 'label' if present)")
    group.add_argument("--limit", type=int, help="use only the first N examples")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="hub id or local directory (default: embedded MiniLM)")
    _add_data_options(parser)
    parser.add_argument("--max-length", type=int, help="truncate inputs to N tokens")
    parser.add_argument(
        "--attributors",
        type=_csv,
        help="comma-separated specs (attention,rollout:residual=0.7)",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="PATH.py",
        help="load a local plugin module (repeatable)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attrib-bench",
        description="Benchmark token-attribution methods for transformer classifiers.",
    )
    parser.add_argument("--version", action="version", version=f"attrib-bench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="list attributors and evaluators")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--plugin", action="append", default=[], metavar="PATH.py")

    run = commands.add_parser("run", help="score attributors against a reference: leaderboard")
    _add_run_options(run)
    run.add_argument("--evaluators", type=_csv, help="comma-separated evaluator specs")
    run.add_argument("--reference", default="saliency", help="reference attributor spec")
    run.add_argument("--output", type=Path, help="write the result JSON here")

    attribute = commands.add_parser("attribute", help="write attributions as JSONL")
    _add_run_options(attribute)
    attribute.add_argument("--output", type=Path, required=True, help="JSONL file to write")

    finetune = commands.add_parser("finetune", help="fine-tune an encoder as a classifier")
    finetune.add_argument("--model", help="encoder hub id or local directory (default: MiniLM)")
    _add_data_options(finetune)
    finetune.set_defaults(split=None)
    finetune.add_argument("--output", type=Path, help="copy the fine-tuned model here")
    finetune.add_argument("--epochs", type=int, default=1)
    finetune.add_argument("--learning-rate", type=float, default=5e-5)
    finetune.add_argument("--batch-size", type=int, default=32)
    finetune.add_argument("--max-length", type=int, default=128)
    finetune.add_argument("--seed", type=int, default=0)
    finetune.add_argument("--device", default="auto")
    finetune.add_argument("--quiet", action="store_true")
    return parser


def _list(args: argparse.Namespace, out: Console) -> int:
    from rich.table import Table

    from attrib_bench.plugins import load_registry

    registry = load_registry(args.plugin)
    listing = {
        kind: [
            {"name": name, "description": reg.obj.description, "plugin": reg.source}
            for name, reg in sorted(table.items())
        ]
        for kind, table in (
            ("attributors", registry.attributors),
            ("evaluators", registry.evaluators),
        )
    }
    if args.json:
        out.print_json(json.dumps(listing))
        return ExitCode.OK
    for kind, rows in listing.items():
        table = Table(title=kind, title_justify="left")
        for column in ("name", "description", "plugin"):
            table.add_column(column)
        for row in rows:
            table.add_row(row["name"], row["description"], row["plugin"])
        out.print(table)
    return ExitCode.OK


def _run_config(args: argparse.Namespace):
    from attrib_bench.run import RunConfig

    return RunConfig(
        model=args.model,
        dataset=args.dataset,
        split=args.split,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        label_column=args.label_column,
        limit=args.limit,
        max_length=args.max_length,
        attributors=args.attributors,
        evaluators=getattr(args, "evaluators", None),
        reference=getattr(args, "reference", "saliency"),
        seed=args.seed,
        batch_size=args.batch_size,
        device=args.device,
        plugins=args.plugin,
    )


def _run(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.results import exit_status, leaderboard, write_json
    from attrib_bench.run import run_benchmark

    document = run_benchmark(_run_config(args), quiet=args.quiet)
    for name, evaluator in document["evaluators"].items():
        if evaluator["status"] == "ok":
            out.print(leaderboard(document, name))
        else:
            out.print(f"[red]evaluator {name} failed:[/] {escape(str(evaluator['error']))}")
    if args.output:
        write_json(document, args.output)
        stderr.print(f"results written to {args.output}")
    return ExitCode.OK if exit_status(document) else ExitCode.PARTIAL


def _attribute(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.attribute import write_attributions

    complete = write_attributions(_run_config(args), args.output, quiet=args.quiet)
    stderr.print(f"attributions written to {args.output}")
    return ExitCode.OK if complete else ExitCode.PARTIAL


def _finetune(args: argparse.Namespace, out: Console) -> int:
    from attrib_bench.model.finetune import (
        FinetuneConfig,
        default_model_source,
        finetune,
        read_metadata,
    )

    config = FinetuneConfig(
        model=args.model or default_model_source(),
        dataset=args.dataset,
        split=args.split,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        label_column=args.label_column,
        limit=args.limit,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        max_length=args.max_length,
        seed=args.seed,
    )
    directory = finetune(config, args.output, args.device, quiet=args.quiet)
    metadata = read_metadata(directory)
    accuracy = metadata["eval_accuracy"]
    shown = f"{accuracy:.4f} on {metadata['eval_split']}" if accuracy is not None else "n/a"
    out.print(f"model: {directory}\naccuracy: {shown}\ntraining seconds: {metadata['seconds']}")
    return ExitCode.OK


COMMANDS = {"list": _list, "run": _run, "attribute": _attribute, "finetune": _finetune}


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    # Wide tables in logs and pipes; a terminal keeps its own width.
    out = Console() if sys.stdout.isatty() else Console(width=160)
    try:
        return int(COMMANDS[args.command](args, out))
    except UsageError as error:
        stderr.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        return int(ExitCode.USAGE_ERROR)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
