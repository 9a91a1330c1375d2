"""One backward pass per explained score through the trace's own forward pass.

Every gradient method that backpropagates through the traced pass (``embedding_graph``: the
``saliency`` family at the embedding layers, the attention x gradient family at the attention
probabilities and hidden states) reads its gradients from :func:`graph_gradients`, memoised per
batch and keyed by the classes and foils explained. A call for the internals differentiates
with respect to every tensor the trace kept in the graph, and every later call for the same
score reads that pass; a call for the embedding layers alone differentiates only there, so a
batch without an internal reader (the default run's saliency beside the attention family)
never holds gradients of the attention probabilities.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from attrib_bench.core.target import target_score

if TYPE_CHECKING:
    from attrib_bench.core.trace import Trace


class GraphGradients(NamedTuple):
    """The explained score's gradient at each graph layer's output, by name (B, N, D), at each
    layer's attention probabilities (L tensors (B, H, N, K)) and at the hidden states (L + 1
    tensors (B, N, D)); the last two empty when the trace kept none."""

    layers: dict[str, torch.Tensor]
    attentions: tuple[torch.Tensor, ...]
    hidden_states: tuple[torch.Tensor, ...]


def graph_gradients(
    trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None, internals: bool = False
) -> GraphGradients:
    """The gradients of the sum over examples of the explained score (``target_score``: the
    class's logit, or the logit minus the foil's), each example's its own, computed once per
    batch and score. ``internals``: also at the attention probabilities and hidden states the
    trace kept; without it only the embedding layers', unless a call with it already ran (its
    result serves both), so a batch that no internal reader needs never holds gradients of
    (B, H, N, N) size."""
    foils = None if foils_B is None else foils_B.tolist()
    key = f"graph-gradients/{classes_B.tolist()}/{foils}"

    def compute(internal: bool) -> GraphGradients:
        logits_BC, layers = trace.need("embedding_graph")
        names = sorted(layers)
        attentions = list(trace.graph_attentions) if internal else []
        hidden = list(trace.graph_hidden_states) if internal else []
        inputs = [layers[name] for name in names] + attentions + hidden
        score = target_score(logits_BC, classes_B, foils_B).sum()
        # A pre-LN model's last hidden state (after the final norm) may not reach the score of
        # a head that reads the norm's input: its gradient is then zero, not an error.
        gradients = torch.autograd.grad(score, inputs, retain_graph=True, allow_unused=True)
        gradients = [
            torch.zeros_like(t) if g is None else g for t, g in zip(inputs, gradients, strict=True)
        ]
        split = len(names) + len(attentions)
        return GraphGradients(
            dict(zip(names, gradients[: len(names)], strict=True)),
            tuple(gradients[len(names) : split]),
            tuple(gradients[split:]),
        )

    full = f"{key}/internals"
    if internals or full in trace.shared:
        return trace.memo(full, lambda: compute(True))
    return trace.memo(f"{key}/layers", lambda: compute(False))
