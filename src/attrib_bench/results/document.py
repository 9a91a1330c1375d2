"""The result document on disk: its schema version, atomic JSON writing, and whether a run
completed. Building it from a run's state is the runner's (attrib_bench.runner.document)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from attrib_bench.core.errors import UsageError

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "schema" / "results.schema.json"


def _clean(value: Any) -> Any:
    """NaN is not JSON: write null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def check_writable(path: Path) -> None:
    """One line before the work, not a traceback after it: an output that is a directory, or
    whose folder cannot be made or written to."""
    if path.is_dir():
        raise UsageError(f"output {str(path)!r} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(
            f"cannot make the folder of output {str(path)!r}: {error.strerror}"
        ) from None
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"cannot write output {str(path)!r}: its folder is not writable")


def write_json(document: dict[str, Any], path: Path) -> None:
    """Write atomically (a half-written result is worse than none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(_clean(document), indent=1) + "\n")
    temporary.replace(path)


def exit_status(document: dict[str, Any]) -> bool:
    """True when every method, evaluator and (method, evaluator) pair completed with scores."""
    methods = document["methods"].values()
    return (
        all(m["status"] == "ok" for m in methods)
        and all(e["status"] == "ok" for e in document["evaluators"].values())
        and all(p["status"] == "ok" for m in methods for p in m.get("evaluators", {}).values())
    )
