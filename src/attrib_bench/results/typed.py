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

import functools
import json
import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import numpy as np

from attrib_bench.core.errors import UsageError
from attrib_bench.results.agreement import Agreement
from attrib_bench.results.evaluator_agreement import EvaluatorAgreement
from attrib_bench.results.paired import Paired

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

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
    "evaluator_agreement",
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
    #: Kendall tau between every two evaluators' method rankings
    #: (``results.evaluator_agreement``); None when absent.
    evaluator_agreement: EvaluatorAgreement | None = None
    #: Other top-level sections (``cache``, ``finetune``, ``merged_from``), kept as they are.
    extra: dict[str, Any] = field(default_factory=dict)
    #: The file it was read from, for error messages (None: built in memory); not in the JSON.
    source: str | None = field(default=None, repr=False, compare=False)
    #: How a notebook shows a Result (``_repr_html_``): ``reports.html`` installs its view when
    #: imported, as the reports sit above the results, which cannot import them.
    html_view: ClassVar[Callable[[Result], str] | None] = None

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
            evaluator_agreement=(
                EvaluatorAgreement.from_json(document["evaluator_agreement"])
                if document.get("evaluator_agreement")
                else None
            ),
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
            **(
                {}
                if self.evaluator_agreement is None
                else {"evaluator_agreement": self.evaluator_agreement.to_json()}
            ),
            **self.extra,
        }

    def _repr_html_(self) -> str | None:
        """What Jupyter shows: the leaderboards and, with the run's cache entries at hand, the
        token heatmaps (``html_view``); None, the plain repr, before any report is imported."""
        view = type(self).html_view
        return None if view is None else view(self)

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

    Against the JSON Schema (``schema/results.schema.json``), then the few checks across fields
    that it cannot say (``_check_across``). One UsageError naming the file and the field, so
    that a malformed file never surfaces later as a traceback from deep inside the comparison
    or a plot. Both commands rely on this alone.
    """
    if not isinstance(document, Mapping) or "methods" not in document:
        raise UsageError(f"{name!r} is not an attrib-bench result (no 'methods')")
    version = document.get("schema_version")
    if version != 1:  # before the schema: a file of another version may differ everywhere
        raise UsageError(f"{name!r} has schema_version {version!r}; this attrib-bench reads 1")
    problem = f"{name!r} is not a valid attrib-bench result"
    check_json(document, _result_validator(), problem, "the result")
    _check_across(document, problem)


def _check_across(document: Mapping[str, Any], problem: str) -> None:
    """What a JSON Schema cannot say: per-example arrays and ``model_right`` as long as
    ``example_ids``; an agreement pair's methods and measures among the section's own, an
    evaluator agreement pair's evaluators among its kind's."""

    def fail(where: str, expected: str, value: Any) -> NoReturn:
        raise UsageError(f"{problem}: {where} must be {expected}, not {_shown(value)}")

    ids = document.get("example_ids")
    count = None if ids is None else len(ids)
    one_each = f"an array of {count} (one per example id)"
    right = document.get("model_right")
    if count is not None and right is not None and len(right) != count:
        fail("model_right", one_each, right)
    for spec, method in document["methods"].items():
        at = f"methods[{spec!r}]"
        rows = [
            (f"{at}.per_example[{evaluator!r}].{kind}", layers)
            for evaluator, kinds in method.get("per_example", {}).items()
            for kind, layers in kinds.items()
        ] + [
            (f"{at}.per_example_parts[{evaluator!r}].{kind}[{part!r}]", layers)
            for evaluator, kinds in method.get("per_example_parts", {}).items()
            for kind, parts in kinds.items()
            for part, layers in parts.items()
        ]
        for where, layers in rows:
            for index, values in enumerate(layers):
                if count is not None and len(values) != count:
                    fail(f"{where}[{index}]", one_each, values)
    agreement = document.get("agreement") or {}
    for index, pair in enumerate(agreement.get("pairs", [])):
        at = f"agreement.pairs[{index}]"
        for key in ("a", "b"):
            if pair[key] not in agreement["methods"]:
                fail(f"{at}.{key}", _either(agreement["methods"]), pair[key])
        for measure in pair["scores"]:
            if measure not in agreement["measures"]:
                fail(f"{at}.scores key", _either(agreement["measures"]), measure)
    kinds = (document.get("evaluator_agreement") or {}).get("kinds", {})
    for kind, entry in kinds.items():
        for index, pair in enumerate(entry["pairs"]):
            for key in ("a", "b"):
                if pair[key] not in entry["evaluators"]:
                    where = f"evaluator_agreement.kinds.{kind}.pairs[{index}].{key}"
                    fail(where, _either(entry["evaluators"]), pair[key])


def _is_number(checker: Any, value: Any) -> bool:
    """A finite real, or NaN (undefined: Python's json reads the token NaN, and documents built
    in memory hold NaN); not a bool, infinity or an integer too large for a float."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        return False
    return value != value or abs(value) <= sys.float_info.max  # NaN is not equal to itself


def _is_integer(checker: Any, value: Any) -> bool:
    """A whole number (numpy's too, not 1.0 or a bool) that a float can hold."""
    return isinstance(value, numbers.Integral) and _is_number(checker, value)


@functools.cache
def _validator_class() -> type[Validator]:
    """Draft 2020-12 over Python values as ``json`` reads them and documents built in memory
    hold them: any mapping, lists and tuples, numpy scalars, NaN but never infinity."""
    from jsonschema import Draft202012Validator, validators

    checker = Draft202012Validator.TYPE_CHECKER.redefine_many(
        {
            "object": lambda _, value: isinstance(value, Mapping),
            "array": lambda _, value: isinstance(value, (list, tuple)),
            "number": _is_number,
            "integer": _is_integer,
        }
    )
    return validators.extend(Draft202012Validator, type_checker=checker)


def json_validator(schema: Mapping[str, Any]) -> Validator:
    """A validator of ``schema`` for ``check_json``; build it once and reuse it."""
    return _validator_class()(schema)


@functools.cache
def _result_validator() -> Validator:
    """The result schema's validator, read and built once per process."""
    from attrib_bench.results.document import SCHEMA_PATH

    return json_validator(json.loads(SCHEMA_PATH.read_text()))


def check_json(value: Any, validator: Validator, problem: str, whole: str) -> None:
    """One UsageError, ``problem: <field> must be ...``, when ``value`` breaks the schema.

    The error is jsonschema's most relevant one (``best_match``); ``whole`` names the value
    itself where the error is at its top (``the result has no 'created'``).
    """
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(value))
    if error is None:
        return
    while error.parent is not None:  # an alternative of anyOf: say them all
        error = error.parent
    where = _field(error) or whole
    keyword = error.validator
    if keyword == "required":
        missing = next(key for key in error.validator_value if key not in error.instance)
        raise UsageError(f"{problem}: {where} has no {missing!r}")
    if keyword == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        unexpected = next(key for key in error.instance if key not in allowed)
        raise UsageError(
            f"{problem}: {where} must be keyed by {_either(allowed)}, not {_shown(unexpected)}"
        )
    if "propertyNames" in error.relative_schema_path:
        where = f"{where} key"
    expected, value = _expected(error.schema), _shown(error.instance)
    raise UsageError(f"{problem}: {where} must be {expected}, not {value}")


def _field(error: ValidationError) -> str:
    """The error's place as ``methods['a'].scores['spearman'].aggregated[0].n``: the schema's
    named properties after a dot, keys of open mappings (method specs, evaluators) quoted.

    The schema path says which is which: each ``properties``/``additionalProperties``/``items``
    step in it (the last entry is the failing keyword) descends one step into the value."""
    steps = iter(error.absolute_path)
    tokens = iter(list(error.absolute_schema_path)[:-1])
    text = ""
    for token in tokens:
        if token == "properties":
            next(tokens)  # the property's name, which is the value's next step
            text += f".{next(steps)}"
        elif token in ("additionalProperties", "patternProperties"):
            if token == "patternProperties":
                next(tokens)
            text += f"[{next(steps)!r}]"
        elif token == "items":
            text += f"[{next(steps)}]"
        elif token == "prefixItems":
            next(tokens)
            text += f"[{next(steps)}]"
    return text.removeprefix(".")


#: How ``_expected`` names each JSON type.
TYPE_NAMES = {
    "object": "an object",
    "array": "an array",
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "true or false",
    "null": "null",
}
#: The schema's string patterns in words.
PATTERNS = {
    "^[0-9a-f]+(?!\\n)$": "a hex cache key",
    "^[0-9a-f]{64}$": "a SHA-256 hex digest",
    "^[^\\u0000]*$": "a path (no NUL character)",
}


def _expected(schema: Mapping[str, Any]) -> str:
    """What a (sub)schema asks for, in words: ``an integer >= 0``, ``a number or null``,
    ``'ok' or 'failed'``, ``an array of 2``."""
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return _either(schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_expected(option) for option in schema["anyOf"])
    types = schema.get("type", [])
    words = []
    for kind in [types] if isinstance(types, str) else types:
        word = TYPE_NAMES[kind]
        if kind == "integer" and "minimum" in schema:
            word += f" >= {schema['minimum']}"
        elif kind == "array" and schema.get("minItems", -1) == schema.get("maxItems"):
            word += f" of {schema['minItems']}"
        elif kind == "object" and "minProperties" in schema:
            word += f" with at least {schema['minProperties']} entry"
        elif kind == "string" and "pattern" in schema:
            word = PATTERNS.get(schema["pattern"], f"a string matching {schema['pattern']!r}")
        words.append(word)
    return " or ".join(words) or "something else"


def _either(choices: Sequence[Any]) -> str:
    return " or ".join(repr(choice) for choice in choices)


def _shown(value: Any) -> str:
    """A value as the error message shows it: on one line, and short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
