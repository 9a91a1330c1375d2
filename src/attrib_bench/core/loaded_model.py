"""The loaded model as plugins see it: the Hugging Face model, its tokenizer, provenance, and
the neutral views of it (its family's adapter, the logits a run explains).

Loading lives in attrib_bench.model.load; this type sits in the core because every plugin reads
it through a trace (attrib_bench.core.trace).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from attrib_bench.core.adapter import ArchitectureSpec, EncoderAdapter, adapter_for, unmet_needs
from attrib_bench.core.attention_kernels import FAST, attention_implementation
from attrib_bench.core.plugin_info import attributor_info

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: Trace fields every model returns by itself: the others hook modules through the adapter.
ADAPTER_FREE_FIELDS = frozenset({"attentions", "hidden_states", "embedding_graph"})


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    model_id: str
    weights_sha256: str
    fresh_head: bool
    device: torch.device
    #: Hugging Face model_type -> ArchitectureSpec: the model families the run's plugins serve.
    architectures: Mapping[str, ArchitectureSpec] = field(repr=False)
    #: How tables name the model; the directory name unless set (the embedded default).
    name: str = ""
    #: A causal language model: logits (B, N, V), explained at the target position (see
    #: target_logits); False for a classifier, whose logits are (B, C).
    is_language_model: bool = False
    #: An encoder-decoder language model (T5, BART, Marian): its source runs through the
    #: encoder, the continuation through the decoder. Only ``attrib-bench context`` reads it.
    is_seq2seq: bool = False
    #: Provenance of a GGUF checkpoint (file, bytes, sha256, quantization); None otherwise.
    gguf: dict[str, Any] | None = None

    @property
    def spec(self) -> ArchitectureSpec | None:
        """The model family's spec; None for a model type no plugin serves."""
        return self.architectures.get(self.model.config.model_type)

    @property
    def embeddings(self) -> torch.nn.Module:
        """The module whose output gradient methods attribute to and ``removal=zero`` erases.

        An encoder family's embedding module (``hidden_states[0]``, after its LayerNorm); the
        token embeddings (``get_input_embeddings()``) for a language model and a model without
        a spec, so that methods needing no internals run on any model, and a decoder's numbers
        do not depend on whether its family has an adapter (GPT-2's ``hidden_states[0]`` adds
        the position embeddings, which a token's attribution should not include).
        """
        if self.spec is None or self.is_language_model:
            return self.model.get_input_embeddings()
        return self.adapter.embeddings

    def position_ids(self, input_ids_BN: torch.Tensor) -> torch.Tensor | None:
        """The position ids of an unmodified input, to pass with its tokens replaced (see
        ``EncoderAdapter.position_ids``); None without a spec: the model numbers the tokens
        itself, and under right padding the real ones are at 0..n-1 either way."""
        return None if self.spec is None else self.adapter.position_ids(input_ids_BN)

    def fast_attention(self) -> AbstractContextManager[str]:
        """Run ``model`` under sdpa inside the block, as before it after: for every pass that
        reads no attention probabilities (attrib_bench.core.attention_kernels). Yields the
        implementation in effect (eager for a model whose class has no sdpa)."""
        return attention_implementation(self.model, FAST)

    @property
    def adapter(self) -> EncoderAdapter:
        """The architecture adapter of ``model``; a UsageError for a family without a spec.

        Built on each access (a lookup), so a copy made with ``dataclasses.replace(loaded,
        model=other)`` never reaches the modules of the model it was copied from.
        """
        return adapter_for(self.model, self.architectures)

    @property
    def class_count(self) -> int:
        """How many classes the explained logits have (``target_logits``' last dimension): the
        labels of a classifier, the output vocabulary of a language model."""
        if self.is_language_model:
            return self.model.get_output_embeddings().out_features
        return self.model.config.num_labels

    def target_logits(self, logits: torch.Tensor, positions_B: torch.Tensor) -> torch.Tensor:
        """:func:`target_logits` of this model: for code below ``model`` in the layers (the
        toolkit), which reads a model through the object it is given."""
        return target_logits(self, logits, positions_B)

    def unmet_needs(self, attributor: Any) -> str | None:
        """Why ``attributor`` cannot run on this model family (one line), or None.

        An attributor reads model internals through the family's spec when it declares
        ``needs`` (``{}``: any family with a spec) or requires a trace field that hooks the
        adapter's modules (anything but attentions and hidden states); the others (gradient
        methods, raw attention, rollout, random) run on any model.
        """
        info = attributor_info(attributor)
        internals = info.needs is not None or bool(info.requires - ADAPTER_FREE_FIELDS)
        if not internals:
            return None
        if self.spec is None:
            model_type = self.model.config.model_type
            return (
                f"{attributor.name} cannot run on model type {model_type!r}: it reads model "
                f"internals, and no architecture adapter serves {model_type!r} (supported: "
                f"{', '.join(sorted(self.architectures)) or 'none'}; a plugin adds one through "
                "the attrib_bench_architectures hook)"
            )
        return unmet_needs(attributor, self.adapter)

    @property
    def max_length(self) -> int:
        """Longest input the model accepts (position embeddings minus any offset RoBERTa uses)."""
        positions = getattr(self.model.config, "max_position_embeddings", 512)
        spec = self.architectures.get(self.model.config.model_type)
        if spec is not None and spec.positions == "after_padding":
            positions -= self.model.config.pad_token_id + 1
        tokenizer_max = self.tokenizer.model_max_length
        return min(positions, tokenizer_max) if tokenizer_max else positions


def target_logits(
    loaded: LoadedModel, logits: torch.Tensor, positions_B: torch.Tensor
) -> torch.Tensor:
    """The logits a run explains, (B, C): what every consumer reads, so all explain one thing.

    A classifier's logits (B, C) as they are; a language model's (B, N, V) at each example's
    target position (``Target.positions``): the next-token logits there, the vocabulary as
    the classes.
    """
    if not loaded.is_language_model:
        return logits
    rows_B = torch.arange(logits.shape[0], device=logits.device)
    return logits[rows_B, positions_B.to(logits.device)]
