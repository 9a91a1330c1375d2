"""The regression gate's verdict as Markdown (``attrib-bench check``, the job summary in CI)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attrib_bench.results.compare import Comparison, Delta

#: Where GitHub Actions reads a job's summary from (a file it shows on the run page).
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
#: Config keys that never change a number (the summary still lists them, marked as such).
HARMLESS_CONFIG = frozenset({"batch_size", "device"})


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


def gate_markdown(
    comparison: Comparison, current_name: str = "results", baseline_name: str = "baseline"
) -> str:
    """The gate's verdict as Markdown: what ``check`` prints and CI shows on the run page."""
    regressions = len(comparison.regressions) + len(comparison.failed)
    regressions += len(comparison.failed_evaluators) + len(comparison.unallowed_removed)
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
    if comparison.unallowed_removed:
        lines.append(
            "**Removed** (ok in the baseline, not in the results; name a method removed on "
            "purpose with --allow-removed):"
        )
        lines += [f"- ❌ `{spec}`" for spec in comparison.unallowed_removed]
        lines.append("")
    for flag in sorted(set(comparison.allowed_removed.values())):
        specs = [spec for spec, by in comparison.allowed_removed.items() if by == flag]
        lines.append(
            f"**Removed on purpose** ({flag}): " + ", ".join(f"`{spec}`" for spec in specs)
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
