"""Hidden-token attribution, HTA (Brunner et al., ICLR 2020), ../shared/specs/identifiability.md.

The contribution of input token i (its embedding output x_i) to hidden token j after layer l:

    c^l_ij = ||d e_j^l / d x_i|| / sum_k ||d e_j^l / d x_k||

``norm=frobenius`` (default) takes the Frobenius norm of the exact d x d Jacobian block: d
backward passes per layer, vectorised with ``torch.func.jacrev``/``vmap``. ``norm=sum``
differentiates the sum of e_j^l's coordinates (one backward pass per layer and target) and takes
the L2 norm of that gradient. The attributor reports j = [CLS] per layer; each layer's row already
accounts for every layer below it, so it is the "aggregated" row (there is no single-layer row).
Examples run one at a time on their real tokens, so padding never enters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch.func import jacrev

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace

if TYPE_CHECKING:  # model.load imports transformers: `attrib-bench list` should not
    from attrib_bench.model.load import LoadedModel


def hidden_states_from(loaded: LoadedModel, x_ND: torch.Tensor, layers: int) -> torch.Tensor:
    """e^layers for one unpadded example, running the encoder layers on its embedding output."""
    hidden = x_ND[None]
    for module in loaded.adapter.layers[:layers]:
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
    layers = len(loaded.adapter.layers)
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


class HiddenTokenAttribution(Configurable):
    name = "hta"
    description = "Hidden-token attribution (Brunner et al. 2020): Jacobian-norm share per layer"
    requires = frozenset({"hidden_states"})
    #: d backward passes per layer and example: seconds per example on a CPU; select it by name.
    in_default_run = False
    parameters = {"norm": "frobenius", "chunk_size": 256}
    choices = {"norm": ("frobenius", "sum")}

    def attribute(self, trace: Trace) -> Attribution:
        x_BND = trace.hidden_states[0]
        scores_BLN = torch.zeros(x_BND.shape[0], trace.num_layers, x_BND.shape[1])
        for row, length in enumerate(trace.batch.lengths):
            rows_L1N = contributions(
                trace.loaded,
                x_BND[row, :length],
                self.params["norm"],
                chunk_size=self.params["chunk_size"],
            )
            scores_BLN[row, :, :length] = rows_L1N[:, 0].cpu()
        return Attribution(aggregated_BLN=scores_BLN.to(x_BND.device))


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [HiddenTokenAttribution()]
