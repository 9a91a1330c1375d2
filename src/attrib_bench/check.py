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

A method ``ok`` in the baseline that failed now, and an evaluator that failed now, are
regressions too. Methods or evaluators that disappeared or appeared, changed
config keys, and a different model or dataset are reported, and do not decide the exit code.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attrib_bench.errors import ExitCode, UsageError

DEFAULT_TOLERANCE = 0.02
RESAMPLES = 2000
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
#: Config keys that never change a number (the summary still lists them, marked as such).
HARMLESS_CONFIG = frozenset({"batch_size", "device"})


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
    n: int
    regression: bool
    higher_is_better: bool = True

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


def load_results(path: Path | str) -> dict[str, Any]:
    """A result document from ``attrib-bench run --output``; UsageError when unusable."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"result file {str(path)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{str(path)!r} is not JSON ({error})") from None
    validate(document, str(path))
    return document


def validate(document: Any, name: str) -> None:
    """Check the parts of the result schema the gate and the report read."""
    if not isinstance(document, dict) or "methods" not in document:
        raise UsageError(f"{name!r} is not an attrib-bench result (no 'methods')")
    version = document.get("schema_version")
    if version != 1:
        raise UsageError(f"{name!r} has schema_version {version!r}; this attrib-bench reads 1")
    if not isinstance(document["methods"], dict):
        raise UsageError(f"{name!r}: 'methods' must be an object")


def _per_example(document: Mapping[str, Any], name: str) -> list[str]:
    ids = document.get("example_ids")
    if not isinstance(ids, list):
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
    if not now or not before:
        return []
    if all_layers:
        pairs = [(layer, layer) for layer in range(min(len(now), len(before)))]
    else:
        pairs = [(len(now) - 1, len(before) - 1)]
    before_index = {example: i for i, example in enumerate(baseline["example_ids"])}
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
        values = values[~np.isnan(values).any(axis=1)]
        differences = values[:, 0] - values[:, 1]
        delta = float(differences.mean()) if len(differences) else math.nan
        ci = paired_bootstrap(differences, seed)
        if higher_is_better:
            regression = delta < -tolerance and ci[1] < 0
        else:
            regression = delta > tolerance and ci[0] > 0
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
                regression=bool(regression),
                higher_is_better=higher_is_better,
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
    validate(current, "results")
    validate(baseline, "baseline")
    _per_example(current, "results")
    _per_example(baseline, "baseline")
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


def _verdict(row: Delta, tolerance: float) -> str:
    if row.regression:
        return "❌ regression"
    if math.isnan(row.delta):
        return "⚠️ no shared scores"
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
        "the change lies below zero (↓ marks evaluators where lower is better: a rise regresses).",
        "",
        "| method | evaluator | rows | layer | baseline | current | Δ | 95% CI of Δ | n | |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    ordered = sorted(comparison.rows, key=lambda r: (not r.regression, r.delta))
    for row in ordered:
        lines.append(
            f"| `{row.method}` | {row.evaluator}{'' if row.higher_is_better else ' ↓'} | "
            f"{row.kind} | {row.layer} | "
            f"{_number(row.baseline)} | {_number(row.current)} | **{_number(row.delta)}** | "
            f"{_ci(row.ci)} | {row.n} | {_verdict(row, comparison.tolerance)} |"
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
