"""The segment report (``attrib-bench context``) as a terminal table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.table import Table


def _cell(summary: Mapping[str, Any] | None) -> str:
    if summary is None or math.isnan(summary["mean"]):
        return "-"
    low, high = summary["ci95"]
    interval = "" if math.isnan(low) else f" [{low:.3f}, {high:.3f}]"
    return f"{summary['mean']:.3f}{interval}"


def segments_table(report: Mapping[str, Any]) -> Table:
    """Per method, each evaluator value's mean and 95% CI, its seconds per example, status."""
    methods = report["methods"]
    names = list(dict.fromkeys(n for row in methods.values() for n in row["summary"]))
    examples = report["examples"]
    segments = sum(len(e["segments"]) for e in examples) / len(examples)
    result = Table(
        title=f"segment attribution — {len(examples)} examples, {segments:.1f} segments each "
        f"on average; the answer's log-probability",
        title_justify="left",
    )
    result.add_column("method")
    for name in names:
        result.add_column(name, justify="right")
    result.add_column("s/ex", justify="right")
    result.add_column("status")
    for spec, row in methods.items():
        cells = [_cell(row["summary"].get(name)) for name in names]
        result.add_row(spec, *cells, f"{row['seconds_per_example']:.2f}", row["status"])
    return result
