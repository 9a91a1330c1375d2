"""The attention family's shared flow: per-layer matrices M^l, an optional residual, rollout.

Public so that the built-in ``attention``, ``rollout`` and ``effective-attention`` plugins and
third-party methods share one implementation (docs/math/attention-family.md, eqs. (1)-(3)): a method
says how it gets M^l (and, if it must, how it mixes in the residual) and inherits the rest.
``head_mean_attention`` is memoised on the trace, so every method reading W shares one mean.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from attrib_bench.core.configurable import Configurable
from attrib_bench.core.interfaces import Attribution
from attrib_bench.toolkit.aggregation import fixed_residual, layerwise_attribution

if TYPE_CHECKING:
    from attrib_bench.core.trace import Trace


def head_mean_attention(trace: Trace) -> list[torch.Tensor]:
    """W^l for every layer: (B, N, N) head means, computed once per batch."""
    return trace.memo(
        "attention.head_mean",
        lambda: [a.mean(dim=1) for a in trace.need("attentions")],
    )


class AttentionFamily(Configurable, ABC):
    """M^l per layer; ``residual=r`` > 0 mixes in r * I per layer; target rows and rollout.

    Subclasses set ``name``, ``description`` and ``requires`` and define ``layer_matrices``.
    """

    parameters = {"residual": 0.0}

    def validate(self) -> None:
        if not 0.0 <= self.params["residual"] < 1.0:
            raise self.out_of_range("residual", "in [0, 1)")

    @abstractmethod
    def layer_matrices(self, trace: Trace) -> list[torch.Tensor]:
        """M^l per layer before the residual, (B, N, N)."""

    def with_residual(
        self, matrix_BNK: torch.Tensor, mask_BN: torch.Tensor, ratio: float
    ) -> torch.Tensor:
        """(1 - r) * normalise_rows(M) + r * I (the spec's fixed residual), for row-stochastic M."""
        return fixed_residual(matrix_BNK, mask_BN, ratio)

    def attribute(self, trace: Trace) -> Attribution:
        matrices = self.layer_matrices(trace)
        ratio = self.params["residual"]
        if ratio > 0:
            matrices = [self.with_residual(m, trace.mask_BN, ratio) for m in matrices]
        return layerwise_attribution(matrices, trace.mask_BN, positions_B=trace.target_positions_B)
