"""Test helpers: build batches and traces directly, without the CLI."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attrib_bench.core.interfaces import Attribution, Batch, Example
from attrib_bench.data.batches import make_batches
from attrib_bench.model.load import LoadedModel
from attrib_bench.model.trace import TRACE_FIELDS, Trace, trace_batch

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
    return trace_batch(loaded, one_batch(loaded, items), TRACE_FIELDS)


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
