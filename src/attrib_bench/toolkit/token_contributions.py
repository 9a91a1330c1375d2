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
from torch.func import jacrev, jvp, vmap

if TYPE_CHECKING:  # model.load imports transformers: `attrib-bench list` should not
    from attrib_bench.core.loaded_model import LoadedModel


def all_hidden_states_from(loaded: LoadedModel, x_ND: torch.Tensor) -> torch.Tensor:
    """e^1..e^L, (L, n, D), for one unpadded example of n tokens whose first layer's input is
    ``x_ND``.

    The model's own forward pass with that input replaced (a pre-hook on the first layer call),
    so every layer is called as the model calls it: a decoder's causal mask and rotary position
    embeddings, which running the layer modules by hand would leave out. Each layer call's
    output (ALBERT's one shared layer is called L times); the token ids passed only size the
    masks and positions, since the first layer's input replaces what they embed.
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
    return torch.stack([output[0] for output in outputs])


def hidden_states_from(loaded: LoadedModel, x_ND: torch.Tensor, layers: int) -> torch.Tensor:
    """e^layers, (n, D): ``all_hidden_states_from``'s layer ``layers`` (1-based)."""
    return all_hidden_states_from(loaded, x_ND)[layers - 1]


#: How ``contributions`` computes Frobenius norms: reverse mode (D vector-Jacobian products per
#: layer and target), forward mode (D Jacobian-vector products per input token, every layer and
#: target at once), or whichever costs fewer layer passes.
MODES = ("auto", "reverse", "forward")


def contributions(
    loaded: LoadedModel,
    x_ND: torch.Tensor,
    norm: str = "frobenius",
    targets: Sequence[int] = (0,),
    chunk_size: int = 256,
    mode: str = "auto",
) -> torch.Tensor:
    """c^l_ji for l = 1..L, every target token j and input token i: (L, len(targets), n).

    Rows sum to 1. Frobenius in reverse mode works one target at a time, so that a Jacobian
    never exceeds D x n x D numbers: J x D backward passes through l layers for layer l, about
    J x D x L(L + 1)/2 layer passes in all. In forward mode one Jacobian-vector product per
    input coordinate gives every layer's and target's column at once: n x D passes through L
    layers; ``auto`` takes it when J (L + 1) > 2n (all targets: (L + 1)/2 times fewer passes).
    Both are exact; ``chunk_size`` products run at once (memory, not the result).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    layers = len(loaded.adapter.layer_sequence)
    x_ND = x_ND.detach()
    targets = list(targets)
    index = torch.tensor(targets, device=x_ND.device)
    n = x_ND.shape[0]
    forward = mode == "forward" or (mode == "auto" and len(targets) * (layers + 1) > 2 * n)
    if norm == "frobenius" and forward:
        norms_LJN = _frobenius_forward(loaded, x_ND, index, chunk_size).sqrt()
        return (norms_LJN / norms_LJN.sum(dim=-1, keepdim=True)).detach()
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


def _frobenius_forward(
    loaded: LoadedModel, x_ND: torch.Tensor, index: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """||d e^l_j / d x_i||_F^2 for every layer l, target j and input i, (L, J, n): the
    Jacobian-vector product along each input coordinate (i, b), squared and summed over b."""
    n, d = x_ND.shape

    def column(direction_ND: torch.Tensor) -> torch.Tensor:
        return jvp(lambda x: all_hidden_states_from(loaded, x)[:, index], (x_ND,), (direction_ND,))[
            1
        ]

    squares_LJN = None
    for start in range(0, n * d, chunk_size):
        flat = torch.arange(start, min(start + chunk_size, n * d), device=x_ND.device)
        directions = torch.zeros(len(flat), n * d, dtype=x_ND.dtype, device=x_ND.device)
        directions[torch.arange(len(flat)), flat] = 1.0
        squares_CLJ = vmap(column)(directions.view(-1, n, d)).pow(2).sum(dim=-1)
        if squares_LJN is None:
            squares_LJN = x_ND.new_zeros(*squares_CLJ.shape[1:], n)
        squares_LJN.index_add_(2, flat // d, squares_CLJ.permute(1, 2, 0))
    return squares_LJN
