"""Test plugin: attributors that log every example they compute, to test the result cache.

``COUNT_LOG`` names a file that gets one line ``method id`` per example attributed. With
``COUNT_BLOCK_AFTER=n`` a method that has attributed n examples in this process waits in its
next call until the process is stopped: a test interrupts a run midway at a known point,
however loaded the machine (a sleep per batch raced the test's polling, and lost under load).
The scores fall with the token position, offset per method: deterministic and not constant.
"""

import os
import time
from pathlib import Path

import torch

import attrib_bench

#: Examples each method attributed in this process (for ``COUNT_BLOCK_AFTER``).
_ATTRIBUTED: dict[str, int] = {}


class Counted:
    requires = frozenset()

    def __init__(self, name: str, offset: float) -> None:
        self.name = name
        self.description = f"Position decay that logs its examples ({name})"
        self.offset = offset

    def attribute(self, trace: attrib_bench.Trace) -> attrib_bench.Attribution:
        block = os.environ.get("COUNT_BLOCK_AFTER")
        if block is not None and _ATTRIBUTED.get(self.name, 0) >= int(block):
            while True:  # until the test kills or interrupts the process
                time.sleep(1)
        _ATTRIBUTED[self.name] = _ATTRIBUTED.get(self.name, 0) + len(trace.batch.examples)
        log = os.environ.get("COUNT_LOG")
        if log:
            with Path(log).open("a") as handle:
                handle.writelines(f"{self.name} {e.id}\n" for e in trace.batch.examples)
        width = trace.mask_BN.shape[1]
        positions = torch.arange(width, dtype=torch.float32)
        rows_BN = (self.offset + 1.0 / (1.0 + positions)).expand(trace.mask_BN.shape)
        return attrib_bench.Attribution(aggregated_BLN=(rows_BN * trace.mask_BN)[:, None, :])


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [Counted("counted", 0.0), Counted("counted-too", 0.5)]
