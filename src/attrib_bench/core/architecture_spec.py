"""What a model family declares: its modules and capabilities (``ArchitectureSpec``), and the
capabilities an attributor may need.

A plain data type that plugins return from the ``attrib_bench_architectures`` hook; the adapter
that reads a model through a spec is ``attrib_bench.core.adapter.EncoderAdapter``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The capabilities a spec declares and an attributor may need: each one's values, worded as an
#: error message names them.
CAPABILITIES: dict[str, dict[str, str]] = {
    "block": {"post-ln": "post-LN blocks", "pre-ln": "pre-LN blocks"},
    "norm": {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"},
    "qkv": {"separate": "separate Q/K/V projections", "fused": "a fused QKV projection"},
    "heads": {
        "multi-head": "one key/value head per query head",
        "grouped-query": "grouped-query attention",
    },
    "mask": {"bidirectional": "bidirectional attention", "causal": "causal attention"},
    "positions": {
        "absolute": "absolute positions",
        "after_padding": "positions counted after the padding index",
        "rotary": "rotary positions",
    },
}


@dataclass(frozen=True)
class ArchitectureSpec:
    """One model family: the Hugging Face ``model_type``s it serves, its modules, its capabilities.

    Paths are dotted attribute paths relative to ``model.base_model`` (``embeddings``, ``layers``)
    and to each layer (the rest). ``ln1`` is the norm of the attention sublayer (after it in a
    post-LN block, before it in a pre-LN one), ``ln2`` that of the feed-forward sublayer.
    ``positions``: "absolute" and "rotary" number tokens 0..N-1, "after_padding" counts them
    RoBERTa's way, over the non-pad tokens. ``shared_layer``: ``layers`` is the path of one
    layer module that the encoder applies ``config.num_hidden_layers`` times (ALBERT).
    ``final_norm`` (pre-LN only, where it is required): the norm after the last block, from
    ``model.base_model``; it reads the last block's output as each block's ``ln1`` reads the
    one before. ``qkv="fused"``: ``value`` is one projection whose output is queries, keys and
    values in that order. ``heads="grouped-query"``: the model's config says how many key/value
    heads there are (``num_key_value_heads``), so whether a model groups is its own property.
    """

    model_types: tuple[str, ...]
    embeddings: str = "embeddings"
    layers: str = "encoder.layer"
    shared_layer: bool = False
    value: str = "attention.self.value"
    attention_output: str = "attention.output.dense"
    ln1: str = "attention.output.LayerNorm"
    ln2: str = "output.LayerNorm"
    block: str = "post-ln"
    norm: str = "layernorm"
    qkv: str = "separate"
    heads: str = "multi-head"
    mask: str = "bidirectional"
    positions: str = "absolute"
    final_norm: str = ""
    #: The token whose row a default run explains (``--target position=auto``): "first" for
    #: [CLS]-reading encoders, "last" for decoders that read each example's last real token.
    target_position: str = "first"

    def problem(self) -> str | None:
        """Why this spec cannot be registered, or None: checked when plugins are loaded."""
        if isinstance(self.model_types, str) or not self.model_types:
            return f"model_types must be a non-empty tuple of model types, got {self.model_types!r}"
        if not isinstance(self.shared_layer, bool):
            return f"shared_layer must be True or False, got {self.shared_layer!r}"
        for capability, values in CAPABILITIES.items():
            value = getattr(self, capability)
            if value not in values:
                return f"{capability}={value!r} is not one of {', '.join(values)}"
        if not isinstance(self.final_norm, str) or bool(self.final_norm) != (
            self.block == "pre-ln"
        ):
            return (
                f"final_norm={self.final_norm!r}: a pre-LN family names the norm after its "
                "last block (as ln_f of GPT-2), a post-LN one none"
            )
        if self.target_position not in ("first", "last"):
            return f"target_position={self.target_position!r} is not one of first, last"
        return None


def needs_problem(needs: Mapping[str, str]) -> str | None:
    """Why an attributor's ``needs`` names no real capability, or None."""
    for capability, value in needs.items():
        if capability not in CAPABILITIES:
            return f"unknown capability {capability!r}; valid: {', '.join(CAPABILITIES)}"
        if value not in CAPABILITIES[capability]:
            return f"{capability}={value!r} is not one of {', '.join(CAPABILITIES[capability])}"
    return None
