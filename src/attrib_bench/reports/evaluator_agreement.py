"""The agreement between evaluators (``Result.evaluator_agreement``) as the terminal, Markdown
and HTML reports show it: per kind, an evaluators x evaluators matrix of Kendall's tau with its
95% CI, and one line naming the pairs that disagree (``results.evaluator_agreement.RULE``)."""

from __future__ import annotations

import html
import math

from rich.table import Table

from attrib_bench.results.evaluator_agreement import RULE, EvaluatorAgreement, EvaluatorPair
from attrib_bench.results.typed import Result

CAPTION = (
    "Kendall tau-b between the method rankings two evaluators give (each by its last-layer "
    "mean, best first whichever way it points: 1 = the same order, -1 = reversed), 95% "
    "bootstrap CI over the examples (the same examples for every evaluator and method); a pair "
    "leaves out the methods failed or undefined under either, and the reference under an "
    "evaluator that compares with it; !: the pair disagrees"
)


def _kinds(result: Result) -> list[tuple[str, EvaluatorAgreement]]:
    section = result.evaluator_agreement
    if section is None:
        return []
    return [(kind, section) for kind, names in section.evaluators.items() if len(names) >= 2]


def _tau(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"


def _ci(pair: EvaluatorPair) -> str:
    low, high = pair.ci95
    return "no CI" if math.isnan(low) else f"[{low:+.2f}, {high:+.2f}]"


def _methods(section: EvaluatorAgreement, kind: str) -> str:
    counts = sorted({p.methods for p in section.pairs.get(kind, {}).values()})
    if not counts:
        return "no methods"
    shown = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    return f"methods ranked per pair: {shown}"


def disagreement_line(section: EvaluatorAgreement, kind: str) -> str:
    """One line naming the pairs that disagree by ``RULE``, or saying that none does."""
    found = section.disagreeing(kind)
    if not found:
        return f"No two evaluators disagree ({RULE})."
    named = "; ".join(f"{p.a} vs {p.b} (tau {_tau(p.tau)} {_ci(p)})" for p in found)
    return f"Disagree ({RULE}): {named}."


def _cell(section: EvaluatorAgreement, kind: str, a: str, b: str) -> EvaluatorPair | None:
    return None if a == b else section.pair(kind, a, b)


def evaluator_agreement_tables(result: Result) -> list[Table]:
    """The terminal's tables, one per kind with two evaluators or more; the disagreeing pairs in
    the caption."""
    tables = []
    for kind, section in _kinds(result):
        names = section.evaluators[kind]
        table = Table(
            title=f"Agreement between evaluators ({kind} rows): Kendall tau [95% CI]",
            title_justify="left",
            caption=f"{CAPTION}; {_methods(section, kind)}.\n{disagreement_line(section, kind)}",
            caption_justify="left",
        )
        table.add_column("evaluator", style="bold", no_wrap=True)
        for index in range(len(names)):
            table.add_column(str(index + 1), justify="right", no_wrap=True)
        for index, a in enumerate(names):
            cells = []
            for b in names:
                pair = _cell(section, kind, a, b)
                cells.append("1" if a == b else "-" if pair is None else _text(pair, "\n"))
            table.add_row(f"{index + 1} {a}", *cells)
        tables.append(table)
    return tables


def _text(pair: EvaluatorPair, between: str) -> str:
    mark = " !" if pair.disagrees() else ""
    return f"{_tau(pair.tau)}{mark}{between}{_ci(pair)}"


def evaluator_agreement_markdown(result: Result) -> list[str]:
    """The Markdown report's section: per kind, the matrix (evaluators numbered) and the line
    naming the disagreeing pairs (also marked ``!`` in the matrix)."""
    lines: list[str] = []
    for kind, section in _kinds(result):
        names = section.evaluators[kind]
        lines += [
            f"## Agreement between evaluators ({kind} rows)",
            "",
            f"{CAPTION}; {_methods(section, kind)}.",
            "",
            "| # | evaluator | " + " | ".join(str(i) for i in range(1, len(names) + 1)) + " |",
            "|---:|---|" + "---:|" * len(names),
        ]
        for index, a in enumerate(names):
            cells = []
            for b in names:
                pair = _cell(section, kind, a, b)
                cells.append("1" if a == b else "-" if pair is None else _text(pair, " "))
            lines.append(f"| {index + 1} | `{a}` | " + " | ".join(cells) + " |")
        lines += ["", disagreement_line(section, kind), ""]
    return lines


def evaluator_agreement_html(result: Result) -> str:
    """The HTML report's section: per kind, the matrix coloured by tau (blue agrees, red
    disagrees), each cell's CI and methods on hover, and the disagreeing pairs in a line."""
    parts = []
    for kind, section in _kinds(result):
        names = section.evaluators[kind]
        head = "<tr><th></th>" + "".join(f"<th><code>{html.escape(b)}</code></th>" for b in names)
        body = []
        for a in names:
            cells = []
            for b in names:
                pair = _cell(section, kind, a, b)
                if a == b:
                    cells.append('<td class="num">1</td>')
                elif pair is None or math.isnan(pair.tau):
                    cells.append('<td class="null">n/a</td>')
                else:
                    cells.append(_html_cell(pair))
            body.append(f"<tr><th><code>{html.escape(a)}</code></th>{''.join(cells)}</tr>")
        parts.append(
            f"<h2>Agreement between evaluators ({html.escape(kind)} rows)</h2>"
            f'<p class="muted">{html.escape(CAPTION)}; {html.escape(_methods(section, kind))}.</p>'
            f'<table class="evaluator-agreement" data-kind="{html.escape(kind)}">{head}</tr>'
            f"{''.join(body)}</table><p>{html.escape(disagreement_line(section, kind))}</p>"
        )
    return "".join(parts)


def _html_cell(pair: EvaluatorPair) -> str:
    strength = 0.1 + 0.8 * min(1.0, abs(pair.tau))
    colour = "31,119,180" if pair.tau > 0 else "214,39,40"
    ink = "#fff" if strength > 0.55 else "#1f2328"
    where = f"95% CI {_ci(pair)}, {pair.methods} methods" + (
        f", left out: {', '.join(pair.left_out)}" if pair.left_out else ""
    )
    flag = " disagree" if pair.disagrees() else ""
    return (
        f'<td class="num{flag}" data-value="{pair.tau!r}" title="{html.escape(where)}" '
        f'style="background: rgba({colour},{strength:.3f}); color: {ink}">'
        f"{html.escape(_text(pair, ' '))}</td>"
    )
