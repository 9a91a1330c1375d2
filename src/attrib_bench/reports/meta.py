"""The meta-evaluation's terminal table, read from its JSON document alone
(``attrib-bench meta``: attrib_bench.runner.meta): per model, each evaluator's agreement with
the known order of the degraded explainers, its cost, and whether it is flagged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from attrib_bench.reports.leaderboard import finite, signed


def _interval(ci: Any) -> str:
    if not isinstance(ci, list) or not all(finite(v) for v in ci):
        return ""
    return f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def meta_tables(document: Mapping[str, Any]) -> list[Table]:
    """One table per model: evaluator, tau per example [CI], tau corpus [CI], cost, flag."""
    tables = []
    for run in document["runs"]:
        cost = run["cost"]
        ratio = cost["inputs"] / cost["distinct"] if cost["distinct"] else float("nan")
        table = Table(
            title=f"meta-evaluation on {run['model']}: base {run['base']}, "
            f"{run['examples']} examples",
            title_justify="left",
            caption=f"known order: {' > '.join(run['explainers'])}; {document['rule']}. "
            f"Cost: added by each evaluator in this order (erasures are cached per batch); "
            f"total {cost['seconds']:.1f} s, {cost['passes']} passes, {cost['inputs']} inputs "
            f"run for {cost['distinct']} distinct (x{ratio:.2f})",
            caption_justify="left",
        )
        for column in ("evaluator", "tau per example [95% CI]", "tau corpus [95% CI]"):
            table.add_column(column)
        for column in ("seconds", "passes", "inputs", "distinct"):
            table.add_column(column, justify="right")
        table.add_column("flag")
        for name, row in run["evaluators"].items():
            if row["status"] != "ok":
                table.add_row(name, f"failed: {row['error']}", "", "", "", "", "", "failed")
                continue
            example, corpus, spent = row["tau_example"], row["tau_corpus"], row["cost"]
            flag = "UNRELIABLE" if row["flagged"] else "ok"
            if not row["base_best"]:
                flag += ", base not best"
            table.add_row(
                name,
                signed(example["mean"]) + _interval(example["ci95"]),
                signed(corpus["value"]) + _interval(corpus["ci95"]),
                f"{spent['seconds']:.2f}",
                str(spent["passes"]),
                str(spent["inputs"]),
                str(spent["distinct"]),
                flag,
            )
        tables.append(table)
    return tables
