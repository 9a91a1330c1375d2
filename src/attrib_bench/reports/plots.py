"""Per-layer curves of every method (matplotlib, optional: ``pip install attrib-bench[plot]``)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from attrib_bench.core.errors import UsageError
from attrib_bench.reports.leaderboard import finite, heading, layer_scores, ranked, scored_kinds
from attrib_bench.results.typed import Results, as_result

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
    kinds = scored_kinds(result, evaluator)
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
            layers = layer_scores(result.methods[spec], evaluator, kind)
            if not layers:
                continue
            colour, marker, dashes = styles[spec]
            means = [x.mean if finite(x.mean) else math.nan for x in layers]
            if len(layers) == 1:
                axis.hlines(means[0], 1, depth, colors=[colour], linestyles=[dashes], label=spec)
                continue
            numbers = [x.layer for x in layers]
            low = [x.ci95[0] if finite(x.ci95[0]) else math.nan for x in layers]
            high = [x.ci95[1] if finite(x.ci95[1]) else math.nan for x in layers]
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
