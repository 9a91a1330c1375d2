"""Where attrib-bench keeps what it caches: fine-tuned and dequantised models, per-example
results. Here, below every module that reads or writes there, so none imports another for it."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "ATTRIB_BENCH_CACHE"


def cache_root() -> Path:
    """``$ATTRIB_BENCH_CACHE``, else ``$XDG_CACHE_HOME/attrib-bench``, else ~/.cache/..."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attrib-bench"
