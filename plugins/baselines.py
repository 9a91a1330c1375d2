"""The seeded random attributor: the floor every leaderboard is read against."""

from __future__ import annotations

import hashlib

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace


def example_generator(seed: int, example_id: str) -> torch.Generator:
    """A generator seeded by (seed, example id): the scores never depend on batch companions."""
    digest = hashlib.sha256(f"{seed}:{example_id}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


class RandomAttributor(Configurable):
    name = "random"
    description = "Uniform random scores per token, seeded per example (baseline floor)"
    requires = frozenset()
    parameters = {"seed": 0}

    def attribute(self, trace: Trace) -> Attribution:
        batch = trace.batch
        scores_BN = torch.zeros(batch.input_ids_BN.shape, dtype=torch.float32)
        for row, (example, length) in enumerate(zip(batch.examples, batch.lengths, strict=True)):
            generator = example_generator(trace.seed + self.params["seed"], example.id)
            scores_BN[row, :length] = torch.rand(length, generator=generator)
        return Attribution(aggregated_BLN=scores_BN[:, None, :].to(trace.mask_BN.device))


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [RandomAttributor()]
