"""Raw attention and attention rollout (Abnar & Zuidema 2020).

Per layer, M^l is the head mean of the attention probabilities (W). ``attention`` rolls W out
without a residual; ``rollout`` uses (1 - r) * W + r * I with r = 0.5 by default
(docs/math/attention-family.md, eqs. (1)-(3): "W" and "W-FixedRes"). The flow is
``attrib_bench.toolkit.attention_family``'s.
"""

from __future__ import annotations

import torch

import attrib_bench
from attrib_bench import Trace
from attrib_bench.toolkit.attention_family import AttentionFamily, head_mean_attention


class RawAttention(AttentionFamily):
    """Head-mean attention; ``residual=r`` > 0 gives (1 - r) * W + r * I per layer.

    Reference: Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", ACL
    (raw attention, the baseline the paper's rollout and flow improve on).
    """

    name = "attention"
    description = "Raw attention: head mean per layer, [CLS] row, rolled out without residual"
    requires = frozenset({"attentions"})
    family = "attention"
    parameter_docs = {
        "residual": "share r of the identity mixed into each layer's head-mean attention, "
        "(1 - r) W + r I, before the rollout (0: W as is); in [0, 1)",
    }

    def layer_matrices(self, trace: Trace) -> list[torch.Tensor]:
        return head_mean_attention(trace)


class Rollout(RawAttention):
    """Attention rollout: (1 - r) W + r I per layer, multiplied over the layers (W-FixedRes).

    Reference: Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", ACL.
    """

    name = "rollout"
    description = "Attention rollout (Abnar & Zuidema 2020): (1 - r) W + r I, r = residual = 0.5"
    parameters = {"residual": 0.5}


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [RawAttention(), Rollout()]
