"""Load any Hugging Face sequence classifier, by hub id or local directory, ready for tracing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from attrib_bench.console import warn
from attrib_bench.errors import UsageError
from attrib_bench.model.architectures import EncoderAdapter, adapter_for


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    model_id: str
    weights_sha256: str
    fresh_head: bool
    device: torch.device
    #: How tables name the model; the directory name unless set (the embedded default).
    name: str = ""
    _adapter: EncoderAdapter | None = field(default=None, repr=False)

    @property
    def adapter(self) -> EncoderAdapter:
        """The architecture adapter; raises a UsageError for an unsupported family."""
        if self._adapter is None:
            self._adapter = adapter_for(self.model)
        return self._adapter

    @property
    def max_length(self) -> int:
        """Longest input the model accepts (position embeddings minus any offset RoBERTa uses)."""
        positions = getattr(self.model.config, "max_position_embeddings", 512)
        if self.model.config.model_type in ("roberta", "xlm-roberta", "camembert"):
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
) -> LoadedModel:
    """Load a classifier with eager attention in eval mode.

    A directory holding only an encoder gets a freshly initialised head and a warning: its
    predictions, and so gradient attributions, mean nothing until it is fine-tuned.
    """
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
        name=Path(name_or_path).name or str(name_or_path),
    )
