"""What Captum-based methods hand Captum: the scored forward function, the explained classes,
the target arguments (batched or one example over its real tokens) and per-example seeds.

Shared by the gradient and the perturbation plugins, and public for third-party Captum methods.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch

from attrib_bench.core.errors import UsageError
from attrib_bench.core.target import target_score

if TYPE_CHECKING:
    from attrib_bench.core.loaded_model import LoadedModel
    from attrib_bench.core.trace import Trace


def scored_forward(loaded: LoadedModel) -> Callable[..., torch.Tensor]:
    """The target logits (B, C), or with ``foils`` the contrastive score (Captum expands every
    argument per step: the target positions too). The model runs under sdpa
    (``LoadedModel.fast_attention``): no caller reads attention probabilities."""

    def forward(
        input_ids,
        attention_mask,
        positions,
        token_type_ids=None,
        position_ids=None,
        classes=None,
        foils=None,
    ):
        optional = {"token_type_ids": token_type_ids, "position_ids": position_ids}
        with loaded.fast_attention():
            out = loaded.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                **{name: value for name, value in optional.items() if value is not None},
            )
        logits = loaded.target_logits(out.logits, positions)
        return logits if foils is None else target_score(logits, classes, foils)

    return forward


def explained_classes(trace: Trace, choice: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The classes (and contrastive foils) whose score is differentiated: the run's target
    score for ``run``, else the logit of the class the method's ``target=`` names."""
    if choice == "run":
        return trace.target_classes_B, trace.target_foils_B
    if choice == "predicted":
        return trace.predicted_B, None
    labels = trace.batch.labels
    if labels is None:
        raise UsageError("target=gold needs a label for every example; this dataset has none")
    return labels, None


def captum_arguments(
    trace: Trace,
    classes_B: torch.Tensor,
    foils_B: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
) -> dict:
    """Captum's ``target`` and ``additional_forward_args`` for the explained score."""
    batch = trace.batch
    args = (batch.attention_mask_BN, trace.target_positions_B, batch.token_type_ids_BN)
    return target_arguments((*args, position_ids), classes_B, foils_B)


def target_arguments(args: tuple, classes_B: torch.Tensor, foils_B: torch.Tensor | None) -> dict:
    """``target`` and ``additional_forward_args`` for ``scored_forward`` given its other inputs
    (attention mask, target positions, token types, position ids)."""
    if foils_B is None:
        return {"target": classes_B, "additional_forward_args": args}
    return {"target": None, "additional_forward_args": (*args, classes_B, foils_B)}


def example_arguments(
    trace: Trace, row: int, classes_B: torch.Tensor, foils_B: torch.Tensor | None
) -> tuple[torch.Tensor, dict]:
    """Example ``row`` alone over its real tokens: its token ids (1, n) and Captum's target
    arguments. Per-example calls make a seeded method's result independent of its batch."""
    batch = trace.batch
    real_N = batch.attention_mask_BN[row].bool()
    cut = lambda t: None if t is None else t[row : row + 1, real_N]  # noqa: E731
    position = trace.target_positions_B[row]
    positions = real_N[:position].sum().reshape(1)  # its index among the real tokens
    position_ids = trace.loaded.position_ids(batch.input_ids_BN)
    args = (cut(batch.attention_mask_BN), positions, cut(batch.token_type_ids_BN))
    foils = None if foils_B is None else foils_B[row : row + 1]
    arguments = target_arguments((*args, cut(position_ids)), classes_B[row : row + 1], foils)
    return cut(batch.input_ids_BN), arguments


def example_seed(seed: int, trace: Trace, row: int) -> int:
    """A seed from (the run's seed + ``seed``, the example's id): never from batch companions."""
    text = f"{trace.seed + seed}:{trace.batch.examples[row].id}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") % 2**63


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch (CPU and ``device``) and numpy, which Captum draws from, and restore their
    states afterwards, so that a method leaves the run's random streams as it found them."""
    devices = [device] if device.type == "cuda" else []
    state = np.random.get_state()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            np.random.set_state(state)


def baseline_token(loaded: LoadedModel, choice: str) -> int:
    """The token id a removed token becomes: ``auto`` is [MASK] where the tokenizer has one,
    else [PAD]; ``mask``, ``pad`` or ``unk`` that token (a UsageError when it has none)."""
    tokenizer = loaded.tokenizer
    if choice == "auto":
        choice = "mask" if tokenizer.mask_token_id is not None else "pad"
    token_id = getattr(tokenizer, f"{choice}_token_id")
    if token_id is None:
        raise UsageError(f"baseline={choice} needs a tokenizer with a {choice} token")
    return token_id
