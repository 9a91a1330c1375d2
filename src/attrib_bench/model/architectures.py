"""Where each model family keeps the parts the attention-family math needs, and what it offers.

Architecture knowledge is data: an ArchitectureSpec per family, contributed by plugins through the
``attrib_bench_architectures`` hook (the built-in BERT and RoBERTa families are such a plugin,
``attrib_bench_plugins.architectures``) and looked up by Hugging Face ``model_type``. A spec names
the modules (dotted paths, BERT's layout by default) and declares its capabilities (post- or
pre-LN blocks, LayerNorm or RMSNorm, separate or fused Q/K/V, grouped-query attention, how
position ids are built). An attributor that declares ``needs`` (capability -> value) is failed
with one line on a family that does not offer them, before it runs.

Positions differ by family: BERT and ELECTRA number tokens 0..N-1, RoBERTa and its descendants
from the non-padding tokens (``padding_idx + 1`` onwards, padding at ``padding_idx``), so that
replacing a token by the pad token moves every later token's position. ``position_ids`` gives
the positions of an unmodified input, which callers that replace tokens pass explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attrib_bench.core.architecture_spec import CAPABILITIES, ArchitectureSpec
from attrib_bench.core.errors import UsageError


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
    """The neutral per-layer view of an encoder described by an ArchitectureSpec.

    Modules and weights are read from the live model on every access, never cached: weights
    converted (``model.double()``, ``model.to(device)``), re-initialised in place or replaced
    are what the next read sees.
    """

    def __init__(self, model: nn.Module, spec: ArchitectureSpec):
        self.model = model
        self.spec = spec
        self.num_heads: int = model.config.num_attention_heads

    @property
    def embeddings(self) -> nn.Module:
        return _get(self.model.base_model, self.spec.embeddings)

    @property
    def layers(self) -> list[nn.Module]:
        return list(_get(self.model.base_model, self.spec.layers))

    def module(self, layer: int, part: str) -> nn.Module:
        """The submodule ``part`` (a path field of ArchitectureSpec) of encoder layer ``layer``."""
        return _get(self.model.base_model, f"{self.spec.layers}.{layer}.{getattr(self.spec, part)}")

    def position_ids(self, input_ids_BN: torch.Tensor) -> torch.Tensor:
        """The position ids (B, N) the model derives for this input when given none.

        Computed on the unmodified input and passed explicitly with an input whose tokens were
        replaced (by [PAD], a baseline), they keep every other token's position embedding.
        """
        if self.spec.positions == "after_padding":
            embeddings = self.embeddings
            create = getattr(embeddings, "create_position_ids_from_input_ids", None)
            if create is None:  # transformers < 5 keeps it as a module-level function
                from transformers.models.roberta.modeling_roberta import (
                    create_position_ids_from_input_ids as create,
                )
            return create(input_ids_BN, embeddings.padding_idx)
        positions_N = torch.arange(input_ids_BN.shape[1], device=input_ids_BN.device)
        return positions_N.expand_as(input_ids_BN)

    def layer_params(self, layer: int) -> LayerParams:
        """Layer ``layer``'s weights, split by head, from the modules as they are now."""
        value = self.module(layer, "value")
        out = self.module(layer, "attention_output")
        heads = self.num_heads
        head_dim = value.out_features // heads
        d_model = value.in_features
        return LayerParams(
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


def adapter_for(model: nn.Module, architectures: Mapping[str, ArchitectureSpec]) -> EncoderAdapter:
    """The adapter for the model's family, or a UsageError naming the families there are."""
    model_type = model.config.model_type
    if model_type not in architectures:
        raise UsageError(
            f"no architecture adapter for model type {model_type!r}; supported: "
            + ", ".join(sorted(architectures))
            + " (a plugin adds one through the attrib_bench_architectures hook)"
        )
    return EncoderAdapter(model, architectures[model_type])


def unmet_needs(attributor: Any, adapter: EncoderAdapter) -> str | None:
    """The one line saying why ``attributor`` cannot run on this family, or None if it can."""
    needs = getattr(attributor, "needs", {})
    spec = adapter.spec
    unmet = [c for c, value in needs.items() if getattr(spec, c) != value]
    if not unmet:
        return None
    wanted = ", ".join(CAPABILITIES[c][needs[c]] for c in unmet)
    offered = ", ".join(CAPABILITIES[c][getattr(spec, c)] for c in unmet)
    return (
        f"{attributor.name} cannot run on model type {adapter.model.config.model_type!r}: "
        f"it needs {wanted}; the adapter offers {offered}"
    )
