"""Test plugin: attributors that log every example they compute, to test the result cache.

``COUNT_LOG`` names a file that gets one line ``method id`` per example attributed, and
``COUNT_SLEEP`` seconds are slept per batch (so a test can interrupt a run midway). The scores
fall with the token position, offset per method: deterministic and not constant.
"""

import os
import time
from pathlib import Path

import torch

import attrib_bench


class Counted:
    requires = frozenset()

    def __init__(self, name: str, offset: float) -> None:
        self.name = name
        self.description = f"Position decay that logs its examples ({name})"
        self.offset = offset

    def attribute(self, trace: attrib_bench.Trace) -> attrib_bench.Attribution:
        time.sleep(float(os.environ.get("COUNT_SLEEP", "0")))
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
