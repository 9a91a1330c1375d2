"""Token-level rows for the reports' heatmaps: from ``attrib-bench attribute`` JSONL, or from the
run's cache entries (the result's ``cache`` section points at them)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attrib_bench.core.errors import UsageError
from attrib_bench.results.typed import Result, Results, as_result, check_json, json_validator

#: A line of ``attrib-bench attribute`` JSONL with scores (a failed method's line has none).
RECORD = {
    "type": "object",
    "required": ["id", "method", "tokens", "aggregated"],
    "properties": {
        "id": {"type": "string"},
        "method": {"type": "string"},
        "tokens": {"type": "array", "items": {"type": "string"}},
        "aggregated": {
            "type": "array",
            "items": {"type": "array", "items": {"type": ["number", "null"]}},
        },
    },
}


def read_attributions(path: Path | str) -> dict[str, dict[str, dict[str, Any]]]:
    """``attrib-bench attribute`` JSONL as example id -> method -> {tokens, row}."""
    path = Path(path)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    validator = json_validator(RECORD)
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
        problem = f"{str(path)!r} line {number} is not an attributions record"
        if isinstance(record, dict) and ("id" not in record or not record.get("aggregated")):
            continue  # a failed method's error record
        check_json(record, validator, problem, "the line")
        tokens, row = record["tokens"], record["aggregated"][-1]
        table.setdefault(record["id"], {})[record["method"]] = {"tokens": tokens, "row": row}
    return table


def token_rows(
    document: Results,
    example_ids: Sequence[str],
    attributions: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Example id -> method -> {tokens, row}: the last aggregated row over the real tokens."""
    from attrib_bench.runner.cache import cached_rows

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


def reference_rows(result: Result, example_ids: Sequence[str]) -> dict:
    """The reference's rows when it ran only as the reference (no leaderboard row of its own)."""
    from attrib_bench.runner.cache import read_entry

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
