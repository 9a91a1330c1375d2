"""The result as typed objects: methods, scores per evaluator, kind and layer, per-example scores,
provenance and cost, read from and written to the JSON schema (``schema/results.schema.json``).

``Result.from_document`` takes a document as ``attrib-bench run --output`` writes it, checked
first by ``validate`` (the one checker of the raw JSON: ``load_results`` and ``Result.load`` run
it, and so does ``as_result`` for a document built in memory);
``to_document`` gives it back unchanged, so the JSON file stays the one format. NaN stands for
undefined in memory and null in the file. The gate, the reports and the pytest helpers read a
``Result``.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from attrib_bench.core.errors import UsageError
from attrib_bench.results.agreement import Agreement, validate_agreement
from attrib_bench.results.paired import Paired, validate_paired

#: The top-level keys of the result schema (``schema/results.schema.json``) that must be there.
REQUIRED = ("created", "config", "provenance", "reference", "evaluators", "methods")
STATUSES = ("ok", "failed")
#: A (method, evaluator) pair can also be undefined: NaN on every example.
PAIR_STATUSES = ("ok", "failed", "undefined")
KINDS = ("aggregated", "local")
#: Cache keys are hex digests; anything else could point the report outside the cache.
CACHE_KEY = re.compile(r"[0-9a-f]+")

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
    "scores_by_answer",
    "per_example",
    "per_example_parts",
)
#: The subsets ``scores_by_answer`` splits the examples into, by ``Result.model_right``.
ANSWERS = ("right", "wrong")
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
    "model_right",
    "methods",
    "agreement",
    "paired",
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
    #: With ``Result.model_right``: "right" / "wrong" -> as ``scores``, over those examples.
    scores_by_answer: dict[str, dict[str, dict[str, list[LayerScore]]]] | None = None
    #: Corpus-level evaluators (``parts``): evaluator -> kind -> part -> as ``per_example``,
    #: what their summary aggregates (so that ``merge`` can aggregate the union).
    per_example_parts: dict[str, dict[str, dict[str, list[list[float]]]]] = field(
        default_factory=dict
    )
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, spec: str, entry: Mapping[str, Any]) -> MethodResult:
        return cls(
            spec=spec,
            name=entry.get("name", spec),
            plugin=entry.get("plugin", ""),
            status=entry["status"],
            error=entry.get("error"),
            seconds_per_example=entry.get("seconds_per_example"),
            peak_memory_mb=entry.get("peak_memory_mb"),
            added_as_floor=bool(entry.get("added_as_floor", False)),
            added_as_reference=bool(entry.get("added_as_reference", False)),
            evaluators={k: dict(v) for k, v in entry.get("evaluators", {}).items()},
            scores=_summaries(entry.get("scores", {})),
            scores_by_answer=(
                {answer: _summaries(by) for answer, by in entry["scores_by_answer"].items()}
                if "scores_by_answer" in entry
                else None
            ),
            per_example={
                evaluator: _rows_by_kind(kinds)
                for evaluator, kinds in entry.get("per_example", {}).items()
            },
            per_example_parts={
                evaluator: {kind: _rows_by_kind(parts) for kind, parts in kinds.items()}
                for evaluator, kinds in entry.get("per_example_parts", {}).items()
            },
            extra={k: v for k, v in entry.items() if k not in METHOD_KEYS},
        )

    def to_json(self) -> dict[str, Any]:
        parts = {}
        if self.per_example_parts:
            parts["per_example_parts"] = {
                evaluator: {kind: _json_rows_by_kind(by) for kind, by in kinds.items()}
                for evaluator, kinds in self.per_example_parts.items()
            }
        by_answer = {}
        if self.scores_by_answer is not None:
            by_answer["scores_by_answer"] = {
                answer: _summaries_json(scores) for answer, scores in self.scores_by_answer.items()
            }
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
            "scores": _summaries_json(self.scores),
            **by_answer,
            "per_example": {
                evaluator: _json_rows_by_kind(kinds)
                for evaluator, kinds in self.per_example.items()
            },
            **parts,
            **self.extra,
        }

    def score(self, evaluator: str, kind: str = "aggregated", layer: int = -1) -> LayerScore:
        """The summary of one layer (``-1``: the last), as leaderboards and the gate read it."""
        return self.scores[evaluator][kind][layer]

    def answer_score(
        self, answer: str, evaluator: str, kind: str = "aggregated", layer: int = -1
    ) -> LayerScore | None:
        """``score`` over the examples the model gets ``right`` or ``wrong``; None without."""
        layers = (self.scores_by_answer or {}).get(answer, {}).get(evaluator, {}).get(kind)
        return layers[layer] if layers else None

    def example_scores(
        self, evaluator: str, kind: str = "aggregated", layer: int = -1
    ) -> np.ndarray:
        """Per-example scores of one layer, in ``Result.example_ids`` order (NaN: undefined)."""
        return np.asarray(self.per_example[evaluator][kind][layer], dtype=float)


def _rows_by_kind(rows_by: Mapping[str, Any]) -> dict[str, list[list[float]]]:
    """``{key: per layer, per example}`` from JSON (null: NaN)."""
    return {key: [[_number(v) for v in row] for row in rows] for key, rows in rows_by.items()}


def _json_rows_by_kind(rows_by: Mapping[str, Any]) -> dict[str, list[list[float | None]]]:
    return {key: [[_json_number(v) for v in row] for row in rows] for key, rows in rows_by.items()}


def _summaries(scores: Mapping[str, Any]) -> dict[str, dict[str, list[LayerScore]]]:
    return {
        evaluator: {
            kind: [LayerScore.from_json(x) for x in layers] for kind, layers in kinds.items()
        }
        for evaluator, kinds in scores.items()
    }


def _summaries_json(scores: dict[str, dict[str, list[LayerScore]]]) -> dict[str, Any]:
    return {
        evaluator: {kind: [s.to_json() for s in layers] for kind, layers in kinds.items()}
        for evaluator, kinds in scores.items()
    }


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
    #: Per example in ``example_ids`` order, whether the model gets it right (next-token
    #: data: logit(good) > logit(bad)); None for other data.
    model_right: list[bool] | None = None
    #: Agreement between every two methods (``results.agreement``); None when not computed.
    agreement: Agreement | None = None
    #: Paired differences between every two methods (``results.paired``); None when absent.
    paired: Paired | None = None
    #: Other top-level sections (``cache``, ``finetune``, ``merged_from``), kept as they are.
    extra: dict[str, Any] = field(default_factory=dict)
    #: The file it was read from, for error messages (None: built in memory); not in the JSON.
    source: str | None = field(default=None, repr=False, compare=False)

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
            model_right=(
                list(document["model_right"]) if document.get("model_right") is not None else None
            ),
            methods={
                spec: MethodResult.from_json(spec, entry)
                for spec, entry in document["methods"].items()
            },
            agreement=(
                Agreement.from_json(document["agreement"]) if document.get("agreement") else None
            ),
            paired=Paired.from_json(document["paired"]) if document.get("paired") else None,
            extra={k: v for k, v in document.items() if k not in RESULT_KEYS},
            source=getattr(document, "path", None),
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
            **({} if self.model_right is None else {"model_right": self.model_right}),
            "methods": {spec: method.to_json() for spec, method in self.methods.items()},
            **({} if self.agreement is None else {"agreement": self.agreement.to_json()}),
            **({} if self.paired is None else {"paired": self.paired.to_json()}),
            **self.extra,
        }

    @classmethod
    def load(cls, path: Path | str) -> Result:
        """Read and validate a result file; one-line UsageError when it is not a usable one."""
        return cls.from_document(load_results(path))

    def save(self, path: Path | str) -> None:
        from attrib_bench.results.document import write_json

        write_json(self.to_document(), Path(path))


# ------------------------------------------------------------ reading and checking the JSON


class ResultDocument(dict):
    """A result document read from a file: ``path`` names that file in later error messages."""

    path: str


def load_results(path: Path | str) -> ResultDocument:
    """A result document from ``attrib-bench run --output``; UsageError when unusable."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"result file {str(path)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{str(path)!r} is not JSON ({error})") from None
    validate(document, str(path))
    loaded = ResultDocument(document)
    loaded.path = str(path)
    return loaded


def validate(document: Any, name: str) -> None:
    """Check every part of a result that ``check`` and ``report`` read, before either reads it.

    One UsageError naming the file and the field, so that a malformed file never surfaces later
    as a traceback from deep inside the comparison or a plot. Both commands rely on this alone.
    """
    if not isinstance(document, Mapping) or "methods" not in document:
        raise UsageError(f"{name!r} is not an attrib-bench result (no 'methods')")
    version = document.get("schema_version")
    if version != 1:
        raise UsageError(f"{name!r} has schema_version {version!r}; this attrib-bench reads 1")
    schema = Schema(f"{name!r} is not a valid attrib-bench result")
    for key in REQUIRED:
        schema.field(document, key, "the result")
    schema.string(document["created"], "created")
    schema.string(document["reference"], "reference")
    schema.object(document["config"], "config")
    provenance = schema.object(document["provenance"], "provenance")
    model = schema.object(schema.field(provenance, "model", "provenance"), "provenance.model")
    schema.string(schema.field(model, "id", "provenance.model"), "provenance.model.id")
    dataset = schema.object(schema.field(provenance, "dataset", "provenance"), "provenance.dataset")
    for key in ("name", "split"):
        schema.string(schema.field(dataset, key, "provenance.dataset"), f"provenance.dataset.{key}")
    for key in ("packages", "hardware"):
        if key in provenance:
            schema.object(provenance[key], f"provenance.{key}")
    for evaluator, state in schema.object(document["evaluators"], "evaluators").items():
        where = f"evaluators[{evaluator!r}]"
        schema.object(state, where)
        schema.choice(schema.field(state, "status", where), STATUSES, f"{where}.status")
        schema.optional_string(schema.field(state, "error", where), f"{where}.error")
    information = schema.object(document.get("evaluator_info", {}), "evaluator_info")
    for evaluator, info in information.items():
        where = f"evaluator_info[{evaluator!r}]"
        schema.object(info, where)
        for key in ("higher_is_better", "needs_reference"):
            if key in info and not isinstance(info[key], bool):
                schema.fail(f"{where}.{key}", "true or false", info[key])
    ids = document.get("example_ids")
    if ids is not None:
        for index, example in enumerate(schema.array(ids, "example_ids")):
            schema.string(example, f"example_ids[{index}]")
    right = document.get("model_right")
    if right is not None:
        length = None if ids is None else len(ids)
        for index, value in enumerate(schema.array(right, "model_right", length)):
            if not isinstance(value, bool):
                schema.fail(f"model_right[{index}]", "true or false", value)
    if document.get("cache"):
        _validate_cache(schema, document["cache"])
    if document.get("agreement"):
        validate_agreement(schema, document["agreement"])
    if document.get("paired"):
        validate_paired(schema, document["paired"])
    methods = schema.object(document["methods"], "methods")
    if not methods:
        raise UsageError(f"{name!r} has no methods: it holds no scores")
    for spec, method in methods.items():
        _validate_method(schema, method, f"methods[{spec!r}]", None if ids is None else len(ids))


def _validate_method(schema: Schema, method: Any, where: str, examples: int | None) -> None:
    schema.object(method, where)
    schema.choice(schema.field(method, "status", where), STATUSES, f"{where}.status")
    schema.optional_string(method.get("error"), f"{where}.error")
    for key in ("seconds_per_example", "peak_memory_mb"):
        schema.optional_number(method.get(key), f"{where}.{key}")
    for evaluator, pair in schema.object(
        method.get("evaluators", {}), f"{where}.evaluators"
    ).items():
        at = f"{where}.evaluators[{evaluator!r}]"
        schema.object(pair, at)
        schema.choice(schema.field(pair, "status", at), PAIR_STATUSES, f"{at}.status")
        schema.optional_string(pair.get("error"), f"{at}.error")
    _validate_summaries(schema, method.get("scores", {}), f"{where}.scores")
    if "scores_by_answer" in method:
        at = f"{where}.scores_by_answer"
        for answer, scores in schema.object(method["scores_by_answer"], at).items():
            schema.choice(answer, ANSWERS, f"{at} key")
            _validate_summaries(schema, scores, f"{at}.{answer}")
    per_example = schema.object(method.get("per_example", {}), f"{where}.per_example")
    for evaluator, kinds in per_example.items():
        for kind, layers in schema.kinds(kinds, f"{where}.per_example[{evaluator!r}]"):
            _validate_rows(schema, layers, f"{where}.per_example[{evaluator!r}].{kind}", examples)
    at = f"{where}.per_example_parts"
    for evaluator, kinds in schema.object(method.get("per_example_parts", {}), at).items():
        for kind, parts in schema.object(kinds, f"{at}[{evaluator!r}]").items():
            schema.choice(kind, KINDS, f"{at}[{evaluator!r}] key")
            for part, layers in schema.object(parts, f"{at}[{evaluator!r}].{kind}").items():
                rows_at = f"{at}[{evaluator!r}].{kind}[{part!r}]"
                _validate_rows(schema, schema.array(layers, rows_at), rows_at, examples)


def _validate_rows(schema: Schema, layers: Sequence[Any], where: str, examples: int | None) -> None:
    """Per layer, one number or null per example."""
    for index, values in enumerate(layers):
        at = f"{where}[{index}]"
        for position, value in enumerate(schema.array(values, at, examples)):
            schema.optional_number(value, f"{at}[{position}]")


def _validate_summaries(schema: Schema, scores: Any, where: str) -> None:
    """evaluator -> kind -> per-layer summaries (``scores``, and each of ``scores_by_answer``)."""
    for evaluator, kinds in schema.object(scores, where).items():
        for kind, layers in schema.kinds(kinds, f"{where}[{evaluator!r}]"):
            for index, summary in enumerate(layers):
                at = f"{where}[{evaluator!r}].{kind}[{index}]"
                schema.object(summary, at)
                layer = schema.field(summary, "layer", at)
                if not _is_integer(layer) or layer < 1:
                    schema.fail(f"{at}.layer", "an integer >= 1", layer)
                schema.optional_number(schema.field(summary, "mean", at), f"{at}.mean")
                ci = schema.array(schema.field(summary, "ci95", at), f"{at}.ci95", 2)
                for bound in ci:
                    schema.optional_number(bound, f"{at}.ci95")
                count = schema.field(summary, "n", at)
                if not _is_integer(count) or count < 0:
                    schema.fail(f"{at}.n", "an integer >= 0", count)
                schema.optional_number(summary.get("std"), f"{at}.std")
                undefined = summary.get("nan", 0)
                if not _is_integer(undefined) or undefined < 0:
                    schema.fail(f"{at}.nan", "an integer >= 0", undefined)


def _validate_cache(schema: Schema, cache: Any) -> None:
    schema.object(cache, "cache")
    directory = schema.string(schema.field(cache, "dir", "cache"), "cache.dir")
    if "\0" in directory:
        schema.fail("cache.dir", "a path", directory)
    for key in ("methods", "examples"):
        for item, value in schema.object(schema.field(cache, key, "cache"), f"cache.{key}").items():
            _cache_key(schema, value, f"cache.{key}[{item!r}]")
    if cache.get("reference") is not None:
        _cache_key(schema, cache["reference"], "cache.reference")
    for spec, hits in schema.object(schema.field(cache, "hits", "cache"), "cache.hits").items():
        if not _is_integer(hits) or hits < 0:
            schema.fail(f"cache.hits[{spec!r}]", "an integer >= 0", hits)


def _cache_key(schema: Schema, value: Any, where: str) -> None:
    if not isinstance(value, str) or not CACHE_KEY.fullmatch(value):
        schema.fail(where, "a hex cache key", value)


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    """A finite real, or NaN (undefined); not a bool, infinity or a 400-digit integer."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        return False
    return abs(value) <= sys.float_info.max or value != value  # NaN is not equal to itself


def _shown(value: Any) -> str:
    """A value as the error message shows it: on one line, and short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Schema:
    """Type checks that raise one UsageError: ``problem`` (which file), then the field."""

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def fail(self, where: str, expected: str, value: Any) -> NoReturn:
        raise UsageError(f"{self.problem}: {where} must be {expected}, not {_shown(value)}")

    def field(self, container: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in container:
            raise UsageError(f"{self.problem}: {where} has no {key!r}")
        return container[key]

    def object(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(where, "an object", value)
        return value

    def array(self, value: Any, where: str, length: int | None = None) -> Sequence[Any]:
        if not isinstance(value, (list, tuple)):
            self.fail(where, "an array", value)
        if length is not None and len(value) != length:
            self.fail(where, f"an array of {length} (one per example id)", value)
        return value

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            self.fail(where, "a string", value)
        return value

    def optional_string(self, value: Any, where: str) -> None:
        if value is not None and not isinstance(value, str):
            self.fail(where, "a string or null", value)

    def optional_number(self, value: Any, where: str) -> None:
        if value is not None and not _is_number(value):
            self.fail(where, "a number or null", value)

    def choice(self, value: Any, choices: Sequence[str], where: str) -> None:
        if value not in choices:
            self.fail(where, " or ".join(repr(c) for c in choices), value)

    def kinds(self, value: Any, where: str) -> list[tuple[str, Sequence[Any]]]:
        """An evaluator's ``{kind: [per layer]}``, its kinds among ``aggregated`` and ``local``."""
        kinds = self.object(value, where)
        for kind in kinds:
            if kind not in KINDS:
                self.fail(where, "keyed by 'aggregated' or 'local'", kind)
        return [(kind, self.array(layers, f"{where}.{kind}")) for kind, layers in kinds.items()]


#: A result as a ``Result``, a validated document (``load_results``) or its file's path.
Results = Result | Mapping[str, Any] | Path | str


def as_result(value: Results, name: str = "results") -> Result:
    """A ``Result`` as is; a path loaded (``load_results``); a document validated then converted.

    ``name`` stands for a document built in memory in error messages (one read from a file is
    named by its path). The one conversion the gate, the reports and the pytest helpers use.
    """
    if isinstance(value, Result):
        return value
    if isinstance(value, (str, Path)):
        return Result.from_document(load_results(value))
    validate(value, source_name(value, name))
    return Result.from_document(value)


def source_name(document: Any, fallback: str) -> str:
    """The file a result came from, for error messages; ``fallback`` for one built in memory."""
    if isinstance(document, Result):
        return document.source or fallback
    return getattr(document, "path", fallback)
