"""The Markdown report: leaderboards, per-layer tables, the ranking across models (a run over
several models) and provenance, for text and PRs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrib_bench.reports.attributions import token_rows
from attrib_bench.reports.evaluator_agreement import evaluator_agreement_markdown
from attrib_bench.reports.leaderboard import (
    answer_columns,
    finite,
    heading,
    layer_scores,
    leaderboard_rows,
    next_row_differences,
    ok_evaluators,
    paired_caption,
    ranked,
    scored_kinds,
    signed,
)
from attrib_bench.reports.provenance import DEFAULT_EXAMPLES, provenance_rows, shown_examples, title
from attrib_bench.reports.similarity import across_models_markdown
from attrib_bench.results.agreement import TITLES
from attrib_bench.results.typed import Result, Results, as_result


def render_markdown(
    document: Results,
    attributions: Mapping[str, Mapping[str, Any]] | None = None,
    examples: int = DEFAULT_EXAMPLES,
    top: int = 5,
) -> str:
    """The report as Markdown: leaderboards, per-layer means, top tokens, provenance."""
    document = as_result(document)
    data = document.provenance["dataset"]
    lines = [
        f"# {title(document)}",
        "",
        f"n = {data.get('examples')} examples, reference `{document.reference}`, "
        f"created {document.created}.",
        "",
    ]
    evaluators = ok_evaluators(document)
    answers = answer_columns(document)
    keys = ("best", "last", "ci", "n", *(answer for answer, _ in answers), "seconds", "memory")
    titles = " | ".join(title for _, title in answers) + " | " if answers else ""
    for evaluator in evaluators:
        for kind in scored_kinds(document, evaluator):
            lines += [
                f"## {heading(document, evaluator, kind)}",
                "",
                f"| # | method | best (layer) | last layer | 95% CI | n | {titles}s/ex | peak MB "
                "| status |",
                "|---:|---|" + "---:|" * len(keys) + "---|",
            ]
            for rank, row in enumerate(leaderboard_rows(document, evaluator, kind), 1):
                status = "ok" if row["status"] == "ok" else f"failed: {row['error']}"
                cells = [row.get(k, "-") for k in keys]
                lines.append(
                    f"| {rank} | `{row['spec']}` | " + " | ".join(cells) + f" | {status} |"
                )
            lines.append("")
            lines += _next_rows(document, evaluator, kind)
        depth = max(
            (len(layer_scores(m, evaluator, "aggregated") or [])) for m in document.methods.values()
        )
        if depth > 1:
            lines += [
                f"### Per layer ({evaluator}, aggregated rows, mean)",
                "",
                "| method | " + " | ".join(f"L{i}" for i in range(1, depth + 1)) + " |",
                "|---|" + "---:|" * depth,
            ]
            for spec in ranked(document, evaluator):
                layers = layer_scores(document.methods[spec], evaluator, "aggregated") or []
                if len(layers) > 1:
                    cells = [signed(x.mean) for x in layers]
                    lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
            lines.append("")
    for name, state in document.evaluators.items():
        if state["status"] != "ok":
            lines += [f"Evaluator `{name}` failed: {state['error']}", ""]
    lines += across_models_markdown(document.extra)
    lines += _agreement(document)
    lines += evaluator_agreement_markdown(document)
    rows = token_rows(document, shown_examples(document, examples), attributions)
    order = ranked(document, evaluators[0]) if evaluators else list(document.methods)
    order += sorted({spec for methods in rows.values() for spec in methods} - set(order))
    if rows:
        lines += [f"## Top {top} tokens (last-layer aggregated rows)", ""]
        for example, methods in rows.items():
            lines += [f"**Example `{example}`**", "", "| method | top tokens |", "|---|---|"]
            for spec in [s for s in order if s in methods]:
                entry = methods[spec]
                pairs = sorted(
                    zip(entry["tokens"], entry["row"], strict=False),
                    key=lambda pair: -abs(pair[1]) if finite(pair[1]) else 0.0,
                )[:top]
                shown = ", ".join(
                    f"`{token}` " + (f"{value:+.3g}" if finite(value) else "-")
                    for token, value in pairs
                )
                lines.append(f"| `{spec}` | {shown} |")
            lines.append("")
    lines += ["## Provenance", ""]
    lines += [f"- **{name}**: {value}" for name, value in provenance_rows(document)]
    return "\n".join(lines) + "\n"


def _next_rows(result: Result, evaluator: str, kind: str) -> list[str]:
    """Rank i against rank i + 1: the paired difference, its CI and p (none without)."""
    rows = next_row_differences(result, evaluator, kind)
    if not rows:
        return []
    lines = [
        f"{paired_caption(result, column=False)}:",
        "",
        "| # | method | next | difference | 95% CI | p | n | |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        mark = "" if row["ahead"] else "not significantly ahead"
        lines.append(
            f"| {row['rank']} | `{row['spec']}` | `{row['next']}` | {row['difference']} | "
            f"{row['ci']} | {row['p']} | {row['n']} | {mark} |"
        )
    return [*lines, ""]


def _agreement(result: Result) -> list[str]:
    """The feature agreement matrix (methods numbered); the other measures are in the JSON and
    the HTML report."""
    agreement = result.agreement
    if agreement is None or len(agreement.methods) < 2 or "feature" not in agreement.measures:
        return []
    methods = agreement.methods
    matrix = agreement.matrix("feature")
    lines = [
        f"## Agreement between methods: {TITLES['feature']} at top {agreement.k}",
        "",
        "Mean over examples of the share of the top-k tokens by |score| two methods share "
        "(Krishna et al. 2022; real tokens without special tokens); rank, sign and signed-rank "
        "agreement and rank correlation are in the HTML report and the JSON.",
        "",
        "| # | method | " + " | ".join(str(i) for i in range(1, len(methods) + 1)) + " |",
        "|---:|---|" + "---:|" * len(methods),
    ]
    for i, spec in enumerate(methods):
        cells = [f"{v:.2f}" if finite(float(v)) else "-" for v in matrix[i]]
        lines.append(f"| {i + 1} | `{spec}` | " + " | ".join(cells) + " |")
    return [*lines, ""]
