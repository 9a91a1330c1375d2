"""Peak memory of a block of code: CUDA's allocator counter, or sampled RSS on the CPU."""

from __future__ import annotations

import os
import threading
import time

import torch

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.megabytes`` above the start.

    On the CPU a thread samples the resident set every millisecond, so a peak shorter than that
    can be missed; on CUDA the allocator's own peak counter is exact.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.megabytes = 0.0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._start = self._peak = _rss()
            self._running = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while self._running:
            self._peak = max(self._peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._running = False
            self._thread.join()
            peak = max(self._peak, _rss())
        self.megabytes = (peak - self._start) / 2**20
