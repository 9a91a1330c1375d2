"""Gradient methods at the embedding output, through Captum (../shared/specs/evaluation.md).

The attribution is taken at the output of the embedding module (``hidden_states[0]``: after
the embedding LayerNorm) for the logit of the predicted class (``target=gold``: the label), and
reduced per token by the L2 norm over the hidden dimension (``reduce=sum``: signed sum).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace, UsageError


def _forward(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    def forward(input_ids, attention_mask, token_type_ids=None, position_ids=None):
        return model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
        ).logits

    return forward


def _target(trace: Trace, choice: str) -> torch.Tensor:
    if choice == "predicted":
        return trace.predicted_B
    labels = trace.batch.labels
    if labels is None:
        raise UsageError("target=gold needs a label for every example; this dataset has none")
    return labels


class _EmbeddingGradient(Configurable, ABC):
    requires = frozenset()
    parameters = {"target": "predicted", "reduce": "l2"}
    choices = {"target": ("predicted", "gold"), "reduce": ("l2", "sum")}

    @abstractmethod
    def per_dimension(self, trace: Trace, target: torch.Tensor) -> torch.Tensor:
        """Attribution at the embedding output, (B, N, D); each subclass is one Captum method."""

    def attribute(self, trace: Trace) -> Attribution:
        batch = trace.batch
        values_BND = self.per_dimension(trace, _target(trace, self.params["target"])).detach()
        if self.params["reduce"] == "l2":
            scores_BN = values_BND.norm(dim=-1)
        else:
            scores_BN = values_BND.sum(dim=-1)
        scores_BN = scores_BN * batch.attention_mask_BN
        return Attribution(aggregated_BLN=scores_BN[:, None, :])

    def _args(self, trace: Trace) -> tuple:
        batch = trace.batch
        return (batch.attention_mask_BN, batch.token_type_ids_BN)


class Saliency(_EmbeddingGradient):
    """Gradient x input (the GlobEnc reference saliency)."""

    name = "saliency"
    description = "Gradient x input at the embedding output, L2 per token (Captum)"
    multiply_by_inputs = True

    def per_dimension(self, trace: Trace, target: torch.Tensor) -> torch.Tensor:
        from captum.attr import LayerGradientXActivation  # captum imports matplotlib: 0.6 s

        method = LayerGradientXActivation(
            _forward(trace.model),
            trace.adapter.embeddings,
            multiply_by_inputs=self.multiply_by_inputs,
        )
        return method.attribute(
            trace.batch.input_ids_BN, target=target, additional_forward_args=self._args(trace)
        )


class Gradient(Saliency):
    name = "gradient"
    description = "Plain gradient at the embedding output, L2 per token (Captum)"
    multiply_by_inputs = False


class IntegratedGradients(_EmbeddingGradient):
    """Captum LayerIntegratedGradients on the embedding module, [PAD] baseline.

    The baseline keeps the special tokens and replaces every other token by [PAD], so the path
    runs from a content-free input of the same length to the real one. Captum embeds the
    baseline by running the model on its token ids, so both runs get the real input's position
    ids: RoBERTa-family models would otherwise renumber the baseline's tokens around its [PAD]s.
    """

    name = "integrated-gradients"
    description = "Integrated Gradients on the embeddings, [PAD] baseline (Captum; steps=50)"
    parameters = {**_EmbeddingGradient.parameters, "steps": 50, "internal_batch_size": 256}

    def validate(self) -> None:
        if self.params["steps"] < 1:
            raise UsageError(f"integrated-gradients:steps must be >= 1, got {self.params}")

    def per_dimension(self, trace: Trace, target: torch.Tensor) -> torch.Tensor:
        batch = trace.batch
        pad_id = trace.loaded.tokenizer.pad_token_id
        baseline = torch.where(
            batch.special_tokens_mask_BN.bool(),
            batch.input_ids_BN,
            torch.full_like(batch.input_ids_BN, pad_id),
        )
        from captum.attr import LayerIntegratedGradients

        method = LayerIntegratedGradients(_forward(trace.model), trace.adapter.embeddings)
        return method.attribute(
            batch.input_ids_BN,
            baselines=baseline,
            target=target,
            additional_forward_args=(
                *self._args(trace),
                trace.adapter.position_ids(batch.input_ids_BN),
            ),
            n_steps=self.params["steps"],
            internal_batch_size=self.params["internal_batch_size"],
        )


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [Saliency(), Gradient(), IntegratedGradients()]
