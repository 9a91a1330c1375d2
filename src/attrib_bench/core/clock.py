"""The clock behind every cost the runner charges (``PeakMemory.seconds``, ``Trace.memo``).

One seam, read at each call, so that a test can replace it with a clock that moves only when
told (``monkeypatch.setattr(clock, "now", fake)``) and check the accounting exactly, whatever
the machine's load.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Seconds since an arbitrary start, monotonic.
now: Callable[[], float] = time.perf_counter
