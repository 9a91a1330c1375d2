"""Effective attention (Brunner et al., ICLR 2020, "On Identifiability in Transformers").

Per layer and head, the attention rows are projected onto the column space of the
value-transformed matrix T_h = V_h W_O^h (../shared/specs/identifiability.md): the part of A_h in
the left null space of T_h changes nothing in the layer's output, so it cannot explain it.
A_eff_h = A_h U_r U_r^T with U_r the left singular vectors of T_h above the spec's rank threshold
sigma_max * max(n, d) * eps (numpy's ``matrix_rank`` rule for the n x d matrix T_h, eps of the
dtype the values were computed in).

T_h is never formed: with the QR factorisation W_O^h^T = Q R (Q orthonormal columns, R d_v x d_v),
T_h = (V_h R^T) Q^T, so the n x d_v matrix V_h R^T has T_h's singular values and left singular
vectors at the cost of an SVD of V_h's size. Per example on its real tokens only; SVDs are
batched over the heads of all same-length examples.

Rolled out like raw attention (``attrib_bench.toolkit.attention_family``), with
(1 - r) A_eff + r I for ``residual=r`` > 0: the rows of A_eff do not sum to 1 (they may be
near 0 or negative), so they are not renormalised first.

V_h is whatever the value projection produced, so pre-LN blocks and fused projections are
served as they are; with grouped-query attention V_h is the values of head h's key/value head.
Causal masks are not: the projector onto T_h's column space spreads row i over tokens after i,
which row i never saw (the causal analogue would project row i onto the rows up to i only).
"""

from __future__ import annotations

import torch

import attrib_bench
from attrib_bench import Trace
from attrib_bench.toolkit.aggregation import mix_identity
from attrib_bench.toolkit.attention_family import AttentionFamily


def column_space_projector(matrices_XNE: torch.Tensor, width: int, eps: float) -> torch.Tensor:
    """U_r U_r^T for each (n, e) matrix of a stack, in float64.

    The rank counts singular values above sigma_max * max(n, width) * eps: ``width`` is the
    width of the matrix whose rank is meant (T_h's d, not d_v) and ``eps`` the machine epsilon
    of the dtype its entries were computed in.
    """
    u_XNK, s_XK, _ = torch.linalg.svd(matrices_XNE.double(), full_matrices=False)
    n = matrices_XNE.shape[-2]
    tolerance_X1 = s_XK.amax(dim=-1, keepdim=True) * max(n, width) * eps
    kept_XNK = u_XNK * (s_XK > tolerance_X1)[..., None, :]
    return kept_XNK @ u_XNK.transpose(-1, -2)


def effective_attention(trace: Trace, layer: int) -> torch.Tensor:
    """A_eff for every head of one layer, (B, H, N, N), zero outside each example's real block."""
    attention_BHNK = trace.attentions[layer]
    values_BNHE = trace.adapter.query_head_values(trace.values[layer])
    output_weight_HED = trace.adapter.layer_params(layer).output_weight_HED.double()
    factor_HEE = torch.linalg.qr(output_weight_HED.transpose(-1, -2)).R
    width = output_weight_HED.shape[-1]
    eps = torch.finfo(values_BNHE.dtype).eps
    result = torch.zeros_like(attention_BHNK)
    lengths = torch.tensor(trace.batch.lengths)
    for n in lengths.unique().tolist():
        rows = (lengths == n).nonzero().flatten().tolist()
        values_XHNE = values_BNHE[rows, :n].permute(0, 2, 1, 3).double()
        same_gram_XHNE = values_XHNE @ factor_HEE.transpose(-1, -2)  # V R^T: T T^T = V R^T R V^T
        projector_XHNN = column_space_projector(same_gram_XHNE, width, eps)
        attention_XHNN = attention_BHNK[rows, :, :n, :n].double()
        result[rows, :, :n, :n] = (attention_XHNN @ projector_XHNN).to(result.dtype)
    return result


class EffectiveAttention(AttentionFamily):
    """Head mean of effective attention, rolled out like ``attention``, rows not renormalised."""

    name = "effective-attention"
    description = "Effective attention (Brunner et al. 2020): attention minus its null-space part"
    requires = frozenset({"attentions", "values"})
    #: The left null space of T_h is taken over all tokens, as a bidirectional layer reads them.
    needs = {"mask": "bidirectional"}

    def layer_matrices(self, trace: Trace) -> list[torch.Tensor]:
        return trace.memo(
            "effective.head_mean",
            lambda: [
                effective_attention(trace, layer).mean(dim=1) for layer in range(trace.num_layers)
            ],
        )

    def with_residual(
        self, matrix_BNK: torch.Tensor, mask_BN: torch.Tensor, ratio: float
    ) -> torch.Tensor:
        """(1 - r) A_eff + r I: A_eff's rows do not sum to 1, and rescaling them would blow up."""
        return mix_identity(matrix_BNK, mask_BN, ratio)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [EffectiveAttention()]
