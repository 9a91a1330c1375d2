"""Where each model family keeps the parts the attention-family math needs.

Architecture knowledge is data: one table row per Hugging Face ``model_type``. All families
listed are post-LayerNorm encoders laid out like BERT (``encoder.layer[i]`` with
``attention.self.value``, ``attention.output.dense``, ``attention.output.LayerNorm`` and
``output.LayerNorm``), so one adapter serves them all. A family with another layout (DistilBERT's
``q_lin``, pre-LN models) needs its own row or adapter, not changes to the math.

Positions differ by family: BERT and ELECTRA number tokens 0..N-1, RoBERTa and its descendants
from the non-padding tokens (``padding_idx + 1`` onwards, padding at ``padding_idx``), so that
replacing a token by the pad token moves every later token's position. ``position_ids`` gives
the positions of an unmodified input, which callers that replace tokens pass explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attrib_bench.errors import UsageError


@dataclass(frozen=True)
class ArchitectureSpec:
    """Dotted attribute paths, relative to ``model.base_model`` and to each encoder layer."""

    embeddings: str = "embeddings"
    layers: str = "encoder.layer"
    value: str = "attention.self.value"
    attention_output: str = "attention.output.dense"
    ln1: str = "attention.output.LayerNorm"
    ln2: str = "output.LayerNorm"
    #: "absolute": positions 0..N-1; "after_padding": RoBERTa's, counted over non-pad tokens.
    positions: str = "absolute"


POST_LN_BERT = ArchitectureSpec()
POST_LN_ROBERTA = ArchitectureSpec(positions="after_padding")

ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "bert": POST_LN_BERT,
    "roberta": POST_LN_ROBERTA,
    "xlm-roberta": POST_LN_ROBERTA,
    "camembert": POST_LN_ROBERTA,
    "electra": POST_LN_BERT,
}


@dataclass(frozen=True)
class LayerNormParams:
    weight_D: torch.Tensor
    bias_D: torch.Tensor
    eps: float


@dataclass(frozen=True)
class LayerParams:
    """One encoder layer's weights in the neutral view, heads split out.

    ``value_weight_HDE``/``value_bias_HE`` map the layer input x to head h's value vectors
    (v = x W_V^h + b_V^h); ``output_weight_HED`` is head h's slice W_O^h of the attention output
    projection (nn.Linear stores [out, in], so the slice is taken on the transposed weight).
    """

    num_heads: int
    head_dim: int
    value_weight_HDE: torch.Tensor
    value_bias_HE: torch.Tensor
    output_weight_HED: torch.Tensor
    output_bias_D: torch.Tensor
    ln1: LayerNormParams
    ln2: LayerNormParams


def _get(root: nn.Module, path: str) -> nn.Module:
    module = root
    for part in path.split("."):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


def _layer_norm(module: nn.Module) -> LayerNormParams:
    return LayerNormParams(module.weight.detach(), module.bias.detach(), float(module.eps))


class EncoderAdapter:
    """Gives the neutral per-layer view of a post-LN encoder described by an ArchitectureSpec."""

    def __init__(self, model: nn.Module, spec: ArchitectureSpec):
        self.model = model
        self.spec = spec
        base = model.base_model
        self.embeddings: nn.Module = _get(base, spec.embeddings)
        self.layers: list[nn.Module] = list(_get(base, spec.layers))
        self.num_heads: int = model.config.num_attention_heads
        self._params: dict[int, LayerParams] = {}

    def module(self, layer: int, part: str) -> nn.Module:
        """The submodule ``part`` (a field of ArchitectureSpec) of encoder layer ``layer``."""
        return _get(self.layers[layer], getattr(self.spec, part))

    def position_ids(self, input_ids_BN: torch.Tensor) -> torch.Tensor:
        """The position ids (B, N) the model derives for this input when given none.

        Computed on the unmodified input and passed explicitly with an input whose tokens were
        replaced (by [PAD], a baseline), they keep every other token's position embedding.
        """
        if self.spec.positions == "after_padding":
            create = getattr(self.embeddings, "create_position_ids_from_input_ids", None)
            if create is None:  # transformers < 5 keeps it as a module-level function
                from transformers.models.roberta.modeling_roberta import (
                    create_position_ids_from_input_ids as create,
                )
            return create(input_ids_BN, self.embeddings.padding_idx)
        positions_N = torch.arange(input_ids_BN.shape[1], device=input_ids_BN.device)
        return positions_N.expand_as(input_ids_BN)

    def layer_params(self, layer: int) -> LayerParams:
        if layer not in self._params:
            value = self.module(layer, "value")
            out = self.module(layer, "attention_output")
            heads = self.num_heads
            head_dim = value.out_features // heads
            d_model = value.in_features
            self._params[layer] = LayerParams(
                num_heads=heads,
                head_dim=head_dim,
                value_weight_HDE=value.weight.detach()
                .T.reshape(d_model, heads, head_dim)
                .permute(1, 0, 2)
                .contiguous(),
                value_bias_HE=value.bias.detach().reshape(heads, head_dim),
                output_weight_HED=out.weight.detach().T.reshape(heads, head_dim, -1).contiguous(),
                output_bias_D=out.bias.detach(),
                ln1=_layer_norm(self.module(layer, "ln1")),
                ln2=_layer_norm(self.module(layer, "ln2")),
            )
        return self._params[layer]


def adapter_for(model: nn.Module) -> EncoderAdapter:
    model_type = model.config.model_type
    if model_type not in ARCHITECTURES:
        raise UsageError(
            f"no architecture adapter for model type {model_type!r}; supported: "
            + ", ".join(sorted(ARCHITECTURES))
            + " (add a row to attrib_bench.model.architectures.ARCHITECTURES)"
        )
    return EncoderAdapter(model, ARCHITECTURES[model_type])
