"""The result document (schema-versioned JSON with provenance) and the terminal leaderboard."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rich.table import Table

from attrib_bench.interfaces import KINDS
from attrib_bench.stats import summarize, summarize_corpus

if TYPE_CHECKING:
    from attrib_bench.runner import MethodState, Prepared, RunConfig

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "schema" / "results.schema.json"
PACKAGES = ("attrib-bench", "torch", "transformers", "captum", "datasets", "pluggy", "scipy")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def hardware(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def build_result(
    config: RunConfig,
    prepared: Prepared,
    methods: list[MethodState],
    evaluators: dict[str, Any],
    evaluator_errors: dict[str, str],
) -> dict[str, Any]:
    from attrib_bench.data.rationales import rationale_words_lost

    registry = prepared.registry
    example_ids = [e.id for e in prepared.data.examples]
    method_docs: dict[str, Any] = {}
    for method in methods:
        name = method.spec.partition(":")[0]
        doc: dict[str, Any] = {
            "name": name,
            "plugin": registry.attributors[name].source,
            "status": "failed" if method.error else "ok",
            "error": method.error,
            "seconds_per_example": (
                method.seconds / method.examples if method.examples and not method.error else None
            ),
            "peak_memory_mb": (
                round(method.peak_memory_mb, 2) if method.examples and not method.error else None
            ),
            "added_as_floor": method.added_as == "floor",
            "added_as_reference": method.added_as == "reference",
            "evaluators": {},
            "scores": {},
            "per_example": {},
        }
        if not method.error:
            for evaluator in evaluators:
                if evaluator in evaluator_errors:
                    method.scores.pop(evaluator, None)
                    continue
                doc["evaluators"][evaluator] = _pair_status(method, evaluator)
                if evaluator in method.evaluator_errors:
                    method.scores.pop(evaluator, None)
            doc["scores"], doc["per_example"] = summarize_scores(
                method, example_ids, config.seed, evaluators
            )
        method_docs[method.spec] = doc
    data = prepared.data
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_dict(),
        "provenance": {
            "packages": {name: _version(name) for name in PACKAGES},
            "python": platform.python_version(),
            "model": {
                "id": prepared.loaded.model_id,
                "name": prepared.loaded.name,
                "type": prepared.loaded.model.config.model_type,
                "weights_sha256": prepared.loaded.weights_sha256,
                "fresh_head": prepared.loaded.fresh_head,
            },
            "dataset": {
                "name": data.name,
                "split": data.split,
                "fingerprint": data.fingerprint,
                "examples": len(data.examples),
                "text_column": data.text_column,
                "text_pair_column": data.text_pair_column,
                "label_column": data.label_column,
                "truncated": prepared.truncated,
                "max_length": prepared.max_length,
                "rationale_words_lost": rationale_words_lost(prepared.batches),
                "contentless": len(prepared.contentless),
            },
            "seed": config.seed,
            "hardware": hardware(prepared.loaded.device),
            "evaluator_plugins": {n: reg.source for n, reg in registry.evaluators.items()},
        },
        "reference": config.reference,
        "evaluators": {
            name: {
                "status": "failed" if name in evaluator_errors else "ok",
                "error": evaluator_errors.get(name),
            }
            for name in evaluators
        },
        "evaluator_info": {
            name: {
                "description": evaluator.description,
                "needs_reference": evaluator.needs_reference,
                "higher_is_better": getattr(evaluator, "higher_is_better", True),
            }
            for name, evaluator in evaluators.items()
        },
        "example_ids": example_ids,
        "methods": method_docs,
    }


def summarize_scores(
    method: MethodState, example_ids: list[str], seed: int, evaluators: dict[str, Any]
) -> tuple[dict, dict]:
    """Per evaluator and kind: per-layer summaries, and the per-example scores in data order.

    An evaluator with ``parts`` is summarised by its ``aggregate`` over the parts' columns (a
    corpus-level score such as ERASER's macro F1), not by the mean of its per-example scores.
    """
    summaries: dict[str, dict[str, list]] = {}
    per_example: dict[str, dict[str, list]] = {}
    for name, kinds in method.scores.items():
        parts = tuple(getattr(evaluators.get(name), "parts", ()))
        for kind in KINDS:
            if kind not in kinds:
                continue
            matrix = np.stack([kinds[kind][i] for i in example_ids], axis=1)  # (L, examples)
            if parts:
                columns = [[kinds[f"{kind}/{p}"][i] for i in example_ids] for p in parts]
                parts_LEP = np.stack(columns, axis=-1).transpose(1, 0, 2)
                aggregate = evaluators[name].aggregate
                layers = [summarize_corpus(values_EP, aggregate, seed) for values_EP in parts_LEP]
            else:
                layers = [summarize(row, seed) for row in matrix]
            summaries.setdefault(name, {})[kind] = [
                {"layer": layer + 1, **summary} for layer, summary in enumerate(layers)
            ]
            per_example.setdefault(name, {})[kind] = [
                [None if np.isnan(v) else float(v) for v in row] for row in matrix
            ]
    return summaries, per_example


def _pair_status(method: MethodState, evaluator: str) -> dict[str, Any]:
    """One (method, evaluator) pair: ok, failed (its error), or undefined on every example."""
    if evaluator in method.evaluator_errors:
        return {"status": "failed", "error": method.evaluator_errors[evaluator]}
    if method.undefined(evaluator):
        return {"status": "undefined", "error": "NaN on every example"}
    return {"status": "ok", "error": None}


def _clean(value: Any) -> Any:
    """NaN is not JSON: write null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(document: dict[str, Any], path: Path) -> None:
    """Write atomically (a half-written result is worse than none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(_clean(document), indent=1) + "\n")
    temporary.replace(path)


def exit_status(document: dict[str, Any]) -> bool:
    """True when every method, evaluator and (method, evaluator) pair completed with scores."""
    methods = document["methods"].values()
    return (
        all(m["status"] == "ok" for m in methods)
        and all(e["status"] == "ok" for e in document["evaluators"].values())
        and all(p["status"] == "ok" for m in methods for p in m.get("evaluators", {}).values())
    )


def _mean(entry: dict[str, Any] | None) -> str:
    if entry is None or entry["mean"] is None or math.isnan(entry["mean"]):
        return "-"
    return f"{entry['mean']:+.3f}"


def _ci(entry: dict[str, Any] | None) -> str:
    if entry is None or entry["ci95"][0] is None or math.isnan(entry["ci95"][0]):
        return "-"
    low, high = entry["ci95"]
    return f"[{low:+.2f},{high:+.2f}]"


def _added_caption(document: dict[str, Any]) -> str:
    """Which rows were not selected: the reference and the random floor join every table."""
    notes = []
    for key, role in (("added_as_reference", "the reference"), ("added_as_floor", "the floor")):
        added = [spec for spec, m in document["methods"].items() if m.get(key)]
        if added:
            notes.append(f"{', '.join(added)}: added as {role}")
    return "; ".join(notes)


def _status(method: dict[str, Any], evaluator: str) -> str:
    if method["status"] != "ok":
        return f"failed: {method['error']}"
    pair = method.get("evaluators", {}).get(evaluator, {"status": "ok"})
    if pair["status"] == "failed":
        return f"{evaluator} failed: {pair['error']}"
    return pair["status"]


def leaderboard(document: dict[str, Any], evaluator: str, kind: str = "aggregated") -> Table:
    """Rows = methods, best last-layer score first; best layer and last layer with 95% CI.

    Cost columns: seconds per example and peak memory (MB), both standalone.
    """
    model = document["provenance"]["model"]
    dataset = document["provenance"]["dataset"]
    info = document.get("evaluator_info", {}).get(evaluator, {})
    higher_is_better = info.get("higher_is_better", True)
    versus = f" vs {document['reference']}" if info.get("needs_reference", True) else ""
    direction = "" if higher_is_better else ", lower is better"
    table = Table(
        title=f"{evaluator}{versus} ({kind}{direction}) — {model['name']} on "
        f"{Path(dataset['name']).name}/{dataset['split']} (n={dataset['examples']})",
        title_justify="left",
        caption=_added_caption(document) or None,
        caption_justify="left",
    )
    table.add_column("method", style="bold", no_wrap=True)
    table.add_column("best (layer)", justify="right", no_wrap=True)
    table.add_column("last layer", justify="right", no_wrap=True)
    table.add_column("95% CI", justify="right", no_wrap=True)
    table.add_column("s/ex", justify="right", no_wrap=True)
    table.add_column("peak MB", justify="right", no_wrap=True)
    table.add_column("status")
    sign = 1.0 if higher_is_better else -1.0

    def last_mean(item: tuple[str, dict]) -> float:
        layers = item[1]["scores"].get(evaluator, {}).get(kind)
        mean = layers[-1]["mean"] if layers else None
        return -math.inf if mean is None or math.isnan(mean) else sign * mean

    for spec, method in sorted(document["methods"].items(), key=last_mean, reverse=True):
        layers = method["scores"].get(evaluator, {}).get(kind)
        seconds = method["seconds_per_example"]
        status = _status(method, evaluator)
        row = ["-", "-", "-"]
        if layers:
            scored = [x for x in layers if x["mean"] is not None and not math.isnan(x["mean"])]
            best = max(scored, key=lambda x: sign * x["mean"]) if scored else None
            best_text = _mean(best) + (f" ({best['layer']})" if best and len(layers) > 1 else "")
            row = [best_text, _mean(layers[-1]), _ci(layers[-1])]
        memory = method.get("peak_memory_mb")
        table.add_row(
            spec,
            *row,
            f"{seconds:.4f}" if seconds is not None else "-",
            f"{memory:.1f}" if memory is not None else "-",
            status,
            style=None if status == "ok" else "red",
        )
    return table
