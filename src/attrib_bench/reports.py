"""Reports of a result file: one self-contained HTML page, Markdown for text, and the terminal
leaderboard ``run`` prints.

The HTML holds the leaderboards, per-layer curves (matplotlib PNGs embedded as base64), token
heatmaps of every method side by side for a few examples, and the provenance; it loads nothing
from the network and runs no script. The result JSON has no token-level attributions, so the
heatmaps come from ``--attributions FILE.jsonl`` (written by ``attrib-bench attribute``) when
given, else from the run's cache entries (the result's ``cache`` section points at them); with
neither, the report says so and shows everything else.

Each takes a ``attrib_bench.results.Result`` (or a document or path, converted by
``attrib_bench.gate.as_result``: validated first, so that every field used here has its type).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from attrib_bench.errors import UsageError
from attrib_bench.gate import Results, Schema, as_result
from attrib_bench.results.typed import LayerScore, MethodResult, Result

DEFAULT_EXAMPLES = 6
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


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def _signed(value: Any) -> str:
    return f"{value:+.3f}" if _finite(value) else "-"


def ok_evaluators(document: Results) -> list[str]:
    result = as_result(document)
    return [name for name, e in result.evaluators.items() if e["status"] == "ok"]


def _sign(result: Result, evaluator: str) -> float:
    """+1 where higher scores are better (the default), -1 where lower are."""
    info = result.evaluator_info.get(evaluator, {})
    return 1.0 if info.get("higher_is_better", True) else -1.0


def heading(document: Results, evaluator: str, kind: str | None = None) -> str:
    """``spearman vs saliency (aggregated rows)``, with the direction when lower is better."""
    result = as_result(document)
    info = result.evaluator_info.get(evaluator, {})
    versus = f" vs {result.reference}" if info.get("needs_reference", True) else ""
    notes = [f"{kind} rows"] if kind else []
    if _sign(result, evaluator) < 0:
        notes.append("lower is better")
    return f"{evaluator}{versus}" + (f" ({', '.join(notes)})" if notes else "")


def _layers(method: MethodResult, evaluator: str, kind: str) -> list[LayerScore] | None:
    return method.scores.get(evaluator, {}).get(kind)


def _goodness(method: MethodResult, evaluator: str, kind: str, sign: float) -> float:
    layers = _layers(method, evaluator, kind)
    mean = layers[-1].mean if layers else None
    return sign * mean if _finite(mean) else -math.inf


def ranked(document: Results, evaluator: str, kind: str = "aggregated") -> list[str]:
    """Method specs best first by last-layer score; failed methods last."""
    result = as_result(document)
    methods, sign = result.methods, _sign(result, evaluator)
    return sorted(methods, key=lambda spec: -_goodness(methods[spec], evaluator, kind, sign))


def leaderboard_rows(document: Results, evaluator: str, kind: str) -> list[dict]:
    """The terminal leaderboard's columns as data: best (layer), last, CI, n, cost, status."""
    result = as_result(document)
    rows = []
    for spec in ranked(result, evaluator, kind):
        method = result.methods[spec]
        layers = _layers(method, evaluator, kind)
        if method.status == "ok" and not layers:
            continue
        row = {"spec": spec, "status": method.status, "error": method.error}
        if layers:
            scored = [x for x in layers if _finite(x.mean)]
            sign = _sign(result, evaluator)
            best = max(scored, key=lambda x: sign * x.mean) if scored else None
            last = layers[-1]
            row["best"] = _signed(best.mean if best else None) + (
                f" ({best.layer})" if best and len(layers) > 1 else ""
            )
            row["last"] = _signed(last.mean)
            low, high = last.ci95
            row["ci"] = f"[{low:+.2f}, {high:+.2f}]" if _finite(low) and _finite(high) else "-"
            row["n"] = str(last.n)
        seconds = method.seconds_per_example
        row["seconds"] = f"{seconds:.4f}" if _finite(seconds) else "-"
        memory = method.peak_memory_mb
        row["memory"] = f"{memory:.1f}" if _finite(memory) else "-"
        rows.append(row)
    return rows


def _kinds(result: Result, evaluator: str) -> list[str]:
    present = {
        kind for method in result.methods.values() for kind in method.scores.get(evaluator, {})
    }
    return [kind for kind in ("aggregated", "local") if kind in present]


# ------------------------------------------------------------------------------ token rows


def read_attributions(path: Path | str) -> dict[str, dict[str, dict[str, Any]]]:
    """``attrib-bench attribute`` JSONL as example id -> method -> {tokens, row}."""
    path = Path(path)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise UsageError(f"attributions file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"attributions file {str(path)!r} is unreadable ({error})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise UsageError(f"{str(path)!r} line {number} is not JSON") from None
        schema = Schema(f"{str(path)!r} line {number} is not an attributions record")
        schema.object(record, "the line")
        if "id" not in record or not record.get("aggregated"):
            continue  # a failed method's error record
        tokens = schema.array(schema.field(record, "tokens", "the record"), "tokens")
        for index, token in enumerate(tokens):
            schema.string(token, f"tokens[{index}]")
        layers = schema.array(record["aggregated"], "aggregated")
        row = schema.array(layers[-1], f"aggregated[{len(layers) - 1}]")
        for index, value in enumerate(row):
            schema.optional_number(value, f"aggregated[{len(layers) - 1}][{index}]")
        example = schema.string(record["id"], "id")
        method = schema.string(schema.field(record, "method", "the record"), "method")
        table.setdefault(example, {})[method] = {"tokens": tokens, "row": row}
    return table


def token_rows(
    document: Results,
    example_ids: Sequence[str],
    attributions: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Example id -> method -> {tokens, row}: the last aggregated row over the real tokens."""
    from attrib_bench.cache import cached_rows

    result = as_result(document)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for example in example_ids:
        if attributions is not None:
            found = dict(attributions.get(example, {}))
        else:
            found = {}
            for spec in result.methods:
                entry = cached_rows(result.extra, spec, example)  # reads its ``cache`` section
                if entry is not None:
                    found[spec] = {
                        "tokens": entry["tokens"],
                        "row": entry["rows"]["aggregated"][-1],
                    }
        if found:
            table[example] = found
    return table


def _reference_rows(result: Result, example_ids: Sequence[str]) -> dict:
    """The reference's rows when it ran only as the reference (no leaderboard row of its own)."""
    from attrib_bench.cache import read_entry

    section = result.extra.get("cache") or {}
    key = section.get("reference")
    if not key or result.reference in result.methods:
        return {}
    found = {}
    for example in example_ids:
        example_key = section.get("examples", {}).get(example)
        if not example_key:
            continue
        entry = read_entry(Path(section["dir"]) / key / f"{example_key}.json")
        if entry is not None:
            found[example] = {"tokens": entry["tokens"], "row": entry["rows"]["aggregated"][-1]}
    return found


# ----------------------------------------------------------------------------------- plots


#: Markers of layered methods and dash patterns of whole-model ones, one per pass through the
#: palette: a method shares its colour with another only once twenty methods are plotted, and
#: never its colour and its marker or dashes.
MARKERS = "osD^v"
DASHES = ("--", "-.", ":", (0, (6, 2, 1, 2, 1, 2)), (0, (1, 4)))


def plot_styles(specs: Sequence[str], palette: Sequence[Any]) -> dict[str, tuple[Any, str, Any]]:
    """Method spec -> (colour, marker, dashes), in ``specs`` order: palette first, then markers."""
    styles = {}
    for index, spec in enumerate(specs):
        round_ = index // len(palette)
        styles[spec] = (
            palette[index % len(palette)],
            MARKERS[round_ % len(MARKERS)],
            DASHES[round_ % len(DASHES)],
        )
    return styles


def layer_figure(document: Results, evaluator: str) -> Any:
    """The per-layer figure: mean with its 95% CI band, one panel per kind; whole-model dashed."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "the HTML report draws its plots with matplotlib: pip install 'attrib-bench[plot]' "
            "(or use --markdown)"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = as_result(document)
    kinds = _kinds(result, evaluator)
    figure, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds) + 2.5, 4.4), squeeze=False)
    depth = max(
        (
            len(layers)
            for method in result.methods.values()
            for layers in method.scores.get(evaluator, {}).values()
        ),
        default=1,
    )
    # One style per method in both panels, in the first panel's ranking; only methods with a
    # line take a colour. tab20 is tab10's ten colours, each with a lighter shade.
    tab20 = plt.get_cmap("tab20").colors
    plotted = [
        spec
        for spec in ranked(result, evaluator, kinds[0])
        if any(result.methods[spec].scores.get(evaluator, {}).values())
    ]
    styles = plot_styles(plotted, [*tab20[0::2], *tab20[1::2]])
    for axis, kind in zip(axes[0], kinds, strict=True):
        for spec in ranked(result, evaluator, kind):
            layers = _layers(result.methods[spec], evaluator, kind)
            if not layers:
                continue
            colour, marker, dashes = styles[spec]
            means = [x.mean if _finite(x.mean) else math.nan for x in layers]
            if len(layers) == 1:
                axis.hlines(means[0], 1, depth, colors=[colour], linestyles=[dashes], label=spec)
                continue
            numbers = [x.layer for x in layers]
            low = [x.ci95[0] if _finite(x.ci95[0]) else math.nan for x in layers]
            high = [x.ci95[1] if _finite(x.ci95[1]) else math.nan for x in layers]
            axis.plot(numbers, means, marker=marker, markersize=3, color=colour, label=spec)
            axis.fill_between(numbers, low, high, color=colour, alpha=0.15, linewidth=0)
        axis.axhline(0, color="grey", linewidth=0.6)
        axis.set_xlabel("layer")
        axis.set_xticks(range(1, depth + 1))
        axis.set_title(f"{kind} rows")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel(heading(result, evaluator))
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0, 0.8, 1))
    return figure


def layer_plot(document: Results, evaluator: str) -> bytes:
    """:func:`layer_figure` as a PNG."""
    import matplotlib.pyplot as plt

    figure = layer_figure(document, evaluator)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------ HTML


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
    from attrib_bench.stats import rank_rows

    values = np.array([v if _finite(v) else 0.0 for v in row[: len(tokens)]], dtype=float)
    if len(values) > 1 and np.ptp(np.abs(values)) > 0:
        ranks = rank_rows(np.abs(values))
        weights = (ranks - ranks.min()) / (ranks.max() - ranks.min())
    else:
        weights = np.zeros(len(values))
    return "".join(
        _token_span(t, v, 0.08 + 0.82 * w) for t, v, w in zip(tokens, values, weights, strict=False)
    )


def _leaderboard_html(result: Result, evaluator: str, kind: str) -> str:
    head = (
        "<tr><th>#</th><th>method</th><th>best (layer)</th><th>last layer</th>"
        "<th>95% CI</th><th>n</th><th>s/ex</th><th>peak MB</th><th>status</th></tr>"
    )
    body = []
    for rank, row in enumerate(leaderboard_rows(result, evaluator, kind), 1):
        failed = row["status"] != "ok"
        status = f"failed: {row['error']}" if failed else "ok"
        cells = [
            f'<td class="num">{rank}</td>',
            f"<td><code>{_escape(row['spec'])}</code></td>",
            *(
                f'<td class="num">{_escape(row.get(key, "-"))}</td>'
                for key in ("best", "last", "ci", "n", "seconds", "memory")
            ),
            f"<td>{_escape(status)}</td>",
        ]
        body.append(f"<tr{' class=failed' if failed else ''}>{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _provenance_rows(result: Result) -> list[tuple[str, str]]:
    provenance = result.provenance
    model = provenance.get("model", {})
    data = provenance.get("dataset", {})
    packages = ", ".join(f"{k} {v}" for k, v in provenance.get("packages", {}).items() if v)
    hardware = provenance.get("hardware", {})
    cache = result.extra.get("cache") or {}
    reused = sum((cache.get("hits") or {}).values())
    rows = [
        ("created", result.created),
        ("model", f"{model.get('name')} ({model.get('type')}) — {model.get('id')}"),
        ("weights sha256", model.get("weights_sha256")),
        (
            "dataset",
            f"{data.get('name')} / {data.get('split')}: {data.get('examples')} examples, "
            f"{data.get('truncated')} truncated to {data.get('max_length')} tokens",
        ),
        ("dataset fingerprint", data.get("fingerprint")),
        ("reference", result.reference),
        ("seed", provenance.get("seed")),
        ("packages", f"Python {provenance.get('python')}; {packages}"),
        (
            "hardware",
            f"{hardware.get('device')}, {hardware.get('cpu_count')} CPUs, "
            f"{hardware.get('torch_threads')} torch threads, {hardware.get('platform')}",
        ),
        ("config", json.dumps(result.config, sort_keys=True)),
    ]
    if cache:
        rows.append(("cache", f"{cache.get('dir')} ({reused} method-examples reused)"))
    if result.extra.get("finetune"):
        rows.append(("fine-tuning", json.dumps(result.extra["finetune"], sort_keys=True)))
    return [(name, str(value)) for name, value in rows]


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


def _title(result: Result) -> str:
    """``attrib-bench: MODEL on DATASET/SPLIT``; the model's id when it has no display name."""
    model = result.provenance["model"]
    data = result.provenance["dataset"]
    return f"attrib-bench: {model.get('name', model['id'])} on {data['name']}/{data['split']}"


def _examples(result: Result, count: int) -> list[str]:
    return [str(i) for i in result.example_ids[:count]]


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
        for kind in _kinds(document, evaluator):
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
    for evaluator in [name for name in evaluators if _kinds(document, name)]:
        png = base64.b64encode(layer_plot(document, evaluator)).decode()
        sections.append(
            f"<h2>Per layer: {_escape(evaluator)}</h2>"
            f'<img class="plot" alt="{_escape(evaluator)} per layer" '
            f'src="data:image/png;base64,{png}">'
        )
    chosen = _examples(document, examples)
    rows = token_rows(document, chosen, attributions)
    reference = _reference_rows(document, chosen) if attributions is None else {}
    order = ranked(document, evaluators[0]) if evaluators else list(document.methods)
    sections.append("<h2>Token heatmaps</h2>" + _heatmaps_html(document, rows, reference, order))
    provenance_table = "".join(
        f"<tr><th>{_escape(k)}</th><td>{_escape(v)}</td></tr>"
        for k, v in _provenance_rows(document)
    )
    sections.append(f"<h2>Provenance</h2><table>{provenance_table}</table>")
    title = _title(document)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_escape(title)}</h1>"
        f'<p class="muted">n = {_escape(data.get("examples"))} examples, reference '
        f"<code>{_escape(document.reference)}</code>, created "
        f"{_escape(document.created)}</p>" + "".join(sections) + "</body></html>\n"
    )


# -------------------------------------------------------------------------------- Markdown


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
        f"# {_title(document)}",
        "",
        f"n = {data.get('examples')} examples, reference `{document.reference}`, "
        f"created {document.created}.",
        "",
    ]
    evaluators = ok_evaluators(document)
    for evaluator in evaluators:
        for kind in _kinds(document, evaluator):
            lines += [
                f"## {heading(document, evaluator, kind)}",
                "",
                "| # | method | best (layer) | last layer | 95% CI | n | s/ex | peak MB | status |",
                "|---:|---|---:|---:|---:|---:|---:|---:|---|",
            ]
            for rank, row in enumerate(leaderboard_rows(document, evaluator, kind), 1):
                status = "ok" if row["status"] == "ok" else f"failed: {row['error']}"
                cells = [row.get(k, "-") for k in ("best", "last", "ci", "n", "seconds", "memory")]
                lines.append(
                    f"| {rank} | `{row['spec']}` | " + " | ".join(cells) + f" | {status} |"
                )
            lines.append("")
        depth = max(
            (len(_layers(m, evaluator, "aggregated") or [])) for m in document.methods.values()
        )
        if depth > 1:
            lines += [
                f"### Per layer ({evaluator}, aggregated rows, mean)",
                "",
                "| method | " + " | ".join(f"L{i}" for i in range(1, depth + 1)) + " |",
                "|---|" + "---:|" * depth,
            ]
            for spec in ranked(document, evaluator):
                layers = _layers(document.methods[spec], evaluator, "aggregated") or []
                if len(layers) > 1:
                    cells = [_signed(x.mean) for x in layers]
                    lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
            lines.append("")
    for name, state in document.evaluators.items():
        if state["status"] != "ok":
            lines += [f"Evaluator `{name}` failed: {state['error']}", ""]
    rows = token_rows(document, _examples(document, examples), attributions)
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
                    key=lambda pair: -abs(pair[1]) if _finite(pair[1]) else 0.0,
                )[:top]
                shown = ", ".join(
                    f"`{token}` " + (f"{value:+.3g}" if _finite(value) else "-")
                    for token, value in pairs
                )
                lines.append(f"| `{spec}` | {shown} |")
            lines.append("")
    lines += ["## Provenance", ""]
    lines += [f"- **{name}**: {value}" for name, value in _provenance_rows(document)]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- the terminal leaderboard


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

    Cost columns: seconds per example and peak memory (MB), both standalone.
    """
    document = as_result(document)
    model = document.provenance["model"]
    dataset = document.provenance["dataset"]
    info = document.evaluator_info.get(evaluator, {})
    higher_is_better = info.get("higher_is_better", True)
    versus = f" vs {document.reference}" if info.get("needs_reference", True) else ""
    direction = "" if higher_is_better else ", lower is better"
    table = Table(
        title=f"{evaluator}{versus} ({kind}{direction}) — {model['name']} on "
        f"{Path(dataset['name']).name}/{dataset['split']} (n={dataset['examples']})",
        title_justify="left",
        caption=_added_caption(document) or None,
        caption_justify="left",
    )
    table.add_column("method", style="bold", no_wrap=True)
    table.add_column("best (layer)", justify="right", no_wrap=True)
    table.add_column("last layer", justify="right", no_wrap=True)
    table.add_column("95% CI", justify="right", no_wrap=True)
    table.add_column("s/ex", justify="right", no_wrap=True)
    table.add_column("peak MB", justify="right", no_wrap=True)
    table.add_column("status")
    sign = 1.0 if higher_is_better else -1.0

    def last_mean(item: tuple[str, MethodResult]) -> float:
        layers = _layers(item[1], evaluator, kind)
        mean = layers[-1].mean if layers else None
        return -math.inf if mean is None or math.isnan(mean) else sign * mean

    for spec, method in sorted(document.methods.items(), key=last_mean, reverse=True):
        layers = _layers(method, evaluator, kind)
        seconds = method.seconds_per_example
        status = _status(method, evaluator)
        row = ["-", "-", "-"]
        if layers:
            scored = [x for x in layers if not math.isnan(x.mean)]
            best = max(scored, key=lambda x: sign * x.mean) if scored else None
            best_text = _mean(best) + (f" ({best.layer})" if best and len(layers) > 1 else "")
            row = [best_text, _mean(layers[-1]), _ci(layers[-1])]
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
