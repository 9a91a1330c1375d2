"""Where each model family keeps the parts the attention-family math needs, and what it offers.

Architecture knowledge is data: an ArchitectureSpec per family, contributed by plugins through the
``attrib_bench_architectures`` hook (the built-in families are such a plugin,
``attrib_bench_plugins.architectures``) and looked up by Hugging Face ``model_type``. A spec names
the modules (dotted paths, BERT's layout by default; one layer applied L times for ALBERT) and
declares its capabilities (post- or pre-LN blocks, LayerNorm or RMSNorm, separate or fused Q/K/V,
grouped-query attention, causal masks, how position ids are built). An attributor that declares
``needs`` (capability -> value) is failed with one line on a family that does not offer them,
before it runs; whether a model groups its key/value heads is read from its config
(``EncoderAdapter.offered``).

Positions differ by family: BERT and ELECTRA number tokens 0..N-1, RoBERTa and its descendants
from the non-padding tokens (``padding_idx + 1`` onwards, padding at ``padding_idx``), so that
replacing a token by the pad token moves every later token's position. ``position_ids`` gives
the positions of an unmodified input, which callers that replace tokens pass explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from attrib_bench.core.architecture_spec import CAPABILITIES, ArchitectureSpec
from attrib_bench.core.errors import UsageError
from attrib_bench.core.plugin_info import attributor_info


@dataclass(frozen=True)
class LayerNormParams:
    """A LayerNorm, or with ``centred`` False an RMSNorm: no mean subtracted, the root mean
    square in place of the standard deviation, and no bias (``bias_D`` is zeros)."""

    weight_D: torch.Tensor
    bias_D: torch.Tensor
    eps: float
    centred: bool = True


@dataclass(frozen=True)
class LayerParams:
    """One encoder layer's weights in the neutral view, heads split out.

    ``value_weight_HDE``/``value_bias_HE`` map what the value projection reads (the layer input
    x; in a pre-LN block N1(x)) to the value vectors of each of the ``num_kv_heads`` key/value
    heads (v = x W_V^g + b_V^g; zero bias where the model has none); query head h reads key/value
    head h // (num_heads / num_kv_heads). ``output_weight_HED`` is query head h's slice W_O^h of
    the attention output projection, taken on its (in, out) weight.
    """

    num_heads: int
    num_kv_heads: int
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


def _in_out(module: nn.Module) -> torch.Tensor:
    """A projection's weight as (in, out): transformers' Conv1D (GPT-2) stores it so and
    computes x W + b; nn.Linear stores (out, in)."""
    from transformers.pytorch_utils import Conv1D  # `attrib-bench list` imports this module

    weight = module.weight.detach()
    return weight if isinstance(module, Conv1D) else weight.T


def _bias(module: nn.Module, width: int, like: torch.Tensor) -> torch.Tensor:
    """A projection's bias; zeros for one without (LLaMA's)."""
    bias = getattr(module, "bias", None)
    return like.new_zeros(width) if bias is None else bias.detach()


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
    def num_kv_heads(self) -> int:
        """Key/value heads: the config's ``num_key_value_heads`` in a grouped-query family."""
        if self.spec.heads == "grouped-query":
            return getattr(self.model.config, "num_key_value_heads", None) or self.num_heads
        return self.num_heads

    @property
    def offered(self) -> ArchitectureSpec:
        """The spec as this model has it: a grouped-query family's model with as many key/value
        heads as query heads (Llama 2 7B) offers one key/value head per query head."""
        if self.spec.heads == "grouped-query" and self.num_kv_heads == self.num_heads:
            return replace(self.spec, heads="multi-head")
        return self.spec

    @property
    def embeddings(self) -> nn.Module:
        return _get(self.model.base_model, self.spec.embeddings)

    @property
    def layers(self) -> list[nn.Module]:
        """The distinct encoder layer modules, in order. Hook each once: a shared layer's hooks
        fire on each of its applications, giving one capture per layer, in order."""
        found = _get(self.model.base_model, self.spec.layers)
        if not self.spec.shared_layer:
            return list(found)
        copies = sum(type(module) is type(found) for module in self.model.base_model.modules())
        if copies != 1:  # ALBERT with num_hidden_groups or inner_group_num > 1
            raise UsageError(
                f"model type {self.model.config.model_type!r} shares one layer "
                f"({self.spec.layers}), but this model has {copies} {type(found).__name__} "
                "modules: several shared layers are not supported"
            )
        return [found]

    @property
    def layer_sequence(self) -> list[nn.Module]:
        """The module computing each encoder layer, in the order they run: a shared layer
        appears ``config.num_hidden_layers`` times. What running the layers one by one calls."""
        layers = self.layers
        return layers * self.model.config.num_hidden_layers if self.spec.shared_layer else layers

    def module(self, layer: int, part: str) -> nn.Module:
        """The submodule ``part`` (a path field of ArchitectureSpec) of encoder layer ``layer``."""
        return _get(self.layer_sequence[layer], getattr(self.spec, part))

    @property
    def final_norm(self) -> nn.Module:
        """The norm after the last block of a pre-LN model (the spec's ``final_norm``)."""
        return _get(self.model.base_model, self.spec.final_norm)

    def value_vectors(self, output_BNX: torch.Tensor) -> torch.Tensor:
        """The value vectors (B, N, H_kv * E) in the output of the ``value`` module: all of it,
        or a fused projection's last H_kv / (H + 2 H_kv) (queries, keys, values in turn)."""
        if self.spec.qkv == "separate":
            return output_BNX
        width = output_BNX.shape[-1]
        share = width * self.num_kv_heads // (self.num_heads + 2 * self.num_kv_heads)
        return output_BNX[..., width - share :].contiguous()  # not a view holding Q and K

    def query_head_values(self, values_BNX: torch.Tensor) -> torch.Tensor:
        """Value vectors per query head, (B, N, H, E): query head h reads key/value head
        h // (H / H_kv), as Hugging Face's ``repeat_kv``."""
        values_BNGE = values_BNX.unflatten(-1, (self.num_kv_heads, -1))
        groups = self.num_heads // self.num_kv_heads
        return values_BNGE if groups == 1 else values_BNGE.repeat_interleave(groups, dim=2)

    def norm_params(self, module: nn.Module) -> LayerNormParams:
        """A norm's parameters; an RMSNorm family's without centring or bias."""
        weight = module.weight.detach()
        bias = getattr(module, "bias", None)
        eps = module.eps if hasattr(module, "eps") else module.variance_epsilon  # HF's RMSNorms
        return LayerNormParams(
            weight_D=weight,
            bias_D=weight.new_zeros(weight.shape) if bias is None else bias.detach(),
            eps=float(eps),
            centred=self.spec.norm == "layernorm",
        )

    def output_norm(self, layer: int) -> LayerNormParams:
        """In a pre-LN model, the norm that reads layer ``layer``'s output: the next block's
        ``ln1``, the final norm after the last block."""
        if layer + 1 < len(self.layer_sequence):
            return self.norm_params(self.module(layer + 1, "ln1"))
        return self.norm_params(self.final_norm)

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
        heads, kv_heads = self.num_heads, self.num_kv_heads
        weight_DX = _in_out(value)
        bias_X = _bias(value, weight_DX.shape[1], weight_DX)
        weight_DV = self.value_vectors(weight_DX)  # the value columns of a fused projection
        bias_V = self.value_vectors(bias_X)
        d_model, head_dim = weight_DV.shape[0], weight_DV.shape[1] // kv_heads
        output_weight = _in_out(out)
        return LayerParams(
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            value_weight_HDE=weight_DV.reshape(d_model, kv_heads, head_dim)
            .permute(1, 0, 2)
            .contiguous(),
            value_bias_HE=bias_V.reshape(kv_heads, head_dim),
            output_weight_HED=output_weight.reshape(heads, head_dim, -1).contiguous(),
            output_bias_D=_bias(out, output_weight.shape[1], output_weight),
            ln1=self.norm_params(self.module(layer, "ln1")),
            ln2=self.norm_params(self.module(layer, "ln2")),
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


def unmet_capabilities(attributor: Any, spec: ArchitectureSpec) -> list[str]:
    """The capabilities ``attributor`` needs that the family of ``spec`` does not offer."""
    needs = attributor_info(attributor).needs or {}
    return [c for c, value in needs.items() if getattr(spec, c) != value]


def unmet_needs(attributor: Any, adapter: EncoderAdapter) -> str | None:
    """The one line saying why ``attributor`` cannot run on this family, or None if it can."""
    needs = attributor_info(attributor).needs or {}
    spec = adapter.offered
    unmet = unmet_capabilities(attributor, spec)
    if not unmet:
        return None
    wanted = ", ".join(CAPABILITIES[c][needs[c]] for c in unmet)
    offered = ", ".join(CAPABILITIES[c][getattr(spec, c)] for c in unmet)
    return (
        f"{attributor.name} cannot run on model type {adapter.model.config.model_type!r}: "
        f"it needs {wanted}; the adapter offers {offered}"
    )
