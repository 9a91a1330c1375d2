"""Norm-based attribution (Kobayashi et al. 2020, 2021) and GlobEnc (Modarressi et al. 2022).

The per-layer matrices N, N-Res, N-ResLN and N-Enc (GlobEnc) and GlobEnc's mixing ratio come
from ``attrib_bench.toolkit.norm_decomposition`` (docs/math/attention-family.md, eqs. (4)-(11) for
post-LN encoders, docs/math/attention-family-pre-ln.md for pre-LN decoders), computed once per batch
for the whole family. Rollout of N, N-Res, N-ResLN and N-Enc uses no row
normalisation and no identity (official GlobEnc code); ``normalize_rows=true`` rescales rows
first.
"""

from __future__ import annotations

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace
from attrib_bench.toolkit.aggregation import fixed_residual, layerwise_attribution, normalize_rows
from attrib_bench.toolkit.attention_family import head_mean_attention
from attrib_bench.toolkit.norm_decomposition import NEEDS, REQUIRES, norm_family

#: The official GlobEnc notebook's eight methods, by their attrib-bench names.
GLOBENC_EIGHT = (
    "attention",
    "rollout",
    "norm",
    "norm-res",
    "norm-resln",
    "globenc",
    "norm-fixedres",
    "attention-res",
)


class NormVariant(Configurable):
    """One of N, N-Res, N-ResLN, N-Enc: its per-layer matrix, rolled out as is.

    Reference: Kobayashi et al. 2020, "Attention is Not Only a Weight: Analyzing Transformers
    with Vector Norms", EMNLP (norm); Kobayashi et al. 2021, "Incorporating Residual and
    Normalization Layers into Analysis of Masked Language Models", EMNLP (norm-res,
    norm-resln); Modarressi et al. 2022, "GlobEnc: Quantifying Global Token Attribution by
    Incorporating the Whole Encoder Layer in Transformers", NAACL (globenc).
    """

    requires = REQUIRES
    needs = NEEDS
    family = "norm-based"
    parameters = {"normalize_rows": False}
    parameter_docs = {
        "normalize_rows": "rescale each layer's rows to sum 1 before the rollout (it changes "
        "rankings); false, the official GlobEnc code's, rolls the matrices out as they are",
    }

    def __init__(self, name: str, description: str):
        super().__init__()
        self.name = name
        self.description = description

    def attribute(self, trace: Trace) -> Attribution:
        matrices = [layer[self.name] for layer in norm_family(trace)]
        return layerwise_attribution(
            matrices, trace.mask_BN, self.params["normalize_rows"], trace.target_positions_B
        )


class NormFixedResidual(Configurable):
    """N-FixedRes: (1 - r) N / rowsum(N) + r I, r = residual = 0.5 by default.

    Reference: Modarressi et al. 2022, "GlobEnc: Quantifying Global Token Attribution by
    Incorporating the Whole Encoder Layer in Transformers", NAACL
    (N-FixedRes, one of the eight methods it compares: Kobayashi et al. 2020's N with the fixed
    residual of Abnar & Zuidema 2020's rollout).
    """

    name = "norm-fixedres"
    description = "N-FixedRes: (1 - r) * row-normalised N + r * I, r = residual = 0.5"
    requires = REQUIRES
    needs = NEEDS
    family = "norm-based"
    parameters = {"residual": 0.5}
    parameter_docs = {
        "residual": "share r of the identity, (1 - r) N / rowsum(N) + r I per layer; in [0, 1)",
    }

    def validate(self) -> None:
        if not 0.0 <= self.params["residual"] < 1.0:
            raise self.out_of_range("residual", "in [0, 1)")

    def attribute(self, trace: Trace) -> Attribution:
        ratio = self.params["residual"]
        matrices = [
            fixed_residual(layer["norm"], trace.mask_BN, ratio) for layer in norm_family(trace)
        ]
        return layerwise_attribution(matrices, trace.mask_BN, positions_B=trace.target_positions_B)


class AttentionResidual(Configurable):
    """W-Res: attention off the diagonal scaled by GlobEnc's mixing ratio r_i, 1 - r_i on it.

    Reference: Modarressi et al. 2022, "GlobEnc: Quantifying Global Token Attribution by
    Incorporating the Whole Encoder Layer in Transformers", NAACL
    (W-Res, one of the eight methods it compares; the mixing ratio after Kobayashi et al. 2021).
    """

    name = "attention-res"
    description = "W-Res: raw attention with GlobEnc's per-token residual ratio"
    requires = REQUIRES
    needs = NEEDS
    family = "attention"

    def attribute(self, trace: Trace) -> Attribution:
        matrices = []
        for attention_BNK, layer in zip(
            head_mean_attention(trace), norm_family(trace), strict=True
        ):
            eye = torch.diag_embed(trace.mask_BN.to(attention_BNK.dtype))
            context_BNK = normalize_rows(attention_BNK * (1 - eye))
            ratio_BN1 = layer["mixing_ratio"][..., None]
            matrices.append(ratio_BN1 * context_BNK + (1 - ratio_BN1) * eye)
        return layerwise_attribution(matrices, trace.mask_BN, positions_B=trace.target_positions_B)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [
        NormVariant("norm", "N (Kobayashi 2020): ||sum_h alpha f(x_j)||, rolled out unnormalised"),
        NormVariant("norm-res", "N-Res: norm-based with the residual on the diagonal"),
        NormVariant(
            "norm-resln", "N-ResLN: N-Res decomposed through the norm after the attention residual"
        ),
        NormVariant(
            "globenc", "GlobEnc / N-Enc (Modarressi 2022): on to the norm reading the block output"
        ),
        NormFixedResidual(),
        AttentionResidual(),
    ]
