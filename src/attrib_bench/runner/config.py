"""Benchmark configs as TOML files (``attrib-bench run --config bench.toml``).

A file holds what the ``run`` flags hold, plus ``output``, ``cache`` and an optional
``[finetune]`` table that builds the model first (cached, as ``attrib-bench finetune``).
Methods are listed as specs or as tables, so one method can appear with several parameter sets::

    attributors = ["globenc", "rollout:residual=0.9", { name = "norm", normalize_rows = true }]

Relative paths are read from the file's folder: always for ``output`` and ``plugins``; for
``model`` and ``dataset`` when such a path exists there (otherwise they stay hub ids or
``default``). Flags given on the command line override the file; flags left out do not.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from attrib_bench.core.errors import UsageError
from attrib_bench.runner.state import RunConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

STRINGS = (
    "model",
    "dataset",
    "split",
    "text_column",
    "text_pair_column",
    "label_column",
    "device",
    "output",
    "target",
    "shard",
)
INTEGERS = ("limit", "max_length", "seed", "batch_size", "agreement_k")
SPEC_LISTS = ("attributors", "evaluators")
FINETUNE_STRINGS = ("model", "dataset", "split", "text_column", "text_pair_column", "label_column")
FINETUNE_NUMBERS = {
    "limit": int,
    "epochs": int,
    "batch_size": int,
    "max_length": int,
    "seed": int,
    "learning_rate": float,
}
TOP_LEVEL = frozenset(
    (
        *STRINGS,
        *INTEGERS,
        *SPEC_LISTS,
        "models",
        "reference",
        "plugins",
        "cache",
        "floor",
        "finetune",
    )
)
#: RunConfig field -> the ``run`` flag's attribute in the parsed arguments.
FLAGS = {f.name: f.name for f in fields(RunConfig)} | {"plugins": "plugin"}


@dataclass
class RunPlan:
    """A resolved ``run``: its RunConfig, where the result goes, and how the model is made."""

    config: RunConfig
    output: Path | None = None
    cache: bool = True
    finetune: Any = None
    source: Path | None = None
    #: Extra top-level keys for the result document (the fine-tuning metadata).
    extra: dict[str, Any] = field(default_factory=dict)


def _spec(value: Any, where: str) -> str:
    """A spec string from ``"name:k=v"`` or ``{ name = "...", k = v }``."""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise UsageError(f"{where}: write a spec string or a table with a 'name', got {value!r}")
    params = []
    for key, raw in value.items():
        if key == "name":
            continue
        if isinstance(raw, (dict, list)):
            raise UsageError(f"{where}: parameter {key!r} must be a single value, got {raw!r}")
        text = str(raw).lower() if isinstance(raw, bool) else str(raw)
        params.append(f"{key}={text}")
    return value["name"] + (":" + ",".join(params) if params else "")


def _check(value: Any, kind: type, key: str, path: Path) -> Any:
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise UsageError(f"{path}: {key} must be an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise UsageError(f"{path}: {key} must be a number, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise UsageError(f"{path}: {key} must be a string, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise UsageError(f"{path}: {key} must be true or false, got {value!r}")
    return value


def _local(value: str, folder: Path) -> str:
    """A path relative to the config's folder when it exists there; else the value unchanged."""
    candidate = folder / Path(value).expanduser()
    return str(candidate.resolve()) if candidate.exists() else value


def _unknown(keys: set[str], valid: frozenset[str] | tuple, path: Path, table: str) -> None:
    if keys:
        raise UsageError(
            f"{path}: unknown {table} key(s) {', '.join(sorted(keys))}; valid keys: "
            + ", ".join(sorted(valid))
        )


def read_config(path: Path | str) -> dict[str, Any]:
    """The file's settings, checked and with paths resolved; keys are RunConfig fields, plus
    ``output``, ``cache`` and ``finetune`` (a FinetuneConfig)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"config file {str(path)!r} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"config file {str(path)!r} is not valid TOML: {error}") from None
    folder = path.resolve().parent
    _unknown(set(data) - TOP_LEVEL, TOP_LEVEL, path, "top-level")
    values: dict[str, Any] = {}
    for key in STRINGS:
        if key in data:
            values[key] = _check(data[key], str, key, path)
    for key in INTEGERS:
        if key in data:
            values[key] = _check(data[key], int, key, path)
    for key in SPEC_LISTS:
        if key in data:
            if not isinstance(data[key], list) or not data[key]:
                raise UsageError(f"{path}: {key} must be a non-empty list of specs")
            values[key] = [_spec(item, f"{path}: {key}") for item in data[key]]
    if "models" in data:
        if not isinstance(data["models"], list) or len(data["models"]) < 2:
            raise UsageError(f"{path}: models must be a list of at least 2 models")
        values["models"] = [_local(_check(m, str, "models", path), folder) for m in data["models"]]
    if "reference" in data:
        values["reference"] = _spec(data["reference"], f"{path}: reference")
    if "plugins" in data:
        if not isinstance(data["plugins"], list):
            raise UsageError(f"{path}: plugins must be a list of paths")
        values["plugins"] = [str(folder / _check(p, str, "plugins", path)) for p in data["plugins"]]
    if "cache" in data:
        values["cache"] = _check(data["cache"], bool, "cache", path)
    if "floor" in data:  # false: no `random` floor row (``--no-floor``)
        values["floor"] = _check(data["floor"], bool, "floor", path)
    for key in ("model", "dataset"):
        if key in values:
            values[key] = _local(values[key], folder)
    if "output" in values:
        values["output"] = folder / values["output"]
    if "finetune" in data:
        if "model" in data:
            raise UsageError(
                f"{path}: give either model (a classifier) or [finetune] (how to make one), "
                "not both; [finetune] takes its base encoder as its own 'model' key"
            )
        values["finetune"] = _finetune(data["finetune"], folder, path)
    return values


def _finetune(table: Any, folder: Path, path: Path) -> Any:
    from attrib_bench.model.finetune import FinetuneConfig, default_model_source

    if not isinstance(table, dict):
        raise UsageError(f"{path}: finetune must be a table ([finetune])")
    valid = (*FINETUNE_STRINGS, *FINETUNE_NUMBERS)
    _unknown(set(table) - set(valid), valid, path, "[finetune]")
    settings: dict[str, Any] = {}
    for key in FINETUNE_STRINGS:
        if key in table:
            settings[key] = _check(table[key], str, f"finetune.{key}", path)
    for key, kind in FINETUNE_NUMBERS.items():
        if key in table:
            settings[key] = kind(_check(table[key], kind, f"finetune.{key}", path))
    for key in ("model", "dataset"):
        if key in settings:
            settings[key] = _local(settings[key], folder)
    settings.setdefault("model", default_model_source())
    return FinetuneConfig(**settings)


def make_plan(source: Path | str | None, overrides: Mapping[str, Any]) -> RunPlan:
    """The file's settings (if any) with ``overrides`` on top: RunConfig fields, ``output``,
    ``cache``. A ``model`` override replaces the file's ``[finetune]`` recipe."""
    valid = {*FLAGS, "output", "cache"}
    unknown = set(overrides) - valid
    if unknown:
        raise UsageError(
            f"unknown setting(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(valid))}"
        )
    values = read_config(source) if source is not None else {}
    values.update(overrides)
    if "model" in overrides:
        values.pop("finetune", None)
    return RunPlan(
        config=RunConfig(**{k: v for k, v in values.items() if k in FLAGS}),
        output=Path(values["output"]) if values.get("output") is not None else None,
        cache=values.get("cache", True),
        finetune=values.get("finetune"),
        source=Path(source) if source is not None else None,
    )


def build_model(plan: RunPlan, quiet: bool = False) -> RunPlan:
    """Fine-tune the model the plan's ``[finetune]`` describes (cached) and point the run at it."""
    if plan.finetune is None:
        return plan
    from attrib_bench.core.registry import load_registry
    from attrib_bench.model.finetune import finetune, read_metadata

    architectures = load_registry(plan.config.plugins).architecture_specs()
    directory = finetune(
        plan.finetune, device=plan.config.device, quiet=quiet, architectures=architectures
    )
    plan.config.model = str(directory)
    plan.extra["finetune"] = read_metadata(directory)
    return plan
