"""Reports of similarity across models, read from the JSON alone.

Two kinds: a representation-similarity result (``attrib-bench similarity --output``, schema
``attrib-bench/similarity``: per pair of models, every measure's (L_x + 1) x (L_y + 1) layer
matrix, with each model's random-init floor and two random inits against each other), and the
``models`` section of a run over several models (the ranking evaluator per method under each
model, and the Kendall tau of the method rankings between models).

Data helpers and the Markdown here; the HTML page is ``attrib_bench.reports.html``. Nothing here
imports ``attrib_bench.analyses`` (the layering): the diagonal tables are rebuilt from the dict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.table import Table

from attrib_bench.core.errors import UsageError

SCHEMA = "attrib-bench/similarity"
KINDS = ("models", "random-floor", "random-random")


# --- representation similarity -----------------------------------------------------------------


def is_similarity(document: Any) -> bool:
    return isinstance(document, Mapping) and document.get("schema") == SCHEMA


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_similarity(document: Any, name: str) -> None:
    """One UsageError naming the file and the field unless every part the reports read is
    there: ``pairs`` of {x, y, kind, measures: {name: matrix of numbers or null}}."""
    where = f"{name!r} is not a valid attrib-bench similarity result"
    if document.get("version", 1) != 1:
        raise UsageError(
            f"{name!r} has similarity version {document.get('version')!r}; this reads 1"
        )
    pairs = document.get("pairs")
    if not isinstance(pairs, list):
        raise UsageError(f"{where}: 'pairs' must be a list")
    for index, pair in enumerate(pairs):
        at = f"pairs[{index}]"
        if not isinstance(pair, Mapping):
            raise UsageError(f"{where}: {at} must be an object")
        for key in ("x", "y"):
            if not isinstance(pair.get(key), str):
                raise UsageError(f"{where}: {at}.{key} must be a string")
        if pair.get("kind") not in KINDS:
            raise UsageError(f"{where}: {at}.kind must be one of {', '.join(KINDS)}")
        measures = pair.get("measures")
        if not isinstance(measures, Mapping) or not measures:
            raise UsageError(f"{where}: {at}.measures must be a non-empty object")
        for measure, matrix in measures.items():
            ok = (
                isinstance(matrix, list)
                and matrix
                and all(isinstance(row, list) and row for row in matrix)
                and all(v is None or _number(v) for row in matrix for v in row)
            )
            if not ok:
                raise UsageError(
                    f"{where}: {at}.measures[{measure!r}] must be a matrix of numbers or null"
                )
    for key in ("dataset", "config"):
        if not isinstance(document.get(key, {}), Mapping):
            raise UsageError(f"{where}: {key!r} must be an object")
    if not isinstance(document.get("models", []), list):
        raise UsageError(f"{where}: 'models' must be a list")


def lower_is_more_similar(measure: str) -> bool:
    """Procrustes is a distance and the learned maps' ``*_mse`` an error: lower is closer."""
    return measure == "procrustes" or measure.endswith("_mse")


def direction(measure: str) -> str:
    return "lower is more similar" if lower_is_more_similar(measure) else "higher is more similar"


def value_text(value: Any) -> str:
    """The value as every report prints it (3 decimals), ``-`` where null."""
    return f"{value:.3f}" if _number(value) and not math.isnan(value) else "-"


def at(matrix: list[list], i: int, j: int) -> Any:
    return matrix[i][j] if i < len(matrix) and j < len(matrix[i]) else None


def floor_pairs(report: Mapping[str, Any], pair: Mapping[str, Any]) -> tuple[Any, Any]:
    """The random-init floor of a models pair (kind random-floor, the same x) and the pair of
    two random inits of x's architecture (kind random-random, whose x is the floor's y); None
    where the file has none."""
    pairs = report["pairs"]
    floor = next((p for p in pairs if p["kind"] == "random-floor" and p["x"] == pair["x"]), None)
    randoms = [p for p in pairs if p["kind"] == "random-random"]
    both = None
    if floor is not None:
        both = next((p for p in randoms if p["x"] == floor["y"]), None)
    return floor, both


def grouped_pairs(report: Mapping[str, Any]) -> tuple[list[tuple], list[dict]]:
    """(models pair, its floor, random-random) for every models pair, then the pairs shown
    beside none of them (the floors of models that are never an x), in file order."""
    groups = []
    shown: set[int] = set()
    for pair in report["pairs"]:
        if pair["kind"] == "models":
            floor, both = floor_pairs(report, pair)
            groups.append((pair, floor, both))
            shown.update(id(p) for p in (pair, floor, both) if p is not None)
    return groups, [p for p in report["pairs"] if id(p) not in shown]


def pair_title(pair: Mapping[str, Any]) -> str:
    return f"{pair['x']} -> {pair['y']} ({pair['kind']})"


def subtitle(report: Mapping[str, Any]) -> str:
    data = report.get("dataset") or {}
    config = report.get("config") or {}
    rows = "tokens" if config.get("token_level") else "sentence means"
    return (
        f"{data.get('name')}/{data.get('split')}: {data.get('sentences')} sentences, "
        f"{data.get('rows')} rows ({rows})"
    )


def model_rows(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, description) of every model compared."""
    rows = []
    for model in report.get("models") or []:
        if isinstance(model, Mapping):
            rows.append(
                (
                    str(model.get("name")),
                    f"{model.get('model_type')}, {model.get('layers')} layers, width "
                    f"{model.get('width')}, id {model.get('id')}, weights sha256 "
                    f"{model.get('weights_sha256')}",
                )
            )
    return rows


def subsample_note(report: Mapping[str, Any]) -> str | None:
    sub = report.get("gram_subsample")
    if not isinstance(sub, Mapping):
        return None
    measures = ", ".join(sub.get("measures") or [])
    return (
        f"{measures} computed on {sub.get('rows')} of {sub.get('of')} rows "
        f"(seed {sub.get('seed')}: {sub.get('rule')})"
    )


def _diagonal_markdown(pair: Mapping[str, Any], floor: Mapping[str, Any] | None) -> list[str]:
    measures = pair["measures"]
    first = next(iter(measures.values()))
    depth = min(len(first), len(first[0]))
    title = f"### {pair_title(pair)}, layer pair (i, i)"
    lines = [title, ""]
    if floor is not None:
        lines += [f"In brackets the floor: {pair['x']} -> a random init of it.", ""]
    names = list(measures)
    arrows = [f"{n} {'↓' if lower_is_more_similar(n) else '↑'}" for n in names]
    lines += ["| layer | " + " | ".join(arrows) + " |", "|---:|" + "---:|" * len(names)]
    for i in range(depth):
        cells = []
        for name in names:
            cell = value_text(at(measures[name], i, i))
            if floor is not None:
                below = floor["measures"].get(name)
                cell += f" ({value_text(at(below, i, i) if below else None)})"
            cells.append(cell)
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def render_similarity_markdown(report: Mapping[str, Any]) -> str:
    """Per pair (floors inside brackets beside their models pair), the diagonal (i, i) of every
    measure; the Markdown counterpart of the terminal tables of ``attrib-bench similarity``."""
    names = [m.get("name") for m in report.get("models") or [] if isinstance(m, Mapping)]
    lines = [
        f"# attrib-bench similarity: {', '.join(map(str, names))}",
        "",
        f"{subtitle(report)}. Layer 0 = the embeddings. Higher is more similar (↑) except "
        "procrustes and *_mse (↓: lower is more similar). `-`: not computed or undefined.",
        "",
    ]
    note = subsample_note(report)
    if note:
        lines += [f"Gram subsample: {note}.", ""]
    if names:
        lines += ["## Models", ""]
        lines += [f"- **{name}**: {text}" for name, text in model_rows(report)]
        lines.append("")
    lines += ["## Layer pair (i, i)", ""]
    groups, others = grouped_pairs(report)
    for pair, floor, both in groups:
        lines += _diagonal_markdown(pair, floor)
        if both is not None:
            lines += _diagonal_markdown(both, None)
    for pair in others:
        lines += _diagonal_markdown(pair, None)
    return "\n".join(lines) + "\n"


# --- the models section of a run over several models ------------------------------------------


def across_models(extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``models`` section of a run over several models as what the reports show: the
    evaluator ranked by, the model labels, the per-method rows of its last-layer means (one
    value per model, None where missing), the Kendall tau matrix, mean and min; None without
    a usable section."""
    section = extra.get("models")
    if not isinstance(section, Mapping) or not isinstance(section.get("per_model"), list):
        return None
    per_model = [e for e in section["per_model"] if isinstance(e, Mapping)]
    if not per_model:
        return None
    ranking = section.get("ranking") if isinstance(section.get("ranking"), Mapping) else None
    tables = [
        e.get("last_layer") if isinstance(e.get("last_layer"), Mapping) else {} for e in per_model
    ]
    evaluator = ranking.get("evaluator") if ranking else None
    if evaluator is None:
        evaluator = next((name for t in tables for s in t.values() if s for name in s), None)
    specs = list(dict.fromkeys(spec for table in tables for spec in table))
    ranked = set(ranking.get("methods") or []) if ranking else set()
    rows = []
    for spec in specs:
        values = []
        for table in tables:
            scores = table.get(spec)
            value = scores.get(evaluator) if isinstance(scores, Mapping) else None
            values.append(value if _number(value) else None)
        rows.append({"spec": spec, "values": values, "ranked": spec in ranked})
    labels = [f"{i}: {e.get('name') or e.get('model')}" for i, e in enumerate(per_model, 1)]
    return {
        "evaluator": evaluator,
        "labels": labels,
        "models": [str(e.get("model")) for e in per_model],
        "floor_model": section.get("floor_model"),
        "rows": rows,
        "ranking": ranking,
    }


def signed_text(value: Any) -> str:
    return f"{value:+.3f}" if _number(value) and not math.isnan(value) else "-"


def ranking_note(section: Mapping[str, Any]) -> str:
    ranking = section["ranking"]
    if ranking is None:
        return "No method ranking across models (no per-model evaluator scored)."
    methods = ranking.get("methods") or []
    return (
        f"Method ranking by {ranking.get('evaluator')} ({ranking.get('kind')} rows, "
        f"{ranking.get('layer')} layer) across models: Kendall tau mean "
        f"{signed_text(ranking.get('mean'))}, min {signed_text(ranking.get('min'))} over "
        f"{len(methods)} methods (the reference left out)."
    )


def across_models_markdown(extra: Mapping[str, Any]) -> list[str]:
    """The "Across models" section of the Markdown run report; no lines without one."""
    section = across_models(extra)
    if section is None:
        return []
    lines = ["## Across models", ""]
    lines += [f"Models: {', '.join(f'`{m}`' for m in section['models'])}."]
    if section["floor_model"]:
        lines += [f"Random-init floor: `{section['floor_model']}`."]
    lines += ["", ranking_note(section), ""]
    if section["rows"]:
        lines += [
            f"### {section['evaluator']} per model (last layer, aggregated rows, mean)",
            "",
            "| method | " + " | ".join(section["labels"]) + " |",
            "|---|" + "---:|" * len(section["labels"]),
        ]
        for row in section["rows"]:
            mark = "" if row["ranked"] or section["ranking"] is None else " (not ranked)"
            cells = " | ".join(signed_text(v) for v in row["values"])
            lines.append(f"| `{row['spec']}`{mark} | {cells} |")
        lines.append("")
    ranking = section["ranking"]
    tau = ranking.get("kendall_tau") if ranking else None
    if isinstance(tau, list) and tau:
        labels = section["labels"]
        lines += [
            "### Kendall tau between the models' method rankings",
            "",
            "| | " + " | ".join(labels) + " |",
            "|---|" + "---:|" * len(labels),
        ]
        for label, row in zip(labels, tau, strict=False):
            cells = row if isinstance(row, list) else []
            lines.append(f"| {label} | " + " | ".join(signed_text(v) for v in cells) + " |")
        lines.append("")
    return lines


def _cell(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def similarity_tables(report: Mapping[str, Any]) -> list[Table]:
    """Per model pair, the diagonal (i, i) of every measure with x's random-init floor beside."""
    floors = {p["x"]: p for p in report["pairs"] if p["kind"] == "random-floor"}
    out = []
    for pair in report["pairs"]:
        if pair["kind"] == "random-floor":
            continue
        floor = floors.get(pair["x"]) if pair["kind"] == "models" else None
        measures = pair["measures"]
        first = next(iter(measures.values()))
        depth = min(len(first), len(first[0]))
        title = f"{pair['x']} -> {pair['y']} ({pair['kind']}), layer pair (i, i)"
        if floor is not None:
            title += f"; in brackets the floor: {pair['x']} -> a random init of it"
        table = Table(title=title, title_justify="left")
        table.add_column("layer", justify="right")
        for name in measures:
            table.add_column(name, justify="right")
        for i in range(depth):
            cells = []
            for name in measures:
                cell = _cell(measures[name][i][i])
                if floor is not None:
                    row = floor["measures"][name]
                    below = row[i][i] if i < len(row) and i < len(row[i]) else None
                    cell += f" ({_cell(below)})"
                cells.append(cell)
            table.add_row(str(i), *cells)
        out.append(table)
    return out
