"""The identifiability report (``attrib-bench identifiability``) as a terminal table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table


def identifiability_table(report: Mapping[str, Any]) -> Table:
    """Per layer, each map's identifiability rate and the HTA columns (the terminal's view)."""
    rates = report["identifiability"]
    layers = len(next(iter(rates.values())))
    result = Table(
        title=f"identifiability rate — {report['dataset']['sentences']} sentences, "
        f"{report['config']['folds']} fold(s); candidates: {report['candidates']}",
        title_justify="left",
    )
    result.add_column("layer", justify="right")
    for name in rates:
        result.add_column(name, justify="right")
    result.add_column("HTA own", justify="right")
    result.add_column("own top", justify="right")
    hta = report["hta"]
    for layer in range(layers):
        cells = [f"{rates[name][layer]['mean']:.3f}" for name in rates]
        extra = (
            ["-", "-"]
            if layer == 0
            else [
                f"{hta['own_contribution'][layer - 1]:.3f}",
                f"{hta['own_is_top_share'][layer - 1]:.3f}",
            ]
        )
        result.add_row(str(layer), *cells, *extra)
    return result
