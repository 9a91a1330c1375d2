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
now, are regressions too, and so is a method ``ok`` in the baseline that is gone from the
results (dropped from the run, or its plugin stopped importing and the run left it out) unless
the user removed it on purpose (``allow_removed``: a spec, or a name for all its specs).

A different model (weights sha256) or reference makes the deltas meaningless, so comparing
them is a usage error unless allowed explicitly (``allow_model_change``,
``allow_reference_change``); allowed, it is a loud warning. Evaluators that disappeared or
appeared, methods added, changed config keys and a different dataset are reported and do not
decide the exit code.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attrib_bench.core.errors import ExitCode, UsageError
from attrib_bench.results.typed import Result, Results, as_result, source_name

DEFAULT_TOLERANCE = 0.02
RESAMPLES = 2000


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
    #: Methods in the baseline and not in the results.
    removed: list[str] = field(default_factory=list)
    #: Those of them the user removed on purpose, and the flag that says so.
    allowed_removed: dict[str, str] = field(default_factory=dict)
    #: Those of them failed in the baseline: nothing was lost.
    removed_failed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    #: Notes that do not fail the gate: recovered methods, evaluators added or removed.
    notes: list[str] = field(default_factory=list)
    config_changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    #: Loud warnings: the model or the data differ, so the comparison may be meaningless.
    warnings: list[str] = field(default_factory=list)
    #: The user allowed a different model or reference (each then one of ``warnings``).
    allow_model_change: bool = False
    allow_reference_change: bool = False

    @property
    def regressions(self) -> list[Delta]:
        return [row for row in self.rows if row.regression]

    @property
    def unallowed_removed(self) -> list[str]:
        """Methods ok in the baseline, gone from the results, not removed on purpose."""
        skip = {*self.allowed_removed, *self.removed_failed}
        return [spec for spec in self.removed if spec not in skip]

    @property
    def passed(self) -> bool:
        return not (
            self.regressions or self.failed or self.failed_evaluators or self.unallowed_removed
        )

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.passed else ExitCode.REGRESSION


def _per_example(result: Result, name: str) -> None:
    """Refuse a file without the per-example scores behind its summaries: a run writes both,
    and a score with no examples would otherwise read as "undefined on every example"."""
    where = "no example_ids and per-example scores"
    if result.example_ids:
        where = next(
            (
                f"methods[{spec!r}].scores[{evaluator!r}].{kind} has no per-example scores"
                for spec, method in result.methods.items()
                for evaluator, kinds in method.scores.items()
                for kind in kinds
                if not method.per_example.get(evaluator, {}).get(kind)
            ),
            "",
        )
    if where:
        raise UsageError(
            f"{name!r} holds summaries only ({where}), so no paired comparison is possible; "
            "write it with attrib-bench run --output"
        )


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


def _scores(result: Result, spec: str, evaluator: str, kind: str) -> list | None:
    return result.methods[spec].per_example.get(evaluator, {}).get(kind)


def _compare_layers(
    current: Result,
    baseline: Result,
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
        now = [[math.nan] * len(current.example_ids) for _ in before]
    if all_layers:
        pairs = [(layer, layer) for layer in range(min(len(now), len(before)))]
    else:
        pairs = [(len(now) - 1, len(before) - 1)]
    before_index = {example: i for i, example in enumerate(baseline.example_ids)}
    now_ids = set(current.example_ids)
    missing = sum(example not in now_ids for example in before_index)
    shared = [
        (i, before_index[example])
        for i, example in enumerate(current.example_ids)
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


def _provenance_warnings(
    current: Result, baseline: Result, allow_model_change: bool, allow_reference_change: bool
) -> list[str]:
    """The loud warnings; a different model or reference not allowed is a UsageError."""
    warnings = []
    model_now = current.provenance.get("model", {})
    model_before = baseline.provenance.get("model", {})
    if model_now.get("weights_sha256") != model_before.get("weights_sha256"):
        change = (
            "the model weights differ (sha256 "
            f"{str(model_before.get('weights_sha256'))[:12]} -> "
            f"{str(model_now.get('weights_sha256'))[:12]}): the two results score different "
            "models, so these deltas may be meaningless"
        )
        if not allow_model_change:
            raise UsageError(
                f"{change}; pass --allow-model-change (allow_model_change=True) to compare "
                "them anyway"
            )
        warnings.append(f"{change} (allowed by --allow-model-change)")
    data_now = current.provenance.get("dataset", {})
    data_before = baseline.provenance.get("dataset", {})
    if data_now.get("fingerprint") != data_before.get("fingerprint"):
        warnings.append(
            f"the dataset differs ({data_before.get('name')}/{data_before.get('split')}, "
            f"n={data_before.get('examples')} -> {data_now.get('name')}/{data_now.get('split')}, "
            f"n={data_now.get('examples')}; fingerprints differ): only shared example ids are "
            "compared"
        )
    if current.reference != baseline.reference:
        change = (
            f"the reference differs ({baseline.reference} -> {current.reference}): the "
            "evaluators that compare with it score against another method"
        )
        if not allow_reference_change:
            raise UsageError(
                f"{change}; pass --allow-reference-change (allow_reference_change=True) to "
                "compare them anyway"
            )
        warnings.append(f"{change} (allowed by --allow-reference-change)")
    return warnings


def _removed(
    comparison: Comparison, current: Result, baseline: Result, allow_removed: Collection[str]
) -> None:
    """Sort the methods gone from the results: removed on purpose, failed before, or lost.

    Methods the baseline only added (never selected) leave on purpose with the setting that
    added them: its reference with an allowed reference change, its floor (``random``) when
    the results were run with ``--no-floor``.
    """
    comparison.removed = [spec for spec in baseline.methods if spec not in current.methods]
    comparison.removed_failed = [
        spec for spec in comparison.removed if baseline.methods[spec].status != "ok"
    ]
    old_reference = comparison.allow_reference_change and current.reference != baseline.reference
    for spec in comparison.removed:
        if spec in comparison.removed_failed:
            continue
        if spec in allow_removed or spec.partition(":")[0] in allow_removed:
            comparison.allowed_removed[spec] = "--allow-removed"
        elif old_reference and baseline.methods[spec].added_as_reference:
            comparison.allowed_removed[spec] = "--allow-reference-change"
        elif baseline.methods[spec].added_as_floor and current.config.get("floor") is False:
            comparison.allowed_removed[spec] = "--no-floor"
    for allowed in allow_removed:
        if any(allowed in (spec, spec.partition(":")[0]) for spec in comparison.removed):
            continue
        if any(allowed in (spec, spec.partition(":")[0]) for spec in current.methods):
            comparison.notes.append(f"`--allow-removed {allowed}`: `{allowed}` is in the results")
        else:
            comparison.notes.append(f"`--allow-removed {allowed}`: no such method in the baseline")
    comparison.notes += [
        f"`{spec}` failed in the baseline and is not in the results"
        for spec in comparison.removed_failed
    ]


def _higher_is_better(current: Result, baseline: Result, evaluator: str) -> bool:
    """The evaluator's direction as the results record it (default: higher is better)."""
    for result in (current, baseline):
        info = result.evaluator_info.get(evaluator)
        if info is not None and "higher_is_better" in info:
            return bool(info["higher_is_better"])
    return True


def compare(
    current: Results,
    baseline: Results,
    tolerance: float = DEFAULT_TOLERANCE,
    all_layers: bool = False,
    seed: int = 0,
    allow_removed: Collection[str] = (),
    allow_model_change: bool = False,
    allow_reference_change: bool = False,
) -> Comparison:
    """Compare two results (``Result``, validated document or path, see ``as_result``);
    UsageError when they cannot be compared at all. ``allow_removed``: specs, or names for
    all their specs, removed on purpose (not a regression when gone from the results)."""
    if tolerance < 0 or math.isnan(tolerance):
        raise UsageError(f"--tolerance must be a number >= 0, got {tolerance}")
    current, baseline = as_result(current, "results"), as_result(baseline, "baseline")
    _per_example(current, source_name(current, "results"))
    _per_example(baseline, source_name(baseline, "baseline"))
    comparison = Comparison(
        tolerance=tolerance,
        allow_model_change=allow_model_change,
        allow_reference_change=allow_reference_change,
    )
    comparison.warnings = _provenance_warnings(
        current, baseline, allow_model_change, allow_reference_change
    )
    config_now, config_before = current.config, baseline.config
    comparison.config_changes = [
        (key, config_before.get(key), config_now.get(key))
        for key in sorted(set(config_now) | set(config_before))
        if config_now.get(key) != config_before.get(key)
    ]
    evaluators_now, evaluators_before = current.evaluators, baseline.evaluators
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
    methods_now, methods_before = current.methods, baseline.methods
    _removed(comparison, current, baseline, allow_removed)
    comparison.added = [spec for spec in methods_now if spec not in methods_before]
    kinds = ("aggregated", "local") if all_layers else ("aggregated",)
    for spec, method in methods_now.items():
        if spec not in methods_before:
            continue
        was_ok = methods_before[spec].status == "ok"
        if method.status != "ok":
            if was_ok:
                comparison.failed[spec] = str(method.error)
            else:
                comparison.notes.append(f"`{spec}` failed in both")
            continue
        if not was_ok:
            comparison.notes.append(f"`{spec}` failed in the baseline and runs now")
            continue
        for evaluator in shared_evaluators:
            pair = method.evaluators.get(evaluator, {})
            if pair.get("status") == "failed" and _scores(baseline, spec, evaluator, kinds[0]):
                # Its scores are gone; the rows below show them as undefined, this says why.
                comparison.failed[f"{spec} ({evaluator})"] = str(pair.get("error"))
            higher = _higher_is_better(current, baseline, evaluator)
            for kind in kinds:
                comparison.rows += _compare_layers(
                    current, baseline, spec, evaluator, kind, all_layers, tolerance, seed, higher
                )
    found = comparison.failed or comparison.failed_evaluators or comparison.unallowed_removed
    if not comparison.rows and not found:
        raise UsageError(
            "nothing to compare: no method and evaluator scored in both files on shared "
            "examples (removed: "
            + (", ".join(comparison.removed) or "none")
            + "; added: "
            + (", ".join(comparison.added) or "none")
            + ")"
        )
    return comparison
