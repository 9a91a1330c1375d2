"""The norm family's decomposition: Kobayashi et al. 2020, 2021 and GlobEnc (Modarressi 2022).

Public so that the built-in ``norm`` plugin and third-party norm variants share one computation:
``norm_family(trace)`` is memoised on the trace, so a variant that reads it costs no second
decomposition. Follows docs/math/attention-family.md, eqs. (4)-(13), after the official GlobEnc
code's conventions: for token i of one post-LN layer, with f^h(x_j) = (x_j W_V^h + b_V^h) W_O^h
(b_O dropped),

    z_ij = sum_h alpha^h_ij f^h(x_j)                       N_ij      = ||z_ij||
    r_ij = z_ij + [i = j] x_i                              N-Res_ij  = ||r_ij||
    y_ij = gamma1 (r_ij - mean(r_ij)) / sqrt(var(u1_i) + eps1)   N-ResLN_ij = ||y_ij||
    e_ij = gamma2 (y_ij - mean(y_ij)) / sqrt(var(u2_i) + eps2)   N-Enc_ij  = ||e_ij|| (GlobEnc)

with u1_i, u2_i the real pre-LayerNorm vectors (the FFN enters only through var(u2_i); beta1,
beta2 dropped).

A pre-LN block (GPT-2, LLaMA: docs/math/attention-family-pre-ln.md) reads N1(x_j) in f^h (the
captured values are already N1-applied) and keeps x_i as the residual; N-ResLN goes through
the first norm reading u1_i, N2 (g1 below is then N2's map), and N-Enc through the norm that
reads the block's output x'_i (the next block's N1, the final norm after the last block),
applied to r_ij directly: the second residual carries u1_i itself. RMSNorm maps do not centre.
With grouped-query attention, query head h reads the values of key/value head h // (H / H_kv).

How it is computed: every vector above is a linear map m applied to z_ij (plus x_i on the
diagonal), and m(z_ij) = sum_h alpha^h_ij m(f^h(x_j)). So off the diagonal
||m(z_ij)||^2 = alpha_ij^T G_j alpha_ij with the per-key Gram matrix G_j[h, g] =
<m(f^h(x_j)), m(f^g(x_j))>, an H x H matrix: no (n, n, d) tensor is ever formed, the largest
tensor is the size of the attention probabilities, and the cost is n^2 H^2 instead of n^2 H d.
The quadratic forms run in float64 (cancellation between heads would cost float32 digits); the
diagonal, where the residual enters, is computed from the vectors directly. All variants of a
layer come from this one computation, done once per batch and shared by the whole family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from attrib_bench.core.adapter import LayerNormParams
    from attrib_bench.core.trace import Trace

#: The trace fields the decomposition reads: a norm variant built on it declares these.
REQUIRES = frozenset({"attentions", "hidden_states", "values", "pre_layernorm"})
#: The capabilities the decomposition needs: none, as it serves post- and pre-LN blocks,
#: LayerNorm and RMSNorm, separate and fused Q/K/V, one or grouped key/value heads, any mask.
NEEDS: dict[str, str] = {}
#: The per-layer matrices ``layer_norms`` returns, by the names of the built-in methods.
VARIANTS = ("norm", "norm-res", "norm-resln", "globenc")


def _centered(v: torch.Tensor) -> torch.Tensor:
    return v - v.mean(dim=-1, keepdim=True)


def _inverse_std(u_BND: torch.Tensor, norm: LayerNormParams) -> torch.Tensor:
    """1 / sqrt(var(u_i) + eps) with the biased variance torch's LayerNorm uses, or for an
    RMSNorm 1 / sqrt(mean(u_i ** 2) + eps); (B, N, 1)."""
    if not norm.centred:
        return torch.rsqrt(u_BND.pow(2).mean(dim=-1, keepdim=True) + norm.eps)
    return torch.rsqrt(u_BND.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)


@dataclass
class LayerInputs:
    """What one layer's decomposition reads, prepared once per layer.

    g1 is the map of the first norm reading u1_i (post-LN: LN1; pre-LN: N2), g2 that of the
    norm N-Enc ends in (post-LN: LN2, after g1; pre-LN: the norm reading the block's output,
    on r directly), each with the frozen scale of its real input.
    """

    x_BND: torch.Tensor
    transformed_BHKD: torch.Tensor  # f^h(x_k) for every query head and key token
    attention_BHNK: torch.Tensor
    scale1_BN1: torch.Tensor
    scale2_BN1: torch.Tensor
    norm1: LayerNormParams
    norm2: LayerNormParams
    post_ln: bool

    def ln1_map(self, v: torch.Tensor) -> torch.Tensor:
        """The numerator of g1: gamma1 * (v - mean(v)) (RMSNorm: gamma1 * v);
        g1_i(v) = ln1_map(v) * scale1_i."""
        return _numerator(self.norm1, v)

    def enc_map(self, v: torch.Tensor) -> torch.Tensor:
        """The numerator of the N-Enc vector; e_i(v) = enc_map(v) * enc_scale_i."""
        return _numerator(self.norm2, self.ln1_map(v) if self.post_ln else v)

    def enc_scale(self, dtype: torch.dtype) -> torch.Tensor:
        """The N-Enc vector's scale in ``dtype``: scale1 * scale2 post-LN, scale2 pre-LN."""
        scale2_BN1 = self.scale2_BN1.to(dtype)
        return self.scale1_BN1.to(dtype) * scale2_BN1 if self.post_ln else scale2_BN1


def _numerator(norm: LayerNormParams, v: torch.Tensor) -> torch.Tensor:
    return norm.weight_D * (_centered(v) if norm.centred else v)


def layer_inputs(trace: Trace, layer: int) -> LayerInputs:
    """What layer ``layer``'s decomposition reads, from the trace and the layer's parameters."""
    adapter = trace.adapter
    params = adapter.layer_params(layer)
    values_BKHE = adapter.query_head_values(trace.values[layer])
    if adapter.spec.block == "post-ln":
        norm1, input1 = params.ln1, trace.pre_ln1[layer]
        norm2, input2 = params.ln2, trace.pre_ln2[layer]
    else:
        norm1, input1 = params.ln2, trace.pre_ln2[layer]
        norm2, input2 = adapter.output_norm(layer), trace.hidden_states[layer + 1]
    return LayerInputs(
        x_BND=trace.hidden_states[layer],
        transformed_BHKD=torch.einsum("bkhe,hed->bhkd", values_BKHE, params.output_weight_HED),
        attention_BHNK=trace.attentions[layer],
        scale1_BN1=_inverse_std(input1, norm1),
        scale2_BN1=_inverse_std(input2, norm2),
        norm1=norm1,
        norm2=norm2,
        post_ln=adapter.spec.block == "post-ln",
    )


def decompose(inputs: LayerInputs) -> dict[str, torch.Tensor]:
    """The decomposed vectors z, r, y, e, each (B, N, K, D), written out as in the spec.

    Memory grows as n^2 d: for inspection and tests; the attributors use the Gram form.
    """
    z_BNKD = torch.einsum("bhnk,bhkd->bnkd", inputs.attention_BHNK, inputs.transformed_BHKD)
    r_BNKD = z_BNKD.clone()
    own = torch.arange(z_BNKD.shape[1], device=z_BNKD.device)
    r_BNKD[:, own, own] += inputs.x_BND  # the residual, on the diagonal only
    y_BNKD = inputs.ln1_map(r_BNKD) * inputs.scale1_BN1[:, :, None]
    e_BNKD = inputs.enc_map(r_BNKD) * inputs.enc_scale(r_BNKD.dtype)[:, :, None]
    return {"z": z_BNKD, "r": r_BNKD, "y": y_BNKD, "e": e_BNKD}


def _mixed_norms(
    inputs: LayerInputs,
    attention_BKNH: torch.Tensor,
    linear_map: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """||linear_map(z_ij)|| for all i, j through per-key Gram matrices, (B, N, K) in float64.

    ``attention_BKNH`` is the attention in float64 with keys leading, so that the contraction
    with each key's Gram matrix is one batched matmul.
    """
    mapped_BHKD = linear_map(inputs.transformed_BHKD).double()
    gram_BKHG = torch.einsum("bhkd,bgkd->bkhg", mapped_BHKD, mapped_BHKD)
    squared_BKN = (torch.matmul(attention_BKNH, gram_BKHG) * attention_BKNH).sum(dim=-1)
    return squared_BKN.transpose(1, 2).clamp_min(0).sqrt()


def layer_norms(trace: Trace, layer: int) -> dict[str, torch.Tensor]:
    """The four (B, N, N) norm matrices of one layer and the N-Enc mixing ratio r_i (B, N)."""
    inputs = layer_inputs(trace, layer)
    dtype = inputs.x_BND.dtype
    scale1_BN1 = inputs.scale1_BN1.double()
    scale12_BN1 = inputs.enc_scale(torch.float64)
    diagonal_BHN = inputs.attention_BHNK.diagonal(dim1=-2, dim2=-1)
    own_BND = torch.einsum("bhn,bhnd->bnd", diagonal_BHN, inputs.transformed_BHKD) + inputs.x_BND
    attention_BKNH = inputs.attention_BHNK.double().permute(0, 3, 2, 1).contiguous()
    plain_BNK = _mixed_norms(inputs, attention_BKNH, lambda v: v)
    out = {"norm": plain_BNK, "norm-res": plain_BNK.clone()}
    out["norm-resln"] = _mixed_norms(inputs, attention_BKNH, inputs.ln1_map) * scale1_BN1
    out["globenc"] = _mixed_norms(inputs, attention_BKNH, inputs.enc_map) * scale12_BN1
    own_r_BN = own_BND.double().norm(dim=-1)
    own_y_BND = inputs.ln1_map(own_BND).double() * scale1_BN1
    own_e_BN = inputs.enc_map(own_BND).double().norm(dim=-1) * scale12_BN1[..., 0]
    for name, own_BN in (
        ("norm-res", own_r_BN),
        ("norm-resln", own_y_BND.norm(dim=-1)),
        ("globenc", own_e_BN),
    ):
        out[name].diagonal(dim1=-2, dim2=-1).copy_(own_BN)
    # r_i = ||sum_{j != i} y_ij|| / (||sum_{j != i} y_ij|| + ||y_ii||), with sum_j r_ij computed
    # as the attention output plus the residual.
    mixed_BND = torch.einsum("bhnk,bhkd->bnd", inputs.attention_BHNK, inputs.transformed_BHKD)
    total_y_BND = inputs.ln1_map(mixed_BND + inputs.x_BND).double() * scale1_BN1
    context_BN = (total_y_BND - own_y_BND).norm(dim=-1)
    ratio_BN = context_BN / (context_BN + own_y_BND.norm(dim=-1))
    result = {name: out[name].to(dtype) for name in VARIANTS}
    result["mixing_ratio"] = ratio_BN.to(dtype)
    return result


def norm_family(trace: Trace) -> list[dict[str, torch.Tensor]]:
    """Per layer, every variant's matrix: computed once per batch for the whole family."""
    return trace.memo(
        "norm.family", lambda: [layer_norms(trace, layer) for layer in range(trace.num_layers)]
    )
