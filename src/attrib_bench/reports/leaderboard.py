"""The leaderboard: methods ranked per evaluator, as rows of data and as the terminal table
``run`` prints; the HTML and Markdown reports rank the same way."""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

from rich.table import Table

from attrib_bench.results.typed import LayerScore, MethodResult, Result, Results, as_result


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def signed(value: Any) -> str:
    return f"{value:+.3f}" if finite(value) else "-"


def ok_evaluators(document: Results) -> list[str]:
    result = as_result(document)
    return [name for name, e in result.evaluators.items() if e["status"] == "ok"]


def _sign(result: Result, evaluator: str) -> float:
    """+1 where higher scores are better (the default), -1 where lower are."""
    info = result.evaluator_info.get(evaluator, {})
    return 1.0 if info.get("higher_is_better", True) else -1.0


def heading(document: Results, evaluator: str, kind: str | None = None) -> str:
    """``spearman vs saliency (aggregated rows)``, with the direction when lower is better,
    and a warning when the run's meta-evaluation flagged the evaluator on its model."""
    result = as_result(document)
    info = result.evaluator_info.get(evaluator, {})
    versus = f" vs {result.reference}" if info.get("needs_reference", True) else ""
    notes = [f"{kind} rows"] if kind else []
    if _sign(result, evaluator) < 0:
        notes.append("lower is better")
    if evaluator in meta_flagged(result):
        notes.append("UNRELIABLE here: could not order known degradations (meta)")
    return f"{evaluator}{versus}" + (f" ({', '.join(notes)})" if notes else "")


def meta_flagged(result: Result) -> set[str]:
    """The evaluators ``run --meta`` flagged on the run's own model (not the synthetic one)."""
    section = result.extra.get("meta") or {}
    return {
        name
        for run in section.get("runs", [])
        if not run.get("synthetic")
        for name, row in run["evaluators"].items()
        if row.get("flagged")
    }


def layer_scores(method: MethodResult, evaluator: str, kind: str) -> list[LayerScore] | None:
    return method.scores.get(evaluator, {}).get(kind)


def _goodness(method: MethodResult, evaluator: str, kind: str, sign: float) -> float:
    layers = layer_scores(method, evaluator, kind)
    mean = layers[-1].mean if layers else None
    return sign * mean if finite(mean) else -math.inf


def ranked(document: Results, evaluator: str, kind: str = "aggregated") -> list[str]:
    """Method specs best first by last-layer score; failed methods last."""
    result = as_result(document)
    methods, sign = result.methods, _sign(result, evaluator)
    return sorted(methods, key=lambda spec: -_goodness(methods[spec], evaluator, kind, sign))


def answer_columns(result: Result) -> list[tuple[str, str]]:
    """With ``model_right`` (next-token data): the columns of the last-layer mean over the
    examples the model gets right and over the wrong ones, as (answer, heading with the count)."""
    if result.model_right is None:
        return []
    right = sum(result.model_right)
    return [
        ("right", f"right (n={right})"),
        ("wrong", f"wrong (n={len(result.model_right) - right})"),
    ]


def leaderboard_rows(document: Results, evaluator: str, kind: str) -> list[dict]:
    """The terminal leaderboard's columns as data: best (layer), last, CI, n, cost, status, and
    with ``model_right`` the last layer over the right and the wrong examples."""
    result = as_result(document)
    rows = []
    for spec in ranked(result, evaluator, kind):
        method = result.methods[spec]
        layers = layer_scores(method, evaluator, kind)
        if method.status == "ok" and not layers:
            continue
        row = {"spec": spec, "status": method.status, "error": method.error}
        if layers:
            scored = [x for x in layers if finite(x.mean)]
            sign = _sign(result, evaluator)
            best = max(scored, key=lambda x: sign * x.mean) if scored else None
            last = layers[-1]
            row["best"] = signed(best.mean if best else None) + (
                f" ({best.layer})" if best and len(layers) > 1 else ""
            )
            row["last"] = signed(last.mean)
            low, high = last.ci95
            row["ci"] = f"[{low:+.2f}, {high:+.2f}]" if finite(low) and finite(high) else "-"
            row["n"] = str(last.n)
            for answer, _ in answer_columns(result):
                row[answer] = _mean(method.answer_score(answer, evaluator, kind))
        seconds = method.seconds_per_example
        row["seconds"] = f"{seconds:.4f}" if finite(seconds) else "-"
        memory = method.peak_memory_mb
        row["memory"] = f"{memory:.1f}" if finite(memory) else "-"
        rows.append(row)
    return rows


#: The marker on a leaderboard row whose next row is not significantly worse.
NOT_AHEAD = "≈"


def next_row_differences(document: Results, evaluator: str, kind: str) -> list[dict]:
    """Rank i against rank i + 1 (methods with a last-layer score, in ``ranked`` order): the
    paired difference of their per-example scores (``Result.paired``: mean, 95% CI, p, n), and
    ``ahead``: False when the next row is not significantly worse (p >= the section's alpha, or
    no p); empty without a ``paired`` section for this evaluator and kind."""
    result = as_result(document)
    paired = result.paired
    if paired is None or kind not in paired.comparisons.get(evaluator, {}):
        return []
    order = [
        spec
        for spec in ranked(result, evaluator, kind)
        if finite(_goodness(result.methods[spec], evaluator, kind, 1.0))
    ]
    rows = []
    for rank, (spec, following) in enumerate(pairwise(order), 1):
        comparison = paired.comparison(evaluator, kind, spec, following)
        if comparison is None:
            continue
        low, high = comparison.ci95
        rows.append(
            {
                "rank": rank,
                "spec": spec,
                "next": following,
                "difference": signed(comparison.mean),
                "ci": f"[{low:+.3f}, {high:+.3f}]" if finite(low) and finite(high) else "-",
                "p": f"{comparison.p:.3f}" if finite(comparison.p) else "-",
                "n": str(comparison.n),
                "ahead": comparison.significant(paired.alpha),
            }
        )
    return rows


def paired_caption(document: Results, column: bool = True) -> str:
    """What the ``vs next`` column and its marker mean; without ``column``, what the reports'
    table of rank i against rank i + 1 holds."""
    result = as_result(document)
    alpha = result.paired.alpha if result.paired is not None else 0.05
    if not column:
        return (
            "Rank i against rank i + 1: the mean of the per-example differences of their "
            "last-layer scores, with a paired bootstrap 95% CI and two-sided p over the examples "
            f"both scored; not significantly ahead: p >= {alpha:g}"
        )
    return (
        f"vs next: p of the paired difference with the next row (bootstrap over the examples "
        f"both scored, last layer); {NOT_AHEAD}: not significantly ahead of it (p >= {alpha:g})"
    )


def scored_kinds(result: Result, evaluator: str) -> list[str]:
    present = {
        kind for method in result.methods.values() for kind in method.scores.get(evaluator, {})
    }
    return [kind for kind in ("aggregated", "local") if kind in present]


def _mean(entry: LayerScore | None) -> str:
    if entry is None or math.isnan(entry.mean):
        return "-"
    return f"{entry.mean:+.3f}"


def _ci(entry: LayerScore | None) -> str:
    if entry is None or math.isnan(entry.ci95[0]):
        return "-"
    low, high = entry.ci95
    return f"[{low:+.2f},{high:+.2f}]"


def _added_caption(result: Result) -> str:
    """Which rows were not selected: the reference and the random floor join every table."""
    notes = []
    for key, role in (("added_as_reference", "the reference"), ("added_as_floor", "the floor")):
        added = [spec for spec, m in result.methods.items() if getattr(m, key)]
        if added:
            notes.append(f"{', '.join(added)}: added as {role}")
    return "; ".join(notes)


def _status(method: MethodResult, evaluator: str) -> str:
    if method.status != "ok":
        return f"failed: {method.error}"
    pair = method.evaluators.get(evaluator, {"status": "ok"})
    if pair["status"] == "failed":
        return f"{evaluator} failed: {pair['error']}"
    return pair["status"]


def leaderboard(document: Results, evaluator: str, kind: str = "aggregated") -> Table:
    """Rows = methods, best last-layer score first; best layer and last layer with 95% CI.

    Next-token runs add the last layer's mean over the examples the model gets right and, apart,
    over those it gets wrong (``answer_columns``). Cost columns: seconds per example and peak
    memory (MB), both standalone.
    """
    document = as_result(document)
    model = document.provenance["model"]
    dataset = document.provenance["dataset"]
    info = document.evaluator_info.get(evaluator, {})
    higher_is_better = info.get("higher_is_better", True)
    versus = f" vs {document.reference}" if info.get("needs_reference", True) else ""
    direction = "" if higher_is_better else ", lower is better"
    versus_next = {row["spec"]: row for row in next_row_differences(document, evaluator, kind)}
    captions = [_added_caption(document), paired_caption(document) if versus_next else ""]
    table = Table(
        title=f"{evaluator}{versus} ({kind}{direction}) — {model['name']} on "
        f"{Path(dataset['name']).name}/{dataset['split']} (n={dataset['examples']})",
        title_justify="left",
        caption="\n".join(c for c in captions if c) or None,
        caption_justify="left",
    )
    table.add_column("method", style="bold", no_wrap=True)
    table.add_column("best (layer)", justify="right", no_wrap=True)
    table.add_column("last layer", justify="right", no_wrap=True)
    table.add_column("95% CI", justify="right", no_wrap=True)
    if versus_next:
        table.add_column("vs next", justify="right", no_wrap=True)
    answers = answer_columns(document)
    for _, title in answers:
        table.add_column(title, justify="right", no_wrap=True)
    table.add_column("s/ex", justify="right", no_wrap=True)
    table.add_column("peak MB", justify="right", no_wrap=True)
    table.add_column("status")
    sign = 1.0 if higher_is_better else -1.0

    def last_mean(item: tuple[str, MethodResult]) -> float:
        layers = layer_scores(item[1], evaluator, kind)
        mean = layers[-1].mean if layers else None
        return -math.inf if mean is None or math.isnan(mean) else sign * mean

    for spec, method in sorted(document.methods.items(), key=last_mean, reverse=True):
        layers = layer_scores(method, evaluator, kind)
        seconds = method.seconds_per_example
        status = _status(method, evaluator)
        row = ["-"] * (3 + bool(versus_next) + len(answers))
        if layers:
            scored = [x for x in layers if not math.isnan(x.mean)]
            best = max(scored, key=lambda x: sign * x.mean) if scored else None
            best_text = _mean(best) + (f" ({best.layer})" if best and len(layers) > 1 else "")
            row = [best_text, _mean(layers[-1]), _ci(layers[-1])]
            row += [_versus_next(versus_next.get(spec))] if versus_next else []
            row += [_mean(method.answer_score(answer, evaluator, kind)) for answer, _ in answers]
        memory = method.peak_memory_mb
        table.add_row(
            spec,
            *row,
            f"{seconds:.4f}" if seconds is not None else "-",
            f"{memory:.1f}" if memory is not None else "-",
            status,
            style=None if status == "ok" else "red",
        )
    return table


def _versus_next(row: dict | None) -> str:
    if row is None:
        return ""
    return f"{row['p']}" + ("" if row["ahead"] else f" {NOT_AHEAD}")


def models_table(document: dict[str, Any]) -> Table | None:
    """A run over several models: each method's ranking score per model, and the Kendall tau
    of the method ranking between models (``document["models"]``); None for other runs."""
    section = document.get("models")
    ranking = (section or {}).get("ranking")
    if not ranking:
        return None
    by = ranking["evaluator"]
    tau = ranking["mean"]
    table = Table(
        title=f"{by} (aggregated, last layer) per model; method ranking across models: "
        f"Kendall tau mean {signed(tau) if finite(tau) else 'n/a'}, "
        f"min {signed(ranking['min']) if finite(ranking['min']) else 'n/a'} "
        f"({len(ranking['methods'])} methods, the reference left out)",
        title_justify="left",
    )
    table.add_column("method", style="bold", no_wrap=True)
    for index, entry in enumerate(section["per_model"]):
        table.add_column(f"{index + 1}: {entry['name']}", justify="right", no_wrap=True)
    for spec in ranking["methods"]:
        values = [entry["last_layer"][spec][by] for entry in section["per_model"]]
        table.add_row(spec, *(signed(v) for v in values))
    return table


def left_out_line(document: dict[str, Any]) -> str | None:
    """One line naming the installed methods a default run left out (a third party's, or a
    ``--plugin`` file's) and how to run them; None when the run named its methods or left
    nothing out."""
    default = document.get("provenance", {}).get("default_attributors")
    if not default or not default["used"] or not default["left_out"]:
        return None
    names = ", ".join(default["left_out"])
    return (
        f"not in the default run (not shipped with attrib-bench): {names}; name them to run "
        "them: --attributors NAME,... (with the default methods wanted) or a config file's "
        "attributors"
    )


def hits_line(section: Mapping[str, Any]) -> str:
    """One line for the terminal: how much of the run came from the cache."""
    hits = section.get("hits") or {}
    reused = {spec: n for spec, n in hits.items() if n}
    if not reused:
        return f"cache: nothing reused, new entries in {section.get('dir')}"
    listed = ", ".join(f"{spec} {n}" for spec, n in reused.items())
    return f"cache: examples reused per method: {listed} ({section.get('dir')})"
