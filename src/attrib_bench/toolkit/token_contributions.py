"""Jacobian-norm contributions of input tokens to hidden tokens: the math of hidden-token
attribution (Brunner et al. 2020, ../shared/specs/identifiability.md).

Public so that the ``hta`` plugin, the identifiability analysis and third-party methods share
one implementation:

    c^l_ij = ||d e_j^l / d x_i|| / sum_k ||d e_j^l / d x_k||

with x the embedding output and e^l the hidden states after layer l.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch.func import jacrev

if TYPE_CHECKING:  # model.load imports transformers: `attrib-bench list` should not
    from attrib_bench.model.load import LoadedModel


def hidden_states_from(loaded: LoadedModel, x_ND: torch.Tensor, layers: int) -> torch.Tensor:
    """e^layers for one unpadded example, running the encoder layers on its embedding output."""
    hidden = x_ND[None]
    for module in loaded.adapter.layer_sequence[:layers]:
        out = module(hidden)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden[0]


def contributions(
    loaded: LoadedModel,
    x_ND: torch.Tensor,
    norm: str = "frobenius",
    targets: Sequence[int] = (0,),
    chunk_size: int = 256,
) -> torch.Tensor:
    """c^l_ji for l = 1..L, every target token j and input token i: (L, len(targets), n).

    Rows sum to 1. Frobenius works one target at a time so that a Jacobian never exceeds
    d x n x d numbers.
    """
    layers = len(loaded.adapter.layer_sequence)
    x_ND = x_ND.detach()
    index = torch.tensor(list(targets), device=x_ND.device)
    rows = []
    for layer in range(1, layers + 1):
        if norm == "frobenius":
            per_target = []
            for j in targets:
                jacobian_DND = jacrev(
                    lambda x, j=j, layer=layer: hidden_states_from(loaded, x, layer)[j],
                    chunk_size=chunk_size,
                )(x_ND)
                per_target.append(jacobian_DND.pow(2).sum(dim=(0, 2)).sqrt())
            norms_JN = torch.stack(per_target)
        else:
            jacobian_JND = jacrev(
                lambda x, layer=layer: hidden_states_from(loaded, x, layer)[index].sum(-1),
                chunk_size=chunk_size,
            )(x_ND)
            norms_JN = jacobian_JND.norm(dim=-1)
        rows.append((norms_JN / norms_JN.sum(dim=-1, keepdim=True)).detach())
    return torch.stack(rows)
