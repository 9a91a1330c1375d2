"""Peak memory of a block of code: CUDA's allocator counter, or sampled allocated bytes on the CPU.

On the CPU the resident set is a poor per-method measure: freed pages stay with the process, so a
method that reuses memory an earlier method released shows no growth. Where glibc offers
``mallinfo2`` (glibc >= 2.33) the sampler reads the bytes malloc has handed out and not taken
back (torch's CPU tensors are malloc'd), the CPU analogue of ``torch.cuda.memory_allocated``;
elsewhere it falls back to the resident set.
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

PAGE = os.sysconf("SC_PAGE_SIZE")
MEGABYTE = 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def _malloc_reader() -> Callable[[], int] | None:
    """Bytes in use by malloc (heap chunks plus mmapped chunks), or None without mallinfo2."""
    name = ctypes.util.find_library("c")
    try:
        mallinfo2 = ctypes.CDLL(name).mallinfo2 if name else None
    except (OSError, AttributeError):
        return None
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2

    def allocated() -> int:
        info = mallinfo2()
        return info.uordblks + info.hblkhd

    return allocated


_MALLOC = _malloc_reader()
#: What the CPU measure reads: "malloc" (allocated bytes) or "rss" (resident set).
CPU_SOURCE = "malloc" if _MALLOC is not None else "rss"
_cpu_bytes: Callable[[], int] = _MALLOC or _rss
#: The CPU sampler's interval. Every wake-up preempts one of torch's threads: sampling each
#: millisecond slowed Integrated Gradients on 2 cores (benchmarks/sampler_cost.py).
SAMPLE_SECONDS = 0.01


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.megabytes`` above the start.

    On the CPU a thread samples every ``SAMPLE_SECONDS``, so a peak shorter than that can be
    missed; on CUDA the allocator's own peak counter is exact.
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
            self._start = self._peak = _cpu_bytes()
            self._running = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while self._running:
            self._peak = max(self._peak, _cpu_bytes())
            time.sleep(SAMPLE_SECONDS)

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._running = False
            self._thread.join()
            peak = max(self._peak, _cpu_bytes())
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
    forward pass (``embedding_graph``) also holds that pass's peak, ``trace_megabytes``: the
    activations its graph keeps.
    """
    plugin_fields = getattr(trace, "plugin_fields", {})
    fields = [
        getattr(trace, attribute)
        for name in requires
        for attribute in _TRACE_ATTRIBUTES.get(name, ())
    ]
    fields += [plugin_fields[name] for name in requires if name in plugin_fields]
    shared = [trace.shared[key] for key in trace.accessed & computed_before if key in trace.shared]
    graph = trace_megabytes if "embedding_graph" in requires else 0.0
    return peak_megabytes + graph + tensor_megabytes(fields) + tensor_megabytes(shared)
