"""One backward pass per explained score through the trace's own forward pass.

Every gradient method that backpropagates through the traced pass (``embedding_graph``: the
``saliency`` family at the embedding layers, the attention x gradient family at the attention
probabilities) reads its gradients from :func:`graph_gradients`, which differentiates the
explained score once with respect to every tensor the trace kept in the graph and memoises the
result per batch, keyed by the classes and foils explained. Methods that explain the same score
on one batch therefore share one backward pass, whatever layer each reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from attrib_bench.core.target import target_score

if TYPE_CHECKING:
    from attrib_bench.core.trace import Trace


class GraphGradients(NamedTuple):
    """The explained score's gradient at each graph layer's output, by name (B, N, D), and at
    each layer's attention probabilities (L tensors (B, H, N, K); empty when the trace kept
    none)."""

    layers: dict[str, torch.Tensor]
    attentions: tuple[torch.Tensor, ...]


def graph_gradients(
    trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
) -> GraphGradients:
    """The gradients of the sum over examples of the explained score (``target_score``: the
    class's logit, or the logit minus the foil's), each example's its own, computed once per
    batch and score."""
    foils = None if foils_B is None else foils_B.tolist()
    key = f"graph-gradients/{classes_B.tolist()}/{foils}"

    def compute() -> GraphGradients:
        logits_BC, layers = trace.need("embedding_graph")
        names = sorted(layers)
        inputs = [layers[name] for name in names] + list(trace.graph_attentions)
        score = target_score(logits_BC, classes_B, foils_B).sum()
        gradients = torch.autograd.grad(score, inputs, retain_graph=True)
        return GraphGradients(
            dict(zip(names, gradients[: len(names)], strict=True)),
            tuple(gradients[len(names) :]),
        )

    return trace.memo(key, compute)
