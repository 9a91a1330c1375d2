"""Load any Hugging Face sequence classifier, by hub id or local directory, ready for tracing."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from attrib_bench.core.console import warn
from attrib_bench.core.errors import UsageError
from attrib_bench.core.registry import load_registry
from attrib_bench.model.architectures import (
    ArchitectureSpec,
    EncoderAdapter,
    adapter_for,
    unmet_needs,
)


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

    @property
    def adapter(self) -> EncoderAdapter:
        """The architecture adapter of ``model``; a UsageError for a family without a spec.

        Built on each access (a lookup), so a copy made with ``dataclasses.replace(loaded,
        model=other)`` never reaches the modules of the model it was copied from.
        """
        return adapter_for(self.model, self.architectures)

    def unmet_needs(self, attributor: Any) -> str | None:
        """Why ``attributor`` cannot run on this model family (one line), or None.

        Only an attributor that declares ``needs`` requires the family to have a spec: the
        others run on any classifier, or fail on their own when they reach for the adapter.
        """
        if not getattr(attributor, "needs", None):
            return None
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


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise UsageError(f"bad device {device!r}: {error}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    return resolved


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over the parameters and buffers in name order: identifies the exact weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _check_exists(name_or_path: str) -> None:
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise UsageError(f"model directory {str(path)!r} has no config.json")
        return
    try:
        AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise UsageError(
            f"model {name_or_path!r} not found: no such local directory, and the Hugging Face hub "
            f"has no such model or cannot be reached ({type(error).__name__})"
        ) from None


def load_model(
    name_or_path: str,
    device: str = "auto",
    num_labels: int | None = None,
    warn_fresh_head: bool = True,
    architectures: Mapping[str, ArchitectureSpec] | None = None,
) -> LoadedModel:
    """Load a classifier with eager attention in eval mode.

    A directory holding only an encoder gets a freshly initialised head and a warning: its
    predictions, and so gradient attributions, mean nothing until it is fine-tuned.
    ``architectures`` are the model families known (``Registry.architecture_specs()``, which
    includes ``--plugin`` files); None takes those of the installed plugins.
    """
    if architectures is None:
        architectures = load_registry().architecture_specs()
    _check_exists(name_or_path)
    kwargs = {"attn_implementation": "eager", "output_loading_info": True}
    if num_labels is not None:
        kwargs["num_labels"] = num_labels
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(name_or_path, **kwargs)
    except ValueError as error:
        raise UsageError(
            f"model {name_or_path!r} cannot be loaded as a classifier with eager "
            f"attention (needed for attention probabilities): {error}"
        ) from None
    if model.config._attn_implementation != "eager":
        raise UsageError(
            f"model {name_or_path!r} runs attention as {model.config._attn_implementation!r}, "
            "which returns no attention probabilities; it must support eager attention"
        )
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if not tokenizer.is_fast:
        raise UsageError(f"model {name_or_path!r} has no fast tokenizer (offsets are needed)")
    tokenizer.padding_side = "right"  # the math reads the [CLS] row at position 0
    fresh_head = bool(info.get("missing_keys"))
    if fresh_head and warn_fresh_head:
        warn(
            f"{name_or_path} has no trained classification head ({', '.join(info['missing_keys'])}"
            " newly initialised): its predictions are random until fine-tuned "
            "(attrib-bench finetune)"
        )
    resolved = resolve_device(device)
    model.to(resolved).eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=str(name_or_path),
        weights_sha256=weights_hash(model),
        fresh_head=fresh_head,
        device=resolved,
        architectures=architectures,
        name=Path(name_or_path).name or str(name_or_path),
    )
