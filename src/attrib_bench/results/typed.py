"""The result as typed objects: methods, scores per evaluator, kind and layer, per-example scores,
provenance and cost, read from and written to the JSON schema (``schema/results.schema.json``).

``Result.from_document`` takes a document as ``attrib-bench run --output`` writes it (validated
by the gate's checker when loaded from a file); ``to_document`` gives it back unchanged, so the
JSON file stays the one format. NaN stands for undefined in memory and null in the file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: Keys of a method entry that have a typed field; any other key is kept in ``extra``.
METHOD_KEYS = (
    "name",
    "plugin",
    "status",
    "error",
    "seconds_per_example",
    "peak_memory_mb",
    "added_as_floor",
    "added_as_reference",
    "evaluators",
    "scores",
    "per_example",
)
#: Top-level keys with a typed field; others (``cache``, ``finetune``, ...) go to ``extra``.
RESULT_KEYS = (
    "schema_version",
    "created",
    "config",
    "provenance",
    "reference",
    "evaluators",
    "evaluator_info",
    "example_ids",
    "methods",
)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _json_number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


@dataclass(frozen=True)
class LayerScore:
    """One row's summary: mean, std, 95% CI and counts over the examples (NaN: undefined)."""

    layer: int
    mean: float
    std: float
    ci95: tuple[float, float]
    n: int
    nan: int

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> LayerScore:
        low, high = entry["ci95"]
        return cls(
            layer=int(entry["layer"]),
            mean=_number(entry["mean"]),
            std=_number(entry.get("std")),
            ci95=(_number(low), _number(high)),
            n=int(entry["n"]),
            nan=int(entry.get("nan", 0)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "mean": _json_number(self.mean),
            "std": _json_number(self.std),
            "ci95": [_json_number(self.ci95[0]), _json_number(self.ci95[1])],
            "n": self.n,
            "nan": self.nan,
        }


@dataclass
class MethodResult:
    """One leaderboard row: status, cost, and per evaluator and kind its scores per layer."""

    spec: str
    name: str
    plugin: str
    status: str
    error: str | None
    seconds_per_example: float | None
    peak_memory_mb: float | None
    added_as_floor: bool = False
    added_as_reference: bool = False
    #: evaluator -> {"status": ok|failed|undefined, "error": ...}: this method's own outcome
    evaluators: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: evaluator -> kind -> one summary per layer
    scores: dict[str, dict[str, list[LayerScore]]] = field(default_factory=dict)
    #: evaluator -> kind -> per layer, one score per example in ``Result.example_ids`` order
    per_example: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, spec: str, entry: Mapping[str, Any]) -> MethodResult:
        return cls(
            spec=spec,
            name=entry["name"],
            plugin=entry["plugin"],
            status=entry["status"],
            error=entry.get("error"),
            seconds_per_example=entry.get("seconds_per_example"),
            peak_memory_mb=entry.get("peak_memory_mb"),
            added_as_floor=bool(entry.get("added_as_floor", False)),
            added_as_reference=bool(entry.get("added_as_reference", False)),
            evaluators={k: dict(v) for k, v in entry.get("evaluators", {}).items()},
            scores={
                evaluator: {
                    kind: [LayerScore.from_json(layer) for layer in layers]
                    for kind, layers in kinds.items()
                }
                for evaluator, kinds in entry.get("scores", {}).items()
            },
            per_example={
                evaluator: {
                    kind: [[_number(v) for v in row] for row in rows]
                    for kind, rows in kinds.items()
                }
                for evaluator, kinds in entry.get("per_example", {}).items()
            },
            extra={k: v for k, v in entry.items() if k not in METHOD_KEYS},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "plugin": self.plugin,
            "status": self.status,
            "error": self.error,
            "seconds_per_example": self.seconds_per_example,
            "peak_memory_mb": self.peak_memory_mb,
            "added_as_floor": self.added_as_floor,
            "added_as_reference": self.added_as_reference,
            "evaluators": {k: dict(v) for k, v in self.evaluators.items()},
            "scores": {
                evaluator: {kind: [s.to_json() for s in layers] for kind, layers in kinds.items()}
                for evaluator, kinds in self.scores.items()
            },
            "per_example": {
                evaluator: {
                    kind: [[_json_number(v) for v in row] for row in rows]
                    for kind, rows in kinds.items()
                }
                for evaluator, kinds in self.per_example.items()
            },
            **self.extra,
        }

    def score(self, evaluator: str, kind: str = "aggregated", layer: int = -1) -> LayerScore:
        """The summary of one layer (``-1``: the last), as leaderboards and the gate read it."""
        return self.scores[evaluator][kind][layer]

    def example_scores(
        self, evaluator: str, kind: str = "aggregated", layer: int = -1
    ) -> np.ndarray:
        """Per-example scores of one layer, in ``Result.example_ids`` order (NaN: undefined)."""
        return np.asarray(self.per_example[evaluator][kind][layer], dtype=float)


@dataclass
class Result:
    """A run's result: what it ran on (config, provenance), and every method's scores."""

    schema_version: int
    created: str
    config: dict[str, Any]
    provenance: dict[str, Any]
    reference: str
    evaluators: dict[str, dict[str, Any]]
    evaluator_info: dict[str, dict[str, Any]]
    example_ids: list[str]
    methods: dict[str, MethodResult]
    #: Other top-level sections (``cache``, ``finetune``, ``merged_from``), kept as they are.
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Result:
        return cls(
            schema_version=int(document["schema_version"]),
            created=document["created"],
            config=dict(document["config"]),
            provenance=dict(document["provenance"]),
            reference=document["reference"],
            evaluators={k: dict(v) for k, v in document["evaluators"].items()},
            evaluator_info={k: dict(v) for k, v in document.get("evaluator_info", {}).items()},
            example_ids=list(document.get("example_ids") or []),
            methods={
                spec: MethodResult.from_json(spec, entry)
                for spec, entry in document["methods"].items()
            },
            extra={k: v for k, v in document.items() if k not in RESULT_KEYS},
        )

    def to_document(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "created": self.created,
            "config": self.config,
            "provenance": self.provenance,
            "reference": self.reference,
            "evaluators": self.evaluators,
            "evaluator_info": self.evaluator_info,
            "example_ids": self.example_ids,
            "methods": {spec: method.to_json() for spec, method in self.methods.items()},
            **self.extra,
        }

    @classmethod
    def load(cls, path: Path | str) -> Result:
        """Read and validate a result file; one-line UsageError when it is not a usable one."""
        from attrib_bench.gate import load_results

        return cls.from_document(load_results(path))

    def save(self, path: Path | str) -> None:
        from attrib_bench.results.document import write_json

        write_json(self.to_document(), Path(path))
