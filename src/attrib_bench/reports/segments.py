"""The segment report (``attrib-bench context``) as a terminal table, Markdown and HTML."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from rich.table import Table


def _missing(value: float | None) -> bool:
    """NaN in memory, null once written as JSON (``write_json``)."""
    return value is None or math.isnan(value)


def _cell(summary: Mapping[str, Any] | None) -> str:
    if summary is None or _missing(summary["mean"]):
        return "-"
    low, high = summary["ci95"]
    interval = "" if _missing(low) else f" [{low:.3f}, {high:.3f}]"
    return f"{summary['mean']:.3f}{interval}"


def _explained(report: Mapping[str, Any]) -> str:
    """What the report's scores explain, from its target (reports before targets: the answer)."""
    if "contrastive" in report["config"].get("target", ""):
        return "the answer's log-probability minus the foil's"
    return "the answer's log-probability"


def segments_table(report: Mapping[str, Any]) -> Table:
    """Per method, each evaluator value's mean and 95% CI, its seconds per example, status."""
    examples = report["examples"]
    segments = sum(len(e["segments"]) for e in examples) / len(examples)
    result = Table(
        title=f"segment attribution — {len(examples)} examples, {segments:.1f} segments each "
        f"on average; {_explained(report)}",
        title_justify="left",
    )
    header, rows = _summary_lines(report)
    for i, name in enumerate(header):
        result.add_column(name, justify="right" if 0 < i < len(header) - 1 else "left")
    for row in rows:
        result.add_row(*row)
    return result


def is_segments(document: Any) -> bool:
    """Whether a JSON document is a segment report (``attrib-bench context --output``)."""
    return isinstance(document, Mapping) and document.get("kind") == "segments"


def _value_names(report: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(n for row in report["methods"].values() for n in row["summary"]))


def _summary_lines(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The summary table's header and rows: per method, each value's mean and CI."""
    names = _value_names(report)
    rows = [
        [
            spec,
            *(_cell(row["summary"].get(n)) for n in names),
            f"{row['seconds_per_example']:.2f}",
            row["status"],
        ]
        for spec, row in report["methods"].items()
    ]
    return ["method", *names, "s/ex", "status"], rows


def _top(scores: list[float], k: int = 3) -> list[int]:
    return [int(i) for i in np.argsort(-np.asarray(scores), kind="stable")[:k]]


def segments_markdown(report: Mapping[str, Any], examples: int = 6) -> str:
    """The segment report as Markdown: the summary, then per example each method's top three
    segments (evidence segments marked ``*``)."""
    header, rows = _summary_lines(report)
    model = report["model"]["id"]
    lines = [
        f"# attrib-bench context: {model}",
        "",
        f"{len(report['examples'])} examples; {_explained(report)}, attributed to the "
        "segments of its context. Means with bootstrap 95% CIs.",
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 2) + "---|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    for example in report["examples"][:examples]:
        evidence = example.get("evidence") or []
        foil = "" if example.get("foil") is None else f" against the foil {example['foil']!r}"
        lines += ["", f"## {example['id']}: answer {example['answer']!r}{foil}", ""]
        for spec, scores in example["scores"].items():
            picked = [
                f"{i}{'*' if i < len(evidence) and evidence[i] else ''} ({scores[i]:+.3g})"
                for i in _top(scores)
            ]
            lines.append(f"- {spec}: " + ", ".join(picked))
    return "\n".join(lines) + "\n"


def _weights(values: np.ndarray) -> np.ndarray:
    """Colour weights from the rank of each |value| (as the token heatmaps: ranks, not scale)."""
    from attrib_bench.results.stats import rank_rows

    if values.size < 2 or np.ptp(np.abs(values)) == 0:
        return np.zeros(values.shape)
    ranks = rank_rows(np.abs(values))
    return 0.08 + 0.82 * (ranks - ranks.min()) / (ranks.max() - ranks.min())


def _heat_cell(value: float, weight: float) -> str:
    from attrib_bench.reports.html import NEGATIVE, POSITIVE

    red, green, blue = POSITIVE if value >= 0 else NEGATIVE
    return (
        f'<td class="num" style="background: rgba({red},{green},{blue},{weight:.3f})">'
        f"{value:+.3g}</td>"
    )


def _example_html(example: Mapping[str, Any]) -> str:
    from attrib_bench.reports.html import _escape

    methods = list(example["scores"])
    evidence = example.get("evidence") or [0] * len(example["segments"])
    weights = {m: _weights(np.asarray(example["scores"][m], dtype=float)) for m in methods}
    head = "".join(f"<th>{_escape(m)}</th>" for m in methods)
    body = []
    for i, text in enumerate(example["segments"]):
        cells = "".join(_heat_cell(example["scores"][m][i], weights[m][i]) for m in methods)
        mark = " ★" if evidence[i] else ""
        shown = text if len(text) <= 140 else text[:137] + "..."
        body.append(f"<tr><td>{i}{mark}</td><td>{_escape(shown)}</td>{cells}</tr>")
    foil = example.get("foil")
    against = "" if foil is None else f" against the foil <code>{_escape(foil)}</code>"
    parts = [
        f"<h3>{_escape(example['id'])}: answer <code>{_escape(example['answer'])}</code>"
        f"{against}</h3>",
        f"<table class='heat'><tr><th>#</th><th>segment</th>{head}</tr>{''.join(body)}</table>",
    ]
    # A contrastive example's steps are the answer's, then the foil's (negated: marked "-").
    answer, foils = example.get("answer_tokens") or [], example.get("foil_tokens") or []
    tokens = answer + [f"-{token}" for token in foils]
    earlier = answer[:-1] + foils[:-1]
    # Short segments (tokens) name their columns; longer ones by their index.
    segments = example["segments"]
    short = all(len(text) <= 16 for text in segments)
    names = [repr(text)[1:-1] if short else str(i) for i, text in enumerate(segments)]
    matrices = [
        (method, matrix, "segment", names)
        for method, matrix in (example.get("steps") or {}).items()
    ] + [
        (method, matrix, "earlier answer token", earlier)
        for method, matrix in (example.get("prefix_steps") or {}).items()
        if earlier
    ]
    for method, matrix, what, names in matrices:
        columns = "".join(f"<th>{_escape(name)}</th>" for name in names)
        rows = "".join(
            f"<tr><td><code>{_escape(token)}</code></td>"
            + "".join(_heat_cell(v, w) for v, w in zip(row, _weights(row), strict=True))
            + "</tr>"
            for token, row in zip(tokens, np.asarray(matrix, dtype=float), strict=True)
        )
        parts.append(
            f"<p>{_escape(method)} per answer step (rows) and {what} (columns):</p>"
            f"<table class='heat'><tr><th>step</th>{columns}</tr>{rows}</table>"
        )
    return "".join(parts)


def render_segments_html(report: Mapping[str, Any], examples: int = 6) -> str:
    """The segment report as one self-contained page: the summary, then per example each
    segment's score under each method (colour: the rank of |score| in the method's column,
    red positive, blue negative; ★ human evidence) and, with ``--per-step``, each method's
    step x segment and step x earlier-answer-token matrices (colour by rank within each step)."""
    from attrib_bench.reports.html import _escape, page

    header, rows = _summary_lines(report)
    table = (
        "<table><tr>"
        + "".join(f"<th>{_escape(h)}</th>" for h in header)
        + "</tr>"
        + "".join(
            "<tr>"
            + "".join(
                f"<td{' class=num' if 0 < i < len(row) - 1 else ''}>{_escape(c)}</td>"
                for i, c in enumerate(row)
            )
            + "</tr>"
            for row in rows
        )
        + "</table>"
    )
    sections = ["<h2>Summary</h2>" + table, "<h2>Examples</h2>"]
    sections += [_example_html(e) for e in report["examples"][:examples]]
    subtitle = (
        f'<p class="muted">{len(report["examples"])} examples; {_escape(_explained(report))} '
        "attributed to the segments of its context; means with bootstrap 95% CIs</p>"
    )
    return page(f"attrib-bench context: {report['model']['id']}", subtitle, sections)
