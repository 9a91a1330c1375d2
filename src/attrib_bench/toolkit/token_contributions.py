"""Jacobian-norm contributions of input tokens to hidden tokens: the math of hidden-token
attribution (Brunner et al. 2020; docs/math/identifiability.md, eq. (4)).

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
    from attrib_bench.core.loaded_model import LoadedModel


def hidden_states_from(loaded: LoadedModel, x_ND: torch.Tensor, layers: int) -> torch.Tensor:
    """e^layers for one unpadded example of n tokens whose first layer's input is ``x_ND``.

    The model's own forward pass with that input replaced (a pre-hook on the first layer call),
    so every layer is called as the model calls it: a decoder's causal mask and rotary position
    embeddings, which running the layer modules by hand would leave out. The output of the
    ``layers``-th layer call (ALBERT's one shared layer is called L times); the token ids passed
    only size the masks and positions, since the first layer's input replaces what they embed.
    """
    sequence = loaded.adapter.layer_sequence
    outputs: list[torch.Tensor] = []

    def replace_input(_module: torch.nn.Module, args: tuple, kwargs: dict):
        if outputs:  # a shared layer's later calls take the previous call's output
            return None
        if args:
            return (x_ND[None], *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": x_ND[None]}

    def keep_output(_module: torch.nn.Module, _args: tuple, out) -> None:
        outputs.append(out[0] if isinstance(out, tuple) else out)

    handles = [sequence[0].register_forward_pre_hook(replace_input, with_kwargs=True)]
    handles += [m.register_forward_hook(keep_output) for m in {id(m): m for m in sequence}.values()]
    n = x_ND.shape[0]
    ids_1N = torch.zeros(1, n, dtype=torch.long, device=x_ND.device)
    try:
        loaded.model.base_model(input_ids=ids_1N, attention_mask=torch.ones_like(ids_1N))
    finally:
        for handle in handles:
            handle.remove()
    return outputs[layers - 1][0]


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
