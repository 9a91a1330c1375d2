"""The HTML report: one self-contained page per result file.

It holds the leaderboards, per-layer curves (matplotlib PNGs embedded as base64), token heatmaps
of every method side by side for a few examples, and the provenance; it loads nothing from the
network and runs no script. The result JSON has no token-level attributions, so the heatmaps
come from ``--attributions FILE.jsonl`` (written by ``attrib-bench attribute``) when given, else
from the run's cache entries; with neither, the report says so and shows everything else.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attrib_bench.reports.attributions import reference_rows, token_rows
from attrib_bench.reports.evaluator_agreement import evaluator_agreement_html
from attrib_bench.reports.leaderboard import (
    answer_columns,
    finite,
    heading,
    leaderboard_rows,
    next_row_differences,
    ok_evaluators,
    paired_caption,
    ranked,
    scored_kinds,
)
from attrib_bench.reports.plots import layer_plot
from attrib_bench.reports.provenance import DEFAULT_EXAMPLES, provenance_rows, shown_examples, title
from attrib_bench.reports.similarity import (
    across_models,
    direction,
    grouped_pairs,
    lower_is_more_similar,
    model_rows,
    pair_title,
    ranking_note,
    signed_text,
    subsample_note,
    subtitle,
    value_text,
)
from attrib_bench.results.agreement import TITLES
from attrib_bench.results.typed import Result, Results, as_result

#: Diverging colours: positive scores red, negative blue (RGB).
POSITIVE = (214, 39, 40)
NEGATIVE = (31, 119, 180)
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
       margin: 2em auto; max-width: 1200px; padding: 0 1em; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { border-bottom: 1px solid #d0d7de;
     padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; vertical-align: top; }
th { background: #f6f8fa; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.failed td { color: #cf222e; }
.muted { color: #59636e; }
table.heat td.method { white-space: nowrap; font-weight: 600; }
span.tok { display: inline-block; padding: 1px 3px; margin: 1px; border-radius: 3px;
           font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 13px; }
img.plot { max-width: 100%; border: 1px solid #d0d7de; }
code { background: #f6f8fa; padding: 0 3px; border-radius: 3px; }
div.pairs { display: flex; flex-wrap: wrap; gap: 1.2em; align-items: flex-start; }
figure.sim { margin: 0; } figure.sim figcaption { font-weight: 600; max-width: 28em; }
table.sim td.num { min-width: 3.2em; } table.sim th.axis { font-weight: 400; }
table.sim td.null { text-align: center; color: #59636e;
  background: repeating-linear-gradient(45deg, #fff, #fff 3px, #eaeef2 3px, #eaeef2 6px); }
"""


def _escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _token_span(token: str, value: float, weight: float) -> str:
    red, green, blue = POSITIVE if value >= 0 else NEGATIVE
    return (
        f'<span class="tok" style="background: rgba({red},{green},{blue},{weight:.3f})" '
        f'title="{_escape(token)}: {value:+.4g}">{_escape(token)}</span>'
    )


def heatmap_row(tokens: Sequence[str], row: Sequence[float]) -> str:
    """Tokens coloured by the rank of their score's magnitude within the row.

    Ranks, not raw values: the evaluator compares ranks, and methods' scales differ by orders of
    magnitude (GlobEnc's [CLS] self-score would wash out every other token). The hue gives the
    sign, the exact score is in each token's tooltip.
    """
    from attrib_bench.results.stats import rank_rows

    values = np.array([v if finite(v) else 0.0 for v in row[: len(tokens)]], dtype=float)
    if len(values) > 1 and np.ptp(np.abs(values)) > 0:
        ranks = rank_rows(np.abs(values))
        weights = (ranks - ranks.min()) / (ranks.max() - ranks.min())
    else:
        weights = np.zeros(len(values))
    return "".join(
        _token_span(t, v, 0.08 + 0.82 * w) for t, v, w in zip(tokens, values, weights, strict=False)
    )


def _leaderboard_html(result: Result, evaluator: str, kind: str) -> str:
    answers = answer_columns(result)
    head = (
        "<tr><th>#</th><th>method</th><th>best (layer)</th><th>last layer</th>"
        "<th>95% CI</th><th>n</th>"
        + "".join(f"<th>{_escape(title)}</th>" for _, title in answers)
        + "<th>s/ex</th><th>peak MB</th><th>status</th></tr>"
    )
    keys = ("best", "last", "ci", "n", *(answer for answer, _ in answers), "seconds", "memory")
    body = []
    for rank, row in enumerate(leaderboard_rows(result, evaluator, kind), 1):
        failed = row["status"] != "ok"
        status = f"failed: {row['error']}" if failed else "ok"
        cells = [
            f'<td class="num">{rank}</td>',
            f"<td><code>{_escape(row['spec'])}</code></td>",
            *(f'<td class="num">{_escape(row.get(key, "-"))}</td>' for key in keys),
            f"<td>{_escape(status)}</td>",
        ]
        body.append(f"<tr{' class=failed' if failed else ''}>{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _next_rows_html(result: Result, evaluator: str, kind: str) -> str:
    """Rank i against rank i + 1: the paired difference with its CI and p; empty without."""
    rows = next_row_differences(result, evaluator, kind)
    if not rows:
        return ""
    head = (
        "<tr><th>#</th><th>method</th><th>next</th><th>difference</th><th>95% CI</th>"
        "<th>p</th><th>n</th><th></th></tr>"
    )
    body = [
        f'<tr><td class="num">{row["rank"]}</td><td><code>{_escape(row["spec"])}</code></td>'
        f"<td><code>{_escape(row['next'])}</code></td>"
        + "".join(f'<td class="num">{_escape(row[key])}</td>' for key in ("difference", "ci", "p"))
        + f'<td class="num">{_escape(row["n"])}</td>'
        + f"<td>{'' if row['ahead'] else 'not significantly ahead'}</td></tr>"
        for row in rows
    ]
    return (
        f'<p class="muted">{_escape(paired_caption(result, column=False))}.</p>'
        f'<table class="paired">{head}{"".join(body)}</table>'
    )


def _agreement_html(result: Result) -> str:
    """Per measure, a methods x methods table of the mean agreement (Krishna et al. 2022)."""
    agreement = result.agreement
    if agreement is None or len(agreement.methods) < 2:
        return ""
    methods = agreement.methods
    parts = [
        "<h2>Agreement between methods</h2>"
        f'<p class="muted">Krishna et al. 2022, per example over the real tokens without special '
        f"tokens (each method's last aggregated row), top k = {agreement.k} by |score| (capped at "
        "the example's tokens), mean over the examples; hover a cell for its 95% CI and n. "
        "Deeper colour: more agreement.</p>"
    ]
    head = "<tr><th></th>" + "".join(f"<th><code>{_escape(m)}</code></th>" for m in methods)
    for measure in agreement.measures:
        matrix = agreement.matrix(measure)
        body = []
        for i, row_method in enumerate(methods):
            cells = []
            for j, column_method in enumerate(methods):
                value = matrix[i, j]
                summary = agreement.summary(measure, row_method, column_method)
                if not finite(value):
                    cells.append('<td class="null">n/a</td>')
                    continue
                where = "the same method" if i == j else ""
                if summary is not None:
                    low, high = summary["ci95"]
                    bounds = f"[{low:.3f}, {high:.3f}]" if finite(low) else "no CI"
                    where = f"95% CI {bounds}, n = {summary['n']}"
                alpha = 0.06 + 0.84 * min(1.0, max(0.0, value))
                ink = "#fff" if alpha > 0.55 else "#1f2328"
                cells.append(
                    f'<td class="num" data-value="{float(value)!r}" title="{_escape(where)}" '
                    f'style="background: rgba(31,119,180,{alpha:.3f}); color: {ink}">'
                    f"{value:.3f}</td>"
                )
            body.append(f"<tr><th><code>{_escape(row_method)}</code></th>{''.join(cells)}</tr>")
        parts.append(
            f"<h3>{_escape(TITLES.get(measure, measure))}</h3>"
            f'<table class="agreement" data-measure="{_escape(measure)}">{head}</tr>'
            f"{''.join(body)}</table>"
        )
    return "".join(parts)


def _heatmaps_html(
    result: Result,
    rows: Mapping[str, Mapping[str, Any]],
    reference: Mapping[str, Any],
    order: Sequence[str],
) -> str:
    if not rows:
        return (
            '<p class="muted">No token-level attributions found: the run\'s cache entries are '
            "gone or it ran with <code>--no-cache</code>. Pass <code>--attributions "
            "FILE.jsonl</code> from <code>attrib-bench attribute</code> to see heatmaps.</p>"
        )
    parts = [
        '<p class="muted">Last-layer aggregated [CLS] rows over the real tokens. Colour depth is '
        "the token's rank by magnitude within its row (red positive, blue negative); hover a "
        "token for its score.</p>"
    ]
    for example, methods in rows.items():
        table = []
        if example in reference:
            entry = reference[example]
            label = f"{result.reference} (reference)"
            table.append(
                f'<tr><td class="method">{_escape(label)}</td>'
                f"<td>{heatmap_row(entry['tokens'], entry['row'])}</td></tr>"
            )
        for spec in [s for s in order if s in methods] + [s for s in methods if s not in order]:
            entry = methods[spec]
            table.append(
                f'<tr><td class="method"><code>{_escape(spec)}</code></td>'
                f"<td>{heatmap_row(entry['tokens'], entry['row'])}</td></tr>"
            )
        parts.append(
            f"<h3>Example <code>{_escape(example)}</code></h3>"
            f'<table class="heat">{"".join(table)}</table>'
        )
    return "".join(parts)


def _across_models_html(extra: Mapping[str, Any]) -> str:
    """A run over several models: its ranking evaluator per method under each model and the
    Kendall tau of the method rankings between models; empty without a ``models`` section."""
    section = across_models(extra)
    if section is None:
        return ""
    labels = section["labels"]
    parts = [
        "<h2>Across models</h2><p>Models: "
        + ", ".join(f"<code>{_escape(m)}</code>" for m in section["models"])
        + "."
        + (
            f" Random-init floor: <code>{_escape(section['floor_model'])}</code>."
            if section["floor_model"]
            else ""
        )
        + f"</p><p>{_escape(ranking_note(section))}</p>"
    ]
    if section["rows"]:
        head = "<tr><th>method</th>" + "".join(f"<th>{_escape(x)}</th>" for x in labels) + "</tr>"
        body = []
        for row in section["rows"]:
            mark = "" if row["ranked"] or section["ranking"] is None else " (not ranked)"
            cells = "".join(f'<td class="num">{signed_text(v)}</td>' for v in row["values"])
            body.append(
                f"<tr><td><code>{_escape(row['spec'])}</code>{_escape(mark)}</td>{cells}</tr>"
            )
        parts.append(
            f"<h3>{_escape(section['evaluator'])} per model (last layer, aggregated rows, "
            f'mean)</h3><table class="per-model">{head}{"".join(body)}</table>'
        )
    tau = section["ranking"].get("kendall_tau") if section["ranking"] else None
    if isinstance(tau, list) and tau:
        head = "<tr><th></th>" + "".join(f"<th>{_escape(x)}</th>" for x in labels) + "</tr>"
        body = [
            f"<tr><th>{_escape(label)}</th>"
            + "".join(
                f'<td class="num">{signed_text(v)}</td>'
                for v in (row if isinstance(row, list) else [])
            )
            + "</tr>"
            for label, row in zip(labels, tau, strict=False)
        ]
        parts.append(
            "<h3>Kendall tau between the models' method rankings</h3>"
            f'<table class="kendall">{head}{"".join(body)}</table>'
        )
    return "".join(parts)


#: The similarity heatmaps' colour (RGB); its depth grows with similarity, whatever the measure.
SIMILAR = (31, 119, 180)
#: The colour scale of the bounded measures is their whole range (widened by any value outside
#: it): a data-range scale would make 0.95 against 0.97 look like black against white.
BOUNDS = {
    "linear_cka": (0.0, 1.0),
    "linear_cka_debiased": (0.0, 1.0),
    "rbf_cka": (0.0, 1.0),
    "svcca": (0.0, 1.0),
    "pwcca": (0.0, 1.0),
    "procrustes": (0.0, 2.0),
}


def _finite_values(pairs: Sequence[Mapping[str, Any] | None], measure: str) -> list[float]:
    return [
        float(v)
        for pair in pairs
        if pair is not None
        for row in pair["measures"].get(measure) or []
        for v in row
        if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
    ]


def _sim_cell(value: Any, scale: tuple[float, float], lower: bool, where: str) -> str:
    text = value_text(value)
    if text == "-":
        return f'<td class="null" title="{_escape(where)}: null">n/a</td>'
    low, high = scale
    depth = (float(value) - low) / (high - low) if high > low else 1.0
    depth = 1.0 - depth if lower else depth
    alpha = 0.06 + 0.84 * depth
    red, green, blue = SIMILAR
    ink = "#fff" if alpha > 0.55 else "#1f2328"
    return (
        f'<td class="num" data-value="{float(value)!r}" style="background: '
        f'rgba({red},{green},{blue},{alpha:.3f}); color: {ink}" '
        f'title="{_escape(where)}: {float(value):.6g}">{text}</td>'
    )


def _sim_table(pair: Mapping[str, Any], measure: str, scale: tuple[float, float], role: str) -> str:
    matrix = pair["measures"].get(measure)
    caption = f"{role}: {pair_title(pair)}"
    if not matrix:
        return (
            f'<figure class="sim"><figcaption>{_escape(caption)}</figcaption>'
            f'<p class="muted">no {_escape(measure)} for this pair</p></figure>'
        )
    columns = max(len(row) for row in matrix)
    lower = lower_is_more_similar(measure)
    head = (
        f'<tr><th class="axis" colspan="{columns + 1}">columns: layer of '
        f"<code>{_escape(pair['y'])}</code> (0 = embeddings); rows: layer of "
        f"<code>{_escape(pair['x'])}</code></th></tr>"
        "<tr><th></th>" + "".join(f'<th class="col">{j}</th>' for j in range(columns)) + "</tr>"
    )
    body = []
    for i, row in enumerate(matrix):
        cells = "".join(
            _sim_cell(row[j] if j < len(row) else None, scale, lower, f"{measure} ({i}, {j})")
            for j in range(columns)
        )
        body.append(f'<tr><th class="row">{i}</th>{cells}</tr>')
    return (
        f'<figure class="sim"><figcaption>{_escape(caption)}</figcaption>'
        f'<table class="sim" data-measure="{_escape(measure)}" data-kind="{_escape(pair["kind"])}"'
        f' data-x="{_escape(pair["x"])}" data-y="{_escape(pair["y"])}">'
        f"{head}{''.join(body)}</table></figure>"
    )


def _sim_group(pairs: Sequence[tuple[Mapping[str, Any] | None, str]]) -> str:
    """Every measure of the first pair, each as heatmaps of the pairs side by side on one
    colour scale (the floor must read against the seeds)."""
    present = [(pair, role) for pair, role in pairs if pair is not None]
    measures = list(dict.fromkeys(m for pair, _ in present for m in pair["measures"]))
    parts = []
    for measure in measures:
        values = _finite_values([pair for pair, _ in present], measure)
        low, high = BOUNDS.get(measure, (math.inf, -math.inf))
        scale = (min([low, *values]), max([high, *values])) if values else (0.0, 1.0)
        legend = (
            f"{direction(measure)}; deeper colour = more similar, on one scale for the tables "
            f"below ({value_text(scale[0])} to {value_text(scale[1])}); n/a: not computed or "
            "undefined"
        )
        tables = "".join(_sim_table(pair, measure, scale, role) for pair, role in present)
        missing = [role for pair, role in pairs if pair is None]
        note = (
            f'<p class="muted">Not in this file: {_escape(", ".join(missing))}.</p>'
            if missing
            else ""
        )
        parts.append(
            f'<h3>{_escape(measure)}</h3><p class="muted legend">{_escape(legend)}</p>'
            f'<div class="pairs">{tables}</div>{note}'
        )
    return "".join(parts)


def render_similarity_html(report: Mapping[str, Any]) -> str:
    """A similarity result (``attrib-bench similarity --output``) as one self-contained page:
    per models pair, each measure's layer-by-layer heatmap beside those of the random-init
    floor (x against a random init of it) and of two random inits against each other."""
    names = [str(m.get("name")) for m in report.get("models") or [] if isinstance(m, Mapping)]
    sections = []
    info = "".join(
        f"<tr><th>{_escape(name)}</th><td>{_escape(text)}</td></tr>"
        for name, text in model_rows(report)
    )
    if info:
        sections.append(f"<h2>Models</h2><table>{info}</table>")
    note = subsample_note(report)
    if note:
        sections.append(f'<p class="muted">Gram subsample: {_escape(note)}.</p>')
    sections.append(
        '<p class="muted">Random networks can look more similar than trained ones (under CKA '
        "above all): read each models pair against its floor beside it.</p>"
    )
    groups, others = grouped_pairs(report)
    for pair, floor, both in groups:
        sections.append(
            f"<h2>{_escape(pair['x'])} vs {_escape(pair['y'])}</h2>"
            + _sim_group(
                [
                    (pair, "models"),
                    (floor, "random-init floor"),
                    (both, "two random inits"),
                ]
            )
        )
    for pair in others:
        sections.append(
            f"<h2>{_escape(pair_title(pair))}</h2>" + _sim_group([(pair, pair["kind"])])
        )
    config = report.get("config") or {}
    fingerprint = (report.get("dataset") or {}).get("fingerprint")
    sections.append(
        "<h2>Configuration</h2><table>"
        + "".join(f"<tr><th>{_escape(k)}</th><td>{_escape(v)}</td></tr>" for k, v in config.items())
        + f"<tr><th>dataset fingerprint</th><td>{_escape(fingerprint)}</td></tr></table>"
    )
    line = f'<p class="muted">{_escape(subtitle(report))}; layer 0 = the embeddings</p>'
    return page(f"attrib-bench similarity: {', '.join(names)}", line, sections)


def render_html(
    document: Results,
    attributions: Mapping[str, Mapping[str, Any]] | None = None,
    examples: int = DEFAULT_EXAMPLES,
) -> str:
    """The whole report as one HTML string (inline CSS, PNGs as data URIs)."""
    document = as_result(document)
    data = document.provenance["dataset"]
    evaluators = ok_evaluators(document)
    sections = leaderboard_sections(document)
    across = _across_models_html(document.extra)
    if across:
        sections.append(across)
    agreement = _agreement_html(document)
    if agreement:
        sections.append(agreement)
    evaluators_agree = evaluator_agreement_html(document)
    if evaluators_agree:
        sections.append(evaluators_agree)
    for evaluator in [name for name in evaluators if scored_kinds(document, name)]:
        png = base64.b64encode(layer_plot(document, evaluator)).decode()
        sections.append(
            f"<h2>Per layer: {_escape(evaluator)}</h2>"
            f'<img class="plot" alt="{_escape(evaluator)} per layer" '
            f'src="data:image/png;base64,{png}">'
        )
    sections.append(_heatmaps_section(document, examples, attributions)[0])
    provenance_table = "".join(
        f"<tr><th>{_escape(k)}</th><td>{_escape(v)}</td></tr>" for k, v in provenance_rows(document)
    )
    sections.append(f"<h2>Provenance</h2><table>{provenance_table}</table>")
    page_title = title(document)
    line = (
        f'<p class="muted">n = {_escape(data.get("examples"))} examples, reference '
        f"<code>{_escape(document.reference)}</code>, created "
        f"{_escape(document.created)}</p>"
    )
    return page(page_title, line, sections)


def leaderboard_sections(result: Result) -> list[str]:
    """Each leaderboard, with its paired differences, then a line per failed evaluator: the
    head of the report, and what a notebook shows of a ``Result``."""
    sections = [
        f"<h2>Leaderboard: {_escape(heading(result, evaluator, kind))}</h2>"
        + _leaderboard_html(result, evaluator, kind)
        + _next_rows_html(result, evaluator, kind)
        for evaluator in ok_evaluators(result)
        for kind in scored_kinds(result, evaluator)
    ]
    for name, state in result.evaluators.items():
        if state["status"] != "ok":
            sections.append(
                f'<p class="failed">Evaluator <code>{_escape(name)}</code> failed: '
                f"{_escape(state['error'])}</p>"
            )
    return sections


def _heatmaps_section(
    result: Result, examples: int, attributions: Mapping[str, Mapping[str, Any]] | None
) -> tuple[str, bool]:
    """The token heatmaps of the first ``examples`` examples, from ``attributions`` or else the
    run's cache entries, and whether any rows were found."""
    chosen = shown_examples(result, examples)
    rows = token_rows(result, chosen, attributions)
    reference = reference_rows(result, chosen) if attributions is None else {}
    evaluators = ok_evaluators(result)
    order = ranked(result, evaluators[0]) if evaluators else list(result.methods)
    return "<h2>Token heatmaps</h2>" + _heatmaps_html(result, rows, reference, order), bool(rows)


def notebook_html(result: Result) -> str:
    """A ``Result`` in a notebook (``Result._repr_html_``): its leaderboards and, when the
    run's cache entries are at hand, the token heatmaps. No page around it (the notebook
    styles the tables) and no per-layer plots (matplotlib is an optional extra)."""
    heatmaps, found = _heatmaps_section(result, DEFAULT_EXAMPLES, None)
    return "".join(leaderboard_sections(result) + ([heatmaps] if found else []))


# The results sit below the reports and cannot import them: the reports install the view.
Result.html_view = notebook_html


def page(page_title: str, subtitle: str, sections: Sequence[str]) -> str:
    """The self-contained page every HTML report is: inline CSS, no script, no network.
    ``subtitle`` and ``sections`` are HTML already escaped; the title is escaped here."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_escape(page_title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_escape(page_title)}</h1>{subtitle}" + "".join(sections) + "</body></html>\n"
    )
