"""Raw attention and attention rollout (Abnar & Zuidema 2020).

Per layer, M^l is the head mean of the attention probabilities (W). ``attention`` rolls W out
without a residual; ``rollout`` uses (1 - r) * W + r * I with r = 0.5 by default
(../shared/specs/attention-family.md, "W" and "W-FixedRes").
"""

from __future__ import annotations

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace, UsageError
from attrib_bench.aggregation import fixed_residual, layerwise_attribution


def head_mean_attention(trace: Trace) -> list[torch.Tensor]:
    """W^l for every layer: (B, N, N) head means, computed once per batch."""
    return trace.memo(
        "attention.head_mean",
        lambda: [a.mean(dim=1) for a in trace.need("attentions")],
    )


class RawAttention(Configurable):
    """Head-mean attention; ``residual=r`` > 0 gives (1 - r) * W + r * I per layer."""

    name = "attention"
    description = "Raw attention: head mean per layer, [CLS] row, rolled out without residual"
    requires = frozenset({"attentions"})
    parameters = {"residual": 0.0}

    def validate(self) -> None:
        if not 0.0 <= self.params["residual"] < 1.0:
            raise UsageError(f"{self.name}:residual must be in [0, 1), got {self.params}")

    def layer_matrices(self, trace: Trace) -> list[torch.Tensor]:
        """M^l per layer before the residual, (B, N, N); subclasses change this."""
        return head_mean_attention(trace)

    def with_residual(
        self, matrix_BNK: torch.Tensor, mask_BN: torch.Tensor, ratio: float
    ) -> torch.Tensor:
        """(1 - r) * normalise_rows(M) + r * I (the spec's fixed residual); W's rows sum to 1."""
        return fixed_residual(matrix_BNK, mask_BN, ratio)

    def attribute(self, trace: Trace) -> Attribution:
        matrices = self.layer_matrices(trace)
        ratio = self.params["residual"]
        if ratio > 0:
            matrices = [self.with_residual(m, trace.mask_BN, ratio) for m in matrices]
        return layerwise_attribution(matrices, trace.mask_BN)


class Rollout(RawAttention):
    name = "rollout"
    description = "Attention rollout (Abnar & Zuidema 2020): (1 - r) W + r I, r = residual = 0.5"
    parameters = {"residual": 0.5}


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [RawAttention(), Rollout()]
