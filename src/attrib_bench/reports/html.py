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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attrib_bench.reports.attributions import reference_rows, token_rows
from attrib_bench.reports.leaderboard import (
    answer_columns,
    finite,
    heading,
    leaderboard_rows,
    ok_evaluators,
    ranked,
    scored_kinds,
)
from attrib_bench.reports.plots import layer_plot
from attrib_bench.reports.provenance import DEFAULT_EXAMPLES, provenance_rows, shown_examples, title
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


def render_html(
    document: Results,
    attributions: Mapping[str, Mapping[str, Any]] | None = None,
    examples: int = DEFAULT_EXAMPLES,
) -> str:
    """The whole report as one HTML string (inline CSS, PNGs as data URIs)."""
    document = as_result(document)
    data = document.provenance["dataset"]
    evaluators = ok_evaluators(document)
    sections = []
    for evaluator in evaluators:
        for kind in scored_kinds(document, evaluator):
            sections.append(
                f"<h2>Leaderboard: {_escape(heading(document, evaluator, kind))}</h2>"
                + _leaderboard_html(document, evaluator, kind)
            )
    for name, state in document.evaluators.items():
        if state["status"] != "ok":
            sections.append(
                f'<p class="failed">Evaluator <code>{_escape(name)}</code> failed: '
                f"{_escape(state['error'])}</p>"
            )
    for evaluator in [name for name in evaluators if scored_kinds(document, name)]:
        png = base64.b64encode(layer_plot(document, evaluator)).decode()
        sections.append(
            f"<h2>Per layer: {_escape(evaluator)}</h2>"
            f'<img class="plot" alt="{_escape(evaluator)} per layer" '
            f'src="data:image/png;base64,{png}">'
        )
    chosen = shown_examples(document, examples)
    rows = token_rows(document, chosen, attributions)
    reference = reference_rows(document, chosen) if attributions is None else {}
    order = ranked(document, evaluators[0]) if evaluators else list(document.methods)
    sections.append("<h2>Token heatmaps</h2>" + _heatmaps_html(document, rows, reference, order))
    provenance_table = "".join(
        f"<tr><th>{_escape(k)}</th><td>{_escape(v)}</td></tr>" for k, v in provenance_rows(document)
    )
    sections.append(f"<h2>Provenance</h2><table>{provenance_table}</table>")
    page_title = title(document)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_escape(page_title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_escape(page_title)}</h1>"
        f'<p class="muted">n = {_escape(data.get("examples"))} examples, reference '
        f"<code>{_escape(document.reference)}</code>, created "
        f"{_escape(document.created)}</p>" + "".join(sections) + "</body></html>\n"
    )
