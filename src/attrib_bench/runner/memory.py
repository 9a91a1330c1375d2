"""Peak memory of a block of code: CUDA's allocator counter, or the kernel's resident peak (CPU).

On the CPU the kernel keeps the process's resident high-water mark (``VmHWM``) and resets it on
request (writing ``5`` to ``/proc/self/clear_refs``, Linux >= 4.0), so the peak costs nothing
while the block runs. The sampler it replaced read malloc's bytes (``mallinfo2``, which locks
every arena while torch allocates) every 10 ms and slowed Integrated Gradients 1.26x; neither the
kernel's mark nor a sampled resident set costs it measurably
(benchmarks/results/sampler_cost.md). Freed pages stay with the process, so a
block that reuses memory an earlier one released would show no growth: ``malloc_trim`` first
hands glibc's free pages back to the kernel, and the block's own allocations fault them in again.
Where the mark cannot be reset (no ``clear_refs``, no glibc), a thread samples the resident set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from attrib_bench.core import clock
from attrib_bench.core.trace_fields import LRP_GRAPH_FIELDS

PAGE = os.sysconf("SC_PAGE_SIZE")
MEGABYTE = 2**20
_CLEAR_REFS = "/proc/self/clear_refs"
#: The fallback sampler's interval.
SAMPLE_SECONDS = 0.01


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def _high_water_mark() -> int:
    """The resident peak since the last reset (``VmHWM``), in bytes."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/self/status has no VmHWM")


def _trimmer() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


def _resettable() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")
        _high_water_mark()
    except OSError:
        return False
    return True


_TRIM = _trimmer()
#: How the CPU peak is read: "vmhwm" (the kernel's reset high-water mark) or "sampled-rss".
CPU_SOURCE = "vmhwm" if _TRIM is not None and _resettable() else "sampled-rss"


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.megabytes`` above the start and
    ``peak.seconds``, the block's own time on ``attrib_bench.core.clock``: the measure's setup
    (the trim, a CUDA synchronisation) is not charged to the code it measures.

    Exact on CUDA (the allocator's peak counter) and on Linux with glibc (the kernel's resident
    high-water mark); elsewhere a thread samples every ``SAMPLE_SECONDS`` and can miss a peak
    shorter than that. Blocks must not nest: each one resets the process-wide mark.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.megabytes = 0.0
        self.seconds = 0.0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        elif CPU_SOURCE == "vmhwm":
            _TRIM()
            with open(_CLEAR_REFS, "w") as handle:
                handle.write("5")
            self._start = _rss()
        else:
            self._start = self._peak = _rss()
            self._running = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self._began = clock.now()
        return self

    def _sample(self) -> None:
        while self._running:
            self._peak = max(self._peak, _rss())
            time.sleep(SAMPLE_SECONDS)

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.seconds = clock.now() - self._began
            peak = torch.cuda.max_memory_allocated(self.device)
        elif CPU_SOURCE == "vmhwm":
            self.seconds = clock.now() - self._began
            peak = _high_water_mark()
        else:
            self.seconds = clock.now() - self._began
            self._running = False
            self._thread.join()
            peak = max(self._peak, _rss())
        self.megabytes = max(peak - self._start, 0) / MEGABYTE


def tensor_megabytes(value: Any) -> float:
    """Size of every tensor in a nested structure of lists, tuples and dicts, in MB."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size() / MEGABYTE
    if isinstance(value, dict):
        return tensor_megabytes(list(value.values()))
    if isinstance(value, (list, tuple)):
        return sum(tensor_megabytes(item) for item in value)
    return 0.0


#: Trace attributes behind each built-in name an attributor may list in ``requires``; a field
#: a plugin registers is ``trace.plugin_fields[name]``.
_TRACE_ATTRIBUTES = {
    "attentions": ("attentions",),
    "hidden_states": ("hidden_states",),
    "values": ("values",),
    "pre_layernorm": ("pre_ln1", "pre_ln2"),
}


def standalone_megabytes(
    trace: Any,
    requires: Iterable[str],
    peak_megabytes: float,
    computed_before: set[str],
    trace_megabytes: float = 0.0,
) -> float:
    """A method's memory as if run alone, mirroring ``Trace.standalone_seconds``.

    Its own peak above the start of its call, plus the trace fields it declares (built-in or
    registered by a plugin) and every shared intermediate it read that another method computed
    first (which its own peak cannot see). A method that backpropagates through the trace's
    forward pass (``embedding_graph``, or a pass under LRP rules) also holds that pass's peak,
    ``trace_megabytes``: the activations its graph keeps.
    """
    plugin_fields = getattr(trace, "plugin_fields", {})
    fields = [
        getattr(trace, attribute)
        for name in requires
        for attribute in _TRACE_ATTRIBUTES.get(name, ())
    ]
    fields += [plugin_fields[name] for name in requires if name in plugin_fields]
    shared = [trace.shared[key] for key in trace.accessed & computed_before if key in trace.shared]
    graphs = {"embedding_graph", *LRP_GRAPH_FIELDS}
    graph = trace_megabytes if graphs & set(requires) else 0.0
    return peak_megabytes + graph + tensor_megabytes(fields) + tensor_megabytes(shared)
