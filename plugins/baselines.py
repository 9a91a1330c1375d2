"""The seeded random attributor: the floor every leaderboard is read against."""

from __future__ import annotations

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace
from attrib_bench.toolkit.erasure import example_generator


class RandomAttributor(Configurable):
    """Uniform random scores in [0, 1) per real token, drawn from (run seed + ``seed``, the
    example's id), so they never depend on the batch.

    Reference: none (the floor every leaderboard carries: a method must beat chance).
    """

    name = "random"
    description = "Uniform random scores per token, seeded per example (baseline floor)"
    requires = frozenset()
    family = "baseline"
    parameters = {"seed": 0}
    parameter_docs = {
        "seed": "added to the run's seed; each example's scores are drawn from (run seed + "
        "seed, example id); any integer",
    }

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
