"""What the evaluators that re-run a method on perturbed inputs share (robustness, smoothed
model randomisation): an example alone over its real tokens, and its embedding output shifted
by a given noise while the method runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from attrib_bench.core.batch import Batch

if TYPE_CHECKING:
    from attrib_bench.core.loaded_model import LoadedModel


def example_batch(batch: Batch, row: int, input_ids_1N: torch.Tensor | None = None) -> Batch:
    """Example ``row`` alone over its real tokens, its token ids replaced by ``input_ids_1N``
    where given (a swap keeps the length)."""
    real_N = batch.attention_mask_BN[row].bool()
    cut = lambda t: None if t is None else t[row : row + 1, real_N.to(t.device)]  # noqa: E731
    ids = cut(batch.input_ids_BN) if input_ids_1N is None else input_ids_1N
    return Batch(
        examples=[batch.examples[row]],
        input_ids_BN=ids,
        attention_mask_BN=cut(batch.attention_mask_BN),
        token_type_ids_BN=cut(batch.token_type_ids_BN),
        special_tokens_mask_BN=cut(batch.special_tokens_mask_BN),
        tokens=[batch.tokens[row]],
        word_ids_BN=cut(batch.word_ids_BN),
    )


@contextmanager
def shifted_embeddings(loaded: LoadedModel, delta_ND: torch.Tensor, who: str) -> Iterator[None]:
    """Add ``delta_ND`` to every output of ``loaded.embeddings`` inside the block, broadcast
    over its leading dimension (path steps, baselines, perturbed copies of the example)."""

    def shift(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        if output.shape[-2:] != delta_ND.shape:
            raise ValueError(
                f"{who}: the method ran the model on {output.shape[-2]} tokens where the "
                f"example has {delta_ND.shape[0]}; embedding noise cannot follow a change of "
                "length"
            )
        return output + delta_ND.to(output.device, output.dtype)

    handle = loaded.embeddings.register_forward_hook(shift)
    try:
        yield
    finally:
        handle.remove()
