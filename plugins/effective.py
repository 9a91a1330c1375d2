"""Effective attention (Brunner et al., ICLR 2020, "On Identifiability in Transformers").

Per layer and head, the attention rows are projected onto the column space of the
value-transformed matrix T_h = V_h W_O^h (../shared/specs/identifiability.md): the part of A_h in
the left null space of T_h changes nothing in the layer's output, so it cannot explain it.
A_eff_h = A_h U_r U_r^T with U_r the left singular vectors of V_h above the ``matrix_rank``
threshold (V_h has the same column space as T_h because W_O^h has full rank d_v; V_h is smaller).
Per example on its real tokens only; SVDs are batched over the heads of all same-length examples.
"""

from __future__ import annotations

import torch

import attrib_bench
from attrib_bench import Trace
from attrib_bench_plugins.attention import RawAttention


def column_space_projector(matrices_XNE: torch.Tensor) -> torch.Tensor:
    """U_r U_r^T for each (n, e) matrix of a stack, in float64; rank by numpy's matrix_rank rule."""
    u_XNK, s_XK, _ = torch.linalg.svd(matrices_XNE.double(), full_matrices=False)
    n, e = matrices_XNE.shape[-2:]
    tolerance_X1 = s_XK.amax(dim=-1, keepdim=True) * max(n, e) * torch.finfo(torch.float64).eps
    kept_XNK = u_XNK * (s_XK > tolerance_X1)[..., None, :]
    return kept_XNK @ u_XNK.transpose(-1, -2)


def effective_attention(trace: Trace, layer: int) -> torch.Tensor:
    """A_eff for every head of one layer, (B, H, N, N), zero outside each example's real block."""
    attention_BHNK = trace.attentions[layer]
    heads = attention_BHNK.shape[1]
    values_BNHE = trace.values[layer].unflatten(-1, (heads, -1))
    result = torch.zeros_like(attention_BHNK)
    lengths = torch.tensor(trace.batch.lengths)
    for n in lengths.unique().tolist():
        rows = (lengths == n).nonzero().flatten().tolist()
        values_XHNE = values_BNHE[rows, :n].permute(0, 2, 1, 3)
        projector_XHNN = column_space_projector(values_XHNE)
        attention_XHNN = attention_BHNK[rows, :, :n, :n].double()
        result[rows, :, :n, :n] = (attention_XHNN @ projector_XHNN).to(result.dtype)
    return result


class EffectiveAttention(RawAttention):
    """Head mean of effective attention; rolled out like ``attention`` (``residual`` too)."""

    name = "effective-attention"
    description = "Effective attention (Brunner et al. 2020): attention minus its null-space part"
    requires = frozenset({"attentions", "values"})

    def layer_matrices(self, trace: Trace) -> list[torch.Tensor]:
        return trace.memo(
            "effective.head_mean",
            lambda: [
                effective_attention(trace, layer).mean(dim=1) for layer in range(trace.num_layers)
            ],
        )


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [EffectiveAttention()]
