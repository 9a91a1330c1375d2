"""Attention x gradient methods (docs/math/attention-gradient.md): the attention probabilities
of the traced pass weighted by the explained score's gradient with respect to them.

All read the attention probabilities A^l (B, H, N, K) of every layer and gradients of the
explained score (AttCAT's at the hidden states, the others' at A^l), from one backward pass
through the trace's own forward pass, shared by every method that explains the same score on
the batch (``attrib_bench.toolkit.graph_gradients``).
The score is the run's target score (the predicted class's logit by default; the logit minus
its foil's under ``score=contrastive``), or the logit of the class ``target=predicted|gold``
names. The pass runs eager attention, since the probabilities must exist as tensors.

- ``gae``: Chefer, Gur & Wolf's generic attention explainability: Ā^l = mean_h (∇A^l ⊙ A^l)^+,
  R^0 = I and R^l = R^{l-1} + Ā^l R^{l-1}; the target token's row of R^L.
- ``grad-sam``: Barkan et al.'s gradient self-attention map: the mean over layers, heads and
  the real query rows of A^l ⊙ ReLU(∇A^l), a score per key token.
- ``attention-x-gradient``: the target token's row of mean_h (A^l ⊙ ∇A^l), signed, layer by
  layer, not aggregated (its last layer is the one scored).
- ``attcat``: Qiang et al.'s attentive class activation tokens: per layer, the input hidden
  state times its gradient, summed over the hidden dimension, times the attention each token
  receives (mean over heads and real query rows); summed over layers.
"""

from __future__ import annotations

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace
from attrib_bench.toolkit.aggregation import pair_mask, rollout, target_rows
from attrib_bench.toolkit.captum_inputs import explained_classes
from attrib_bench.toolkit.graph_gradients import graph_gradients


def weighted_attentions(trace: Trace, target: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer the attention probabilities and the explained score's gradient at them,
    (B, H, N, K) each, padded query rows and keys zeroed."""
    classes_B, foils_B = explained_classes(trace, target)
    gradients = graph_gradients(trace, classes_B, foils_B, internals=True).attentions
    keep = pair_mask(trace.mask_BN).bool()[:, None]
    return [
        (torch.where(keep, a.detach(), 0.0), torch.where(keep, g, 0.0))
        for a, g in zip(trace.graph_attentions, gradients, strict=True)
    ]


class _AttentionGradient(Configurable):
    requires = frozenset({"attentions", "embedding_graph"})
    family = "attention-gradient"
    parameters = {"target": "run"}
    choices = {"target": ("run", "predicted", "gold")}
    parameter_docs = {
        "target": "the score differentiated: run, the run's --target score; predicted or gold, "
        "that class's logit",
    }

    def explained_target(self, trace: Trace) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The classes (and foils) the gradient is of: what the removal evaluators score."""
        return explained_classes(trace, self.params["target"])


class GenericAttentionExplainability(_AttentionGradient):
    """Gradient-weighted attention rollout: Ā^l = mean_h (∇A^l ⊙ A^l)^+, R^l = R^{l-1} +
    Ā^l R^{l-1} from R^0 = I, the target token's row; local rows are Ā^l's.

    Reference: Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability for Interpreting
    Bi-Modal and Encoder-Decoder Transformers", ICCV.
    """

    name = "gae"
    passes = "1 backward per batch, through the traced pass (shared with the others)"
    description = "Chefer et al. 2021: rollout of I + head mean of (grad A * A)+, one backward"

    def attribute(self, trace: Trace) -> Attribution:
        mask_BN = trace.mask_BN
        eye_BNN = torch.diag_embed(mask_BN.to(trace.graph_attentions[0].dtype))
        weighted = [
            (g * a).clamp(min=0).mean(dim=1)
            for a, g in weighted_attentions(trace, self.params["target"])
        ]
        positions_B = trace.target_positions_B
        aggregated = rollout([eye_BNN + m for m in weighted], mask_BN, positions_B)
        local = torch.stack([target_rows(m, positions_B) for m in weighted], dim=1)
        return Attribution(aggregated_BLN=aggregated.detach(), local_BLN=local.detach())


class GradSAM(_AttentionGradient):
    """Grad-SAM: the mean over layers, heads and the real query rows of A^l ⊙ ReLU(∇A^l), a
    score per key token; ``aggregated`` at layer l is the mean over layers 1..l, local rows
    each layer's own mean.

    Reference: Barkan et al. 2021, "Grad-SAM: Explaining Transformers via Gradient
    Self-Attention Maps", CIKM.
    """

    name = "grad-sam"
    passes = "1 backward per batch, through the traced pass (shared with the others)"
    description = "Grad-SAM (Barkan et al. 2021): mean of A * ReLU(grad A) over layers, heads, rows"

    def attribute(self, trace: Trace) -> Attribution:
        queries_B = trace.mask_BN.sum(dim=1).to(trace.graph_attentions[0].dtype)
        local = torch.stack(
            [
                (a * g.clamp(min=0)).mean(dim=1).sum(dim=1) / queries_B[:, None]
                for a, g in weighted_attentions(trace, self.params["target"])
            ],
            dim=1,
        )
        layers = torch.arange(1, local.shape[1] + 1, device=local.device, dtype=local.dtype)
        aggregated = local.cumsum(dim=1) / layers[None, :, None]
        return Attribution(aggregated_BLN=aggregated.detach(), local_BLN=local.detach())


class AttentionXGradient(_AttentionGradient):
    """The target token's row of mean_h (A^l ⊙ ∇A^l), signed, per layer; not aggregated over
    layers, so the aggregated and local rows are the same.

    Reference: Serrano & Smith 2019, "Is Attention Interpretable?", ACL (attention weights
    multiplied by the gradient of the decision with respect to them).
    """

    name = "attention-x-gradient"
    passes = "1 backward per batch, through the traced pass (shared with the others)"
    description = "Attention times its gradient, head mean, target row per layer (signed)"

    def attribute(self, trace: Trace) -> Attribution:
        positions_B = trace.target_positions_B
        rows = torch.stack(
            [
                target_rows((a * g).mean(dim=1), positions_B)
                for a, g in weighted_attentions(trace, self.params["target"])
            ],
            dim=1,
        ).detach()
        return Attribution(aggregated_BLN=rows, local_BLN=rows)


class AttCAT(_AttentionGradient):
    """AttCAT, as the official code computes it: for each layer l, with h^l its input hidden
    states (``hidden_states[l - 1]``), CAT^l_i = sum_d h^l_id ∂s/∂h^l_id, weighted by the mean
    over heads and real query rows of the attention token i receives in layer l; summed over
    the layers (aggregated at layer l: the sum over layers 1..l; local: layer l's term).

    Reference: Qiang et al. 2022, "AttCAT: Explaining Transformers via Attentive Class
    Activation Tokens", NeurIPS.
    """

    name = "attcat"
    passes = "1 backward per batch, through the traced pass (shared with the others)"
    description = "AttCAT (Qiang et al. 2022): hidden state x gradient, weighted by attention"
    requires = frozenset({"attentions", "hidden_states", "embedding_graph"})

    def attribute(self, trace: Trace) -> Attribution:
        classes_B, foils_B = explained_classes(trace, self.params["target"])
        gradients = graph_gradients(trace, classes_B, foils_B, internals=True).hidden_states
        real_BN = trace.mask_BN.to(trace.graph_attentions[0].dtype)
        queries_B = real_BN.sum(dim=1)
        terms = []
        for layer, (attention, _) in enumerate(weighted_attentions(trace, self.params["target"])):
            received_BN = attention.mean(dim=1).sum(dim=1) / queries_B[:, None]
            hidden = trace.graph_hidden_states[layer].detach()
            cat_BN = (gradients[layer] * hidden).sum(dim=-1) * real_BN
            terms.append(cat_BN * received_BN)
        local = torch.stack(terms, dim=1)
        return Attribution(aggregated_BLN=local.cumsum(dim=1), local_BLN=local)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [GenericAttentionExplainability(), GradSAM(), AttentionXGradient(), AttCAT()]
