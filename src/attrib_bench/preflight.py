"""A heavy command's arguments checked before torch and transformers load.

Those imports take seconds, a minute on a loaded machine, and a typo used to cost them before
its one-line answer. Everything here reads only the arguments, the file system and the plugin
names listing (attrib_bench.core.plugin_names; without a fresh one, method names cost a
registry load: torch and the plugins, not transformers nor the data); what needs a model, the
data or a plugin file's own names is still checked by the run, as before. Messages are the
run's own.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

from attrib_bench.core.errors import UsageError, check_seed, unknown_choice
from attrib_bench.core.plugin_names import Listing, read_listing
from attrib_bench.core.target import Target
from attrib_bench.runner.distributed import launched, refuse

#: The commands whose settings are a RunConfig's (attrib_bench.runner.engine.prepare's checks).
RUN_COMMANDS = ("run", "attribute", "evaluate")
#: data.load.FILE_BUILDERS' suffixes (that module imports datasets): such a name is a file.
DATA_SUFFIXES = (".tsv", ".csv", ".jsonl", ".json", ".parquet")
#: A Hugging Face hub id, as huggingface_hub.utils.validate_repo_id accepts it.
HUB_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b")
#: (flag, smallest value) of the integer settings prepare and load_examples check.
AT_LEAST = (("limit", 1), ("batch_size", 1), ("max_length", 3))


def _hub_id(name: str) -> bool:
    return HUB_ID.fullmatch(name) is not None and "--" not in name and ".." not in name


def _check_model(name: str) -> None:
    """A ``--model`` that names a path (a .gguf, or what cannot be a hub id) not there."""
    path = Path(name).expanduser()
    if path.exists():
        return
    if path.suffix == ".gguf":  # model.load.find_gguf's message
        raise UsageError(f"model file {name!r} does not exist")
    if not _hub_id(name):
        raise UsageError(
            f"model {name!r} not found: no such local directory or .gguf file (and not a "
            "Hugging Face hub id)"
        )


def _missing_dataset(name: str) -> bool:
    """A ``--dataset`` that names a path (not a hub id, or a data file's suffix) not there."""
    if name == "default" or Path(name).expanduser().exists():
        return False
    return not _hub_id(name) or name.lower().endswith(DATA_SUFFIXES)


def _check_names(args: argparse.Namespace) -> None:
    """Unknown attributor and evaluator names, from the listing of the installed plugins'
    names; without one (stale or absent), from a full registry load now (torch and the
    plugins, not yet transformers and the data). Nothing when plugin files (``--plugin``, or a
    ``--config`` that may list some) add names, or a plugin failed to import (its names are
    unknown): the run's own checks answer then."""
    if getattr(args, "plugin", None) or getattr(args, "config", None) is not None:
        return
    given = [getattr(args, key, None) for key in ("attributors", "evaluators", "reference")]
    if not any(given):
        return
    listing = read_listing()
    if listing is None:
        from attrib_bench.core.registry import load_registry  # writes the listing, too

        registry = load_registry()
        listing = Listing(
            frozenset(registry.attributors), frozenset(registry.evaluators), bool(registry.broken)
        )
    if listing.broken:
        return
    for kind, specs, names in (
        ("attributor", getattr(args, "attributors", None), listing.attributors),
        ("evaluator", getattr(args, "evaluators", None), listing.evaluators),
    ):
        for spec in specs or ():
            name = spec.partition(":")[0].strip()  # registry.Spec's name
            if name and name not in names:
                raise unknown_choice(kind, name, names)
    reference = getattr(args, "reference", None)  # evaluate's may name a method of its file
    name = (reference or "").partition(":")[0].strip()
    if args.command == "run" and name and name not in listing.attributors:
        raise unknown_choice("reference attributor", reference, listing.attributors)


def check_arguments(args: argparse.Namespace) -> None:
    """Raise the UsageError a heavy command would raise after its imports, where the arguments
    alone decide it: missing files, a bad ``--target`` or ``--shard``, integers out of range,
    unknown method names. Under a launcher every process finds it alike: rank 0 says it."""
    try:
        _check_arguments(args)
    except UsageError as error:
        if launched():
            refuse(str(error))
        raise


def _check_context(args: argparse.Namespace) -> None:
    """``attrib-bench context``: its data is local (a JSONL file or an ERASER folder), its
    counts positive, its template names both fields (segments.scorer.check_template)."""
    if not Path(args.dataset).exists():
        raise UsageError(f"context dataset {args.dataset!r} not found: give a JSONL file or folder")
    for flag in ("limit", "generate", "batch_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if args.template is not None:
        from attrib_bench.segments.data import check_template

        check_template(args.template)


def _check_arguments(args: argparse.Namespace) -> None:
    config = getattr(args, "config", None)
    if config is not None and not Path(config).exists():
        raise UsageError(f"config file {str(config)!r} does not exist")
    for path in getattr(args, "plugin", None) or ():
        if not Path(path).is_file():
            raise UsageError(f"plugin file {str(path)!r} does not exist")
    models: Sequence[str] = getattr(args, "models", None) or ()
    if isinstance(models, str):  # similarity's --models is one comma-separated string
        models = [m.strip() for m in models.split(",") if m.strip()]
    for model in [getattr(args, "model", None), *models]:
        if model:
            _check_model(model)
    dataset = getattr(args, "dataset", None)
    if dataset and _missing_dataset(dataset):
        raise UsageError(
            f"dataset {dataset!r} not found: no such local file or folder, and not a Hugging "
            "Face hub id; use 'default', a local path, or a hub id"
        )
    attributions = getattr(args, "attributions", None)
    if args.command == "evaluate" and not Path(attributions).exists():
        raise UsageError(f"attributions file {str(attributions)!r} does not exist")
    if getattr(args, "target", None) is not None:
        Target.parse(args.target)
    if getattr(args, "shard", None) is not None:
        from attrib_bench.core.shards import parse_shard  # numpy: only when asked

        parse_shard(args.shard)
    if args.command == "context":
        _check_context(args)
    if args.command in RUN_COMMANDS:
        for flag, least in AT_LEAST:
            value = getattr(args, flag, None)
            if value is not None and value < least:
                name = flag.replace("_", "-")
                raise UsageError(f"--{name} must be at least {least}, got {value}")
        if getattr(args, "agreement_k", None) is not None and args.agreement_k < 0:
            raise UsageError(f"agreement_k must be at least 0 (0: off), got {args.agreement_k}")
        if getattr(args, "seed", None) is not None:
            check_seed(args.seed)
    _check_names(args)
