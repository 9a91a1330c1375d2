"""What a model family declares: its modules and capabilities (``ArchitectureSpec``), and the
capabilities an attributor may need.

A plain data type that plugins return from the ``attrib_bench_architectures`` hook; the adapter
that reads a model through a spec is ``attrib_bench.model.architectures.EncoderAdapter``.
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
    RoBERTa's way, over the non-pad tokens.
    """

    model_types: tuple[str, ...]
    embeddings: str = "embeddings"
    layers: str = "encoder.layer"
    value: str = "attention.self.value"
    attention_output: str = "attention.output.dense"
    ln1: str = "attention.output.LayerNorm"
    ln2: str = "output.LayerNorm"
    block: str = "post-ln"
    norm: str = "layernorm"
    qkv: str = "separate"
    heads: str = "multi-head"
    positions: str = "absolute"

    def problem(self) -> str | None:
        """Why this spec cannot be registered, or None: checked when plugins are loaded."""
        if isinstance(self.model_types, str) or not self.model_types:
            return f"model_types must be a non-empty tuple of model types, got {self.model_types!r}"
        for capability, values in CAPABILITIES.items():
            value = getattr(self, capability)
            if value not in values:
                return f"{capability}={value!r} is not one of {', '.join(values)}"
        return None


def needs_problem(needs: Mapping[str, str]) -> str | None:
    """Why an attributor's ``needs`` names no real capability, or None."""
    for capability, value in needs.items():
        if capability not in CAPABILITIES:
            return f"unknown capability {capability!r}; valid: {', '.join(CAPABILITIES)}"
        if value not in CAPABILITIES[capability]:
            return f"{capability}={value!r} is not one of {', '.join(CAPABILITIES[capability])}"
    return None
