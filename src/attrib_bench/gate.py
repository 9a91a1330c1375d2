"""The regression gate: compare a result with a baseline, per method, with paired bootstrap CIs.

For every method that is ``ok`` in both files and every evaluator both ran, the last layer of
the ``aggregated`` rows (``all_layers``: every layer both have, both kinds) is compared on the
examples both files scored (matched by id; examples undefined in either are left out). With
``d_i = current_i - baseline_i``, the delta is ``mean(d)`` and its 95% CI is a seeded percentile
bootstrap of that mean over examples (the pairs are resampled together, so per-example
difficulty cancels out). The rule, for an evaluator where higher is better:

    regression  <=>  delta < -tolerance  and  CI upper bound < 0

that is, the score fell by more than the tolerance, and the fall is not explained by which
examples happened to be drawn. Where lower is better (``higher_is_better = False``: deletion,
sufficiency, sanity) it mirrors: ``delta > tolerance and CI lower bound > 0``.

Left-out examples must not hide a breakage, so a score also regresses when the share of shared
examples whose score is undefined (NaN) rose by more than the tolerance, when any baseline
example is missing from the results, and when no example is scored in both (nothing shows it
did not fall). A method ``ok`` in the baseline that failed now, and an evaluator that failed
now, are regressions too. Methods or evaluators that disappeared or appeared, changed
config keys, and a different model or dataset are reported, and do not decide the exit code.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from attrib_bench.errors import ExitCode, UsageError

DEFAULT_TOLERANCE = 0.02
RESAMPLES = 2000
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
#: Config keys that never change a number (the summary still lists them, marked as such).
HARMLESS_CONFIG = frozenset({"batch_size", "device"})
#: The top-level keys of the result schema (``schema/results.schema.json``) that must be there.
REQUIRED = ("created", "config", "provenance", "reference", "evaluators", "methods")
STATUSES = ("ok", "failed")
#: A (method, evaluator) pair can also be undefined: NaN on every example.
PAIR_STATUSES = ("ok", "failed", "undefined")
KINDS = ("aggregated", "local")
#: Cache keys are hex digests; anything else could point the report outside the cache.
CACHE_KEY = re.compile(r"[0-9a-f]+")


@dataclass
class Delta:
    """One compared score: a method, evaluator, kind and layer on the shared examples."""

    method: str
    evaluator: str
    kind: str
    layer: int
    baseline: float
    current: float
    delta: float
    ci: tuple[float, float]
    #: Examples with a defined score in both files: the pairs behind ``delta`` and ``ci``.
    n: int
    #: The score rule: fell by more than the tolerance, with the CI on the worse side of zero.
    fell: bool
    higher_is_better: bool = True
    #: Share of the shared examples whose score is undefined (NaN): (baseline, now).
    undefined: tuple[float, float] = (0.0, 0.0)
    #: That share rose by more than the tolerance.
    undefined_rose: bool = False
    #: Baseline examples the results do not have.
    missing: int = 0

    @property
    def regression(self) -> bool:
        """The score fell, more of it is undefined, examples went missing, or nothing compares.

        With no example scored in both files nothing shows the score did not fall, so the gate
        fails closed rather than passing on an empty comparison, unless the baseline scored no
        example either (undefined in both: reported, not a change).
        """
        nothing_compared = self.n == 0 and self.undefined[0] < 1.0  # not undefined before
        return self.fell or self.undefined_rose or self.missing > 0 or nothing_compared

    @property
    def improved(self) -> bool:
        """Better, with the whole CI on the better side of zero."""
        sign = 1.0 if self.higher_is_better else -1.0
        low = min(sign * self.ci[0], sign * self.ci[1])
        return sign * self.delta > 0 and low > 0


@dataclass
class Comparison:
    """Everything ``check`` found; ``exit_code`` and ``markdown`` are what CI sees."""

    tolerance: float
    rows: list[Delta] = field(default_factory=list)
    #: Method spec -> its error, for methods ok in the baseline and failed now.
    failed: dict[str, str] = field(default_factory=dict)
    failed_evaluators: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    #: Notes that do not fail the gate: recovered methods, evaluators added or removed.
    notes: list[str] = field(default_factory=list)
    config_changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    #: Loud warnings: the model or the data differ, so the comparison may be meaningless.
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Delta]:
        return [row for row in self.rows if row.regression]

    @property
    def passed(self) -> bool:
        return not (self.regressions or self.failed or self.failed_evaluators)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.passed else ExitCode.REGRESSION

    def markdown(self, current_name: str = "results", baseline_name: str = "baseline") -> str:
        return _markdown(self, current_name, baseline_name)


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


def _source(document: Mapping[str, Any], fallback: str) -> str:
    """The file a document came from, for error messages; ``fallback`` for one built in memory."""
    return getattr(document, "path", fallback)


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
    if document.get("cache"):
        _validate_cache(schema, document["cache"])
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
    for evaluator, kinds in schema.object(method.get("scores", {}), f"{where}.scores").items():
        for kind, layers in schema.kinds(kinds, f"{where}.scores[{evaluator!r}]"):
            for index, summary in enumerate(layers):
                at = f"{where}.scores[{evaluator!r}].{kind}[{index}]"
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
    per_example = schema.object(method.get("per_example", {}), f"{where}.per_example")
    for evaluator, kinds in per_example.items():
        for kind, layers in schema.kinds(kinds, f"{where}.per_example[{evaluator!r}]"):
            for index, values in enumerate(layers):
                at = f"{where}.per_example[{evaluator!r}].{kind}[{index}]"
                for position, value in enumerate(schema.array(values, at, examples)):
                    schema.optional_number(value, f"{at}[{position}]")


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


def _per_example(document: Mapping[str, Any], name: str) -> list[str]:
    ids = document.get("example_ids")
    if ids is None:
        raise UsageError(
            f"{name!r} holds summaries only (no example_ids and per-example scores), so no "
            "paired comparison is possible; write it with attrib-bench run --output"
        )
    return ids


def paired_bootstrap(
    differences: np.ndarray, seed: int = 0, resamples: int = RESAMPLES
) -> tuple[float, float]:
    """Percentile 95% CI of the mean paired difference; (nan, nan) with fewer than 2 pairs."""
    if len(differences) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = differences[rng.integers(0, len(differences), (resamples, len(differences)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return (float(low), float(high))


def _scores(document: Mapping[str, Any], spec: str, evaluator: str, kind: str) -> list | None:
    return document["methods"][spec].get("per_example", {}).get(evaluator, {}).get(kind)


def _compare_layers(
    current: Mapping[str, Any],
    baseline: Mapping[str, Any],
    spec: str,
    evaluator: str,
    kind: str,
    all_layers: bool,
    tolerance: float,
    seed: int,
    higher_is_better: bool,
) -> list[Delta]:
    now, before = _scores(current, spec, evaluator, kind), _scores(baseline, spec, evaluator, kind)
    if not before:
        return []
    if not now:
        # Scored in the baseline, not now: every example is undefined now.
        now = [[None] * len(current["example_ids"]) for _ in before]
    if all_layers:
        pairs = [(layer, layer) for layer in range(min(len(now), len(before)))]
    else:
        pairs = [(len(now) - 1, len(before) - 1)]
    before_index = {example: i for i, example in enumerate(baseline["example_ids"])}
    now_ids = set(current["example_ids"])
    missing = sum(example not in now_ids for example in before_index)
    shared = [
        (i, before_index[example])
        for i, example in enumerate(current["example_ids"])
        if example in before_index
    ]
    rows = []
    for layer_now, layer_before in pairs:
        values = np.array(
            [(now[layer_now][i], before[layer_before][j]) for i, j in shared], dtype=float
        ).reshape(-1, 2)
        undefined_now, undefined_before = np.isnan(values[:, 0]), np.isnan(values[:, 1])
        if len(values):
            undefined = (float(undefined_before.mean()), float(undefined_now.mean()))
        else:
            undefined = (math.nan, math.nan)
        values = values[~(undefined_now | undefined_before)]
        differences = values[:, 0] - values[:, 1]
        delta = float(differences.mean()) if len(differences) else math.nan
        ci = paired_bootstrap(differences, seed)
        # One pair has no CI (NaN): nothing shows the fall is noise, so the fall alone decides.
        if higher_is_better:
            fell = delta < -tolerance and (ci[1] < 0 or math.isnan(ci[1]))
        else:
            fell = delta > tolerance and (ci[0] > 0 or math.isnan(ci[0]))
        rows.append(
            Delta(
                method=spec,
                evaluator=evaluator,
                kind=kind,
                layer=layer_now + 1,
                baseline=float(values[:, 1].mean()) if len(values) else math.nan,
                current=float(values[:, 0].mean()) if len(values) else math.nan,
                delta=delta,
                ci=ci,
                n=len(differences),
                fell=bool(fell),
                higher_is_better=higher_is_better,
                undefined=undefined,
                undefined_rose=bool(undefined[1] - undefined[0] > tolerance),
                missing=missing,
            )
        )
    return rows


def _provenance_warnings(current: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    warnings = []
    model_now = current.get("provenance", {}).get("model", {})
    model_before = baseline.get("provenance", {}).get("model", {})
    if model_now.get("weights_sha256") != model_before.get("weights_sha256"):
        warnings.append(
            "the model weights differ (sha256 "
            f"{str(model_before.get('weights_sha256'))[:12]} -> "
            f"{str(model_now.get('weights_sha256'))[:12]}): the two results score different "
            "models, so these deltas may be meaningless"
        )
    data_now = current.get("provenance", {}).get("dataset", {})
    data_before = baseline.get("provenance", {}).get("dataset", {})
    if data_now.get("fingerprint") != data_before.get("fingerprint"):
        warnings.append(
            f"the dataset differs ({data_before.get('name')}/{data_before.get('split')}, "
            f"n={data_before.get('examples')} -> {data_now.get('name')}/{data_now.get('split')}, "
            f"n={data_now.get('examples')}; fingerprints differ): only shared example ids are "
            "compared"
        )
    if current.get("reference") != baseline.get("reference"):
        warnings.append(
            f"the reference changed ({baseline.get('reference')} -> {current.get('reference')})"
        )
    return warnings


def _higher_is_better(
    current: Mapping[str, Any], baseline: Mapping[str, Any], evaluator: str
) -> bool:
    """The evaluator's direction as the results record it (default: higher is better)."""
    for document in (current, baseline):
        info = document.get("evaluator_info", {}).get(evaluator)
        if info is not None and "higher_is_better" in info:
            return bool(info["higher_is_better"])
    return True


def compare(
    current: Mapping[str, Any],
    baseline: Mapping[str, Any],
    tolerance: float = DEFAULT_TOLERANCE,
    all_layers: bool = False,
    seed: int = 0,
) -> Comparison:
    """Compare two result documents; UsageError when they cannot be compared at all."""
    if tolerance < 0 or math.isnan(tolerance):
        raise UsageError(f"--tolerance must be a number >= 0, got {tolerance}")
    current_name, baseline_name = _source(current, "results"), _source(baseline, "baseline")
    validate(current, current_name)
    validate(baseline, baseline_name)
    _per_example(current, current_name)
    _per_example(baseline, baseline_name)
    comparison = Comparison(tolerance=tolerance)
    comparison.warnings = _provenance_warnings(current, baseline)
    config_now, config_before = current.get("config", {}), baseline.get("config", {})
    comparison.config_changes = [
        (key, config_before.get(key), config_now.get(key))
        for key in sorted(set(config_now) | set(config_before))
        if config_now.get(key) != config_before.get(key)
    ]
    evaluators_now = current.get("evaluators", {})
    evaluators_before = baseline.get("evaluators", {})
    for name, state in evaluators_before.items():
        if name not in evaluators_now:
            comparison.notes.append(f"evaluator `{name}` is not in the results")
        elif state["status"] == "ok" and evaluators_now[name]["status"] != "ok":
            comparison.failed_evaluators[name] = str(evaluators_now[name]["error"])
    comparison.notes += [
        f"evaluator `{name}` is new (no baseline)"
        for name in evaluators_now
        if name not in evaluators_before
    ]
    shared_evaluators = [
        name
        for name in evaluators_now
        if evaluators_now[name]["status"] == "ok"
        and evaluators_before.get(name, {}).get("status") == "ok"
    ]
    methods_now, methods_before = current["methods"], baseline["methods"]
    comparison.removed = [spec for spec in methods_before if spec not in methods_now]
    comparison.added = [spec for spec in methods_now if spec not in methods_before]
    kinds = ("aggregated", "local") if all_layers else ("aggregated",)
    for spec, method in methods_now.items():
        if spec not in methods_before:
            continue
        was_ok = methods_before[spec]["status"] == "ok"
        if method["status"] != "ok":
            if was_ok:
                comparison.failed[spec] = str(method.get("error"))
            else:
                comparison.notes.append(f"`{spec}` failed in both")
            continue
        if not was_ok:
            comparison.notes.append(f"`{spec}` failed in the baseline and runs now")
            continue
        for evaluator in shared_evaluators:
            pair = method.get("evaluators", {}).get(evaluator, {})
            if pair.get("status") == "failed" and _scores(baseline, spec, evaluator, kinds[0]):
                # Its scores are gone; the rows below show them as undefined, this says why.
                comparison.failed[f"{spec} ({evaluator})"] = str(pair.get("error"))
            higher = _higher_is_better(current, baseline, evaluator)
            for kind in kinds:
                comparison.rows += _compare_layers(
                    current, baseline, spec, evaluator, kind, all_layers, tolerance, seed, higher
                )
    if not comparison.rows and not comparison.failed and not comparison.failed_evaluators:
        raise UsageError(
            "nothing to compare: no method and evaluator scored in both files on shared "
            "examples (removed: "
            + (", ".join(comparison.removed) or "none")
            + "; added: "
            + (", ".join(comparison.added) or "none")
            + ")"
        )
    return comparison


def _number(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.3f}"


def _ci(ci: tuple[float, float]) -> str:
    if any(math.isnan(v) for v in ci):
        return "n/a"
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _share(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0%}"


def _undefined(row: Delta) -> str:
    before, now = (_share(value) for value in row.undefined)
    return before if before == now else f"{before} → {now}"


def _verdict(row: Delta, tolerance: float) -> str:
    problems = []
    if row.missing:
        problems.append(f"❌ {row.missing} baseline example(s) missing")
    if row.undefined_rose:
        problems.append(f"❌ undefined {_undefined(row)}")
    if row.n == 0:
        problems.append("❌ no example scored in both")
    if row.fell:
        problems.append("❌ regression")
    if problems:
        return "; ".join(problems)
    sign = 1.0 if row.higher_is_better else -1.0
    if sign * row.delta < -tolerance:
        return "⚠️ worse, within noise"
    if sign * row.delta > tolerance and row.improved:
        return "✅ improved"
    return "✅ ok"


def _value(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def _markdown(comparison: Comparison, current_name: str, baseline_name: str) -> str:
    regressions = len(comparison.regressions) + len(comparison.failed)
    regressions += len(comparison.failed_evaluators)
    if comparison.passed:
        title = "## ✅ attrib-bench check: no regression"
    else:
        title = f"## ❌ attrib-bench check: {regressions} regression(s)"
    lines = [title, ""]
    for warning in comparison.warnings:
        lines += [f"> [!WARNING]\n> **{warning}**", ""]
    lines += [
        f"`{current_name}` against `{baseline_name}`. A score regresses when it fell by more "
        f"than the tolerance ({comparison.tolerance:g}) **and** the 95% paired-bootstrap CI of "
        "the change lies below zero (↓ marks evaluators where lower is better: a rise regresses). "
        "So does a rise by more than the tolerance in the share of examples whose score is "
        "undefined, any baseline example missing from the results, and a score with no example "
        "defined in both. n: examples scored in both.",
        "",
        "| method | evaluator | rows | layer | baseline | current | Δ | 95% CI of Δ | n "
        "| undefined | |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    ordered = sorted(
        comparison.rows,
        key=lambda r: (not r.regression, -math.inf if math.isnan(r.delta) else r.delta),
    )
    for row in ordered:
        lines.append(
            f"| `{row.method}` | {row.evaluator}{'' if row.higher_is_better else ' ↓'} | "
            f"{row.kind} | {row.layer} | "
            f"{_number(row.baseline)} | {_number(row.current)} | **{_number(row.delta)}** | "
            f"{_ci(row.ci)} | {row.n} | {_undefined(row)} | {_verdict(row, comparison.tolerance)} |"
        )
    lines.append("")
    if comparison.failed:
        lines.append("**Failed now** (ok in the baseline):")
        lines += [f"- ❌ `{spec}`: {error}" for spec, error in comparison.failed.items()]
        lines.append("")
    if comparison.failed_evaluators:
        lines.append("**Evaluators failed now** (ok in the baseline):")
        lines += [f"- ❌ `{name}`: {e}" for name, e in comparison.failed_evaluators.items()]
        lines.append("")
    if comparison.removed:
        lines.append(
            "**Removed** (in the baseline, not in the results): "
            + ", ".join(f"`{spec}`" for spec in comparison.removed)
        )
        lines.append("")
    if comparison.added:
        lines.append(
            "**Added** (no baseline yet): " + ", ".join(f"`{s}`" for s in comparison.added)
        )
        lines.append("")
    if comparison.notes:
        lines += [f"- {note}" for note in comparison.notes] + [""]
    if comparison.config_changes:
        lines.append("**Config changes** (baseline → results):")
        for key, before, now in comparison.config_changes:
            harmless = " (does not change the numbers)" if key in HARMLESS_CONFIG else ""
            lines.append(f"- `{key}`: {_value(before)} → {_value(now)}{harmless}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_step_summary(text: str) -> Path | None:
    """Append to ``$GITHUB_STEP_SUMMARY`` when set (GitHub Actions shows it on the run page)."""
    target = os.environ.get(SUMMARY_ENV)
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(text + "\n")
    return Path(target)
