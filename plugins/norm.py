"""Norm-based attribution (Kobayashi et al. 2020, 2021) and GlobEnc (Modarressi et al. 2022).

Follows ../shared/specs/attention-family.md, which takes the official GlobEnc code's conventions:
for token i of one post-LN layer, with f^h(x_j) = (x_j W_V^h + b_V^h) W_O^h (b_O dropped),

    z_ij = sum_h alpha^h_ij f^h(x_j)                       N_ij      = ||z_ij||
    r_ij = z_ij + [i = j] x_i                              N-Res_ij  = ||r_ij||
    y_ij = gamma1 (r_ij - mean(r_ij)) / sqrt(var(u1_i) + eps1)   N-ResLN_ij = ||y_ij||
    e_ij = gamma2 (y_ij - mean(y_ij)) / sqrt(var(u2_i) + eps2)   N-Enc_ij  = ||e_ij|| (GlobEnc)

with u1_i, u2_i the real pre-LayerNorm vectors (the FFN enters only through var(u2_i); beta1,
beta2 dropped). All variants come from one pass over each layer, computed once per batch and
shared by the family; z is formed for a chunk of query rows at a time, never as (H, n, n, d).
Rollout of N, N-Res, N-ResLN and N-Enc uses no row normalisation and no identity (official code);
``normalize_rows=true`` rescales rows first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace, UsageError
from attrib_bench.aggregation import fixed_residual, layerwise_attribution, normalize_rows
from attrib_bench_plugins.attention import head_mean_attention

REQUIRES = frozenset({"attentions", "hidden_states", "values", "pre_layernorm"})
#: Upper bound on the elements of one (B, q, N, D) chunk of z (about 64 MB in float32).
CHUNK_ELEMENTS = 16 * 1024 * 1024
VARIANTS = ("norm", "norm-res", "norm-resln", "globenc")


def _centered(v: torch.Tensor) -> torch.Tensor:
    return v - v.mean(dim=-1, keepdim=True)


def _inverse_std(u_BND: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(var(u_i) + eps) with the biased variance torch's LayerNorm uses; (B, N, 1)."""
    return torch.rsqrt(u_BND.var(dim=-1, unbiased=False, keepdim=True) + eps)


@dataclass
class LayerInputs:
    """What one layer's decomposition reads, prepared once per layer."""

    x_BND: torch.Tensor
    transformed_BHKD: torch.Tensor  # f^h(x_k) for every head and key token
    attention_BHNK: torch.Tensor
    scale1_BN1: torch.Tensor
    scale2_BN1: torch.Tensor
    gamma1_D: torch.Tensor
    gamma2_D: torch.Tensor


def layer_inputs(trace: Trace, layer: int) -> LayerInputs:
    params = trace.adapter.layer_params(layer)
    values_BKHE = trace.values[layer].unflatten(-1, (params.num_heads, params.head_dim))
    return LayerInputs(
        x_BND=trace.hidden_states[layer],
        transformed_BHKD=torch.einsum("bkhe,hed->bhkd", values_BKHE, params.output_weight_HED),
        attention_BHNK=trace.attentions[layer],
        scale1_BN1=_inverse_std(trace.pre_ln1[layer], params.ln1.eps),
        scale2_BN1=_inverse_std(trace.pre_ln2[layer], params.ln2.eps),
        gamma1_D=params.ln1.weight_D,
        gamma2_D=params.ln2.weight_D,
    )


def decompose(inputs: LayerInputs, rows: slice) -> dict[str, torch.Tensor]:
    """The decomposed vectors z, r, y, e (each (B, q, N, D)) of the query rows ``rows``."""
    start, q = rows.start, rows.stop - rows.start
    z_BQKD = torch.einsum(
        "bhqk,bhkd->bqkd", inputs.attention_BHNK[:, :, rows], inputs.transformed_BHKD
    )
    r_BQKD = z_BQKD.clone()
    own = torch.arange(q, device=z_BQKD.device)
    r_BQKD[:, own, own + start] += inputs.x_BND[:, rows]  # the residual, on the diagonal only
    y_BQKD = inputs.gamma1_D * _centered(r_BQKD) * inputs.scale1_BN1[:, rows, None]
    e_BQKD = inputs.gamma2_D * _centered(y_BQKD) * inputs.scale2_BN1[:, rows, None]
    return {"z": z_BQKD, "r": r_BQKD, "y": y_BQKD, "e": e_BQKD}


def query_chunks(tokens: int, batch: int, hidden: int) -> list[slice]:
    """Query-row chunks small enough that one (B, q, N, D) tensor stays under CHUNK_ELEMENTS."""
    step = max(1, CHUNK_ELEMENTS // max(1, batch * tokens * hidden))
    return [slice(s, min(tokens, s + step)) for s in range(0, tokens, step)]


def layer_norms(trace: Trace, layer: int) -> dict[str, torch.Tensor]:
    """The four (B, N, N) norm matrices of one layer and the N-Enc mixing ratio r_i (B, N)."""
    inputs = layer_inputs(trace, layer)
    batch, tokens, hidden = inputs.x_BND.shape
    like = {"dtype": inputs.x_BND.dtype, "device": inputs.x_BND.device}
    out = {name: torch.zeros(batch, tokens, tokens, **like) for name in VARIANTS}
    ratio_BN = torch.zeros(batch, tokens, **like)
    for rows in query_chunks(tokens, batch, hidden):
        vectors = decompose(inputs, rows)
        for name, key in zip(VARIANTS, ("z", "r", "y", "e"), strict=True):
            out[name][:, rows] = vectors[key].norm(dim=-1)
        own = torch.arange(rows.stop - rows.start, device=ratio_BN.device)
        own_BQD = vectors["y"][:, own, own + rows.start]
        context_BQ = (vectors["y"].sum(dim=2) - own_BQD).norm(dim=-1)
        ratio_BN[:, rows] = context_BQ / (context_BQ + own_BQD.norm(dim=-1))
    out["mixing_ratio"] = ratio_BN
    return out


def norm_family(trace: Trace) -> list[dict[str, torch.Tensor]]:
    """Per layer, every variant's matrix: computed once per batch for the whole family."""
    return trace.memo(
        "norm.family", lambda: [layer_norms(trace, layer) for layer in range(trace.num_layers)]
    )


class NormVariant(Configurable):
    """One of N, N-Res, N-ResLN, N-Enc: its per-layer matrix, rolled out as is."""

    requires = REQUIRES
    parameters = {"normalize_rows": False}

    def __init__(self, name: str, description: str):
        super().__init__()
        self.name = name
        self.description = description

    def attribute(self, trace: Trace) -> Attribution:
        matrices = [layer[self.name] for layer in norm_family(trace)]
        return layerwise_attribution(matrices, trace.mask_BN, self.params["normalize_rows"])


class NormFixedResidual(Configurable):
    """N-FixedRes: (1 - r) N / rowsum(N) + r I, r = residual = 0.5 by default."""

    name = "norm-fixedres"
    description = "N-FixedRes: (1 - r) * row-normalised N + r * I, r = residual = 0.5"
    requires = REQUIRES
    parameters = {"residual": 0.5}

    def validate(self) -> None:
        if not 0.0 <= self.params["residual"] < 1.0:
            raise UsageError(f"{self.name}:residual must be in [0, 1), got {self.params}")

    def attribute(self, trace: Trace) -> Attribution:
        ratio = self.params["residual"]
        matrices = [
            fixed_residual(layer["norm"], trace.mask_BN, ratio) for layer in norm_family(trace)
        ]
        return layerwise_attribution(matrices, trace.mask_BN)


class AttentionResidual(Configurable):
    """W-Res: attention off the diagonal scaled by GlobEnc's mixing ratio r_i, 1 - r_i on it."""

    name = "attention-res"
    description = "W-Res: raw attention with GlobEnc's per-token residual ratio"
    requires = REQUIRES

    def attribute(self, trace: Trace) -> Attribution:
        matrices = []
        for attention_BNK, layer in zip(
            head_mean_attention(trace), norm_family(trace), strict=True
        ):
            eye = torch.diag_embed(trace.mask_BN.to(attention_BNK.dtype))
            context_BNK = normalize_rows(attention_BNK * (1 - eye))
            ratio_BN1 = layer["mixing_ratio"][..., None]
            matrices.append(ratio_BN1 * context_BNK + (1 - ratio_BN1) * eye)
        return layerwise_attribution(matrices, trace.mask_BN)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [
        NormVariant("norm", "N (Kobayashi 2020): ||sum_h alpha f(x_j)||, rolled out unnormalised"),
        NormVariant("norm-res", "N-Res: norm-based with the residual on the diagonal"),
        NormVariant("norm-resln", "N-ResLN: N-Res decomposed through LayerNorm 1"),
        NormVariant("globenc", "GlobEnc / N-Enc (Modarressi 2022): through both LayerNorms"),
        NormFixedResidual(),
        AttentionResidual(),
    ]
