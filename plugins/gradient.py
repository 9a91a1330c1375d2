"""Gradient methods at the embedding output, through Captum (../shared/specs/evaluation.md).

The attribution is taken at the output of the embedding module (``LoadedModel.embeddings``: an
encoder family's ``hidden_states[0]``, after the embedding LayerNorm; the token embeddings,
``get_input_embeddings()``, for a decoder language model, with or without an adapter, and for
any model without one) for the run's target score (attrib_bench.core.target: by default the
logit of the predicted class; under ``score=contrastive`` the logit of ``class=`` minus that of
its foil, per example; ``target=predicted|gold`` on the method overrides it with that class's
logit), and reduced per token by the L2 norm over the hidden dimension (``reduce=sum``: signed
sum). A contrastive score (two logits' difference) is no single output Captum could select, so
the forward function then returns the score itself. A language model's logits are read at each
example's target position (``target_logits``). Nothing but the model's own forward pass is
needed, so these methods run on any Hugging Face classifier or causal language model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace, UsageError
from attrib_bench.core.target import target_score

if TYPE_CHECKING:  # model.load imports transformers, which `attrib-bench list` does without
    from attrib_bench.model.load import LoadedModel


def _forward(loaded: LoadedModel) -> Callable[..., torch.Tensor]:
    """The target logits (B, C), or with ``foils`` the contrastive score (Captum expands every
    argument per step: the target positions too)."""
    from attrib_bench.model.load import target_logits

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
        out = loaded.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            **{name: value for name, value in optional.items() if value is not None},
        )
        logits = target_logits(loaded, out.logits, positions)
        return logits if foils is None else target_score(logits, classes, foils)

    return forward


def _explained(trace: Trace, choice: str) -> tuple[torch.Tensor, torch.Tensor | None]:
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


def _captum_arguments(
    trace: Trace,
    classes_B: torch.Tensor,
    foils_B: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
) -> dict:
    """Captum's ``target`` and ``additional_forward_args`` for the explained score."""
    batch = trace.batch
    args = (
        batch.attention_mask_BN,
        trace.target_positions_B,
        batch.token_type_ids_BN,
        position_ids,
    )
    if foils_B is None:
        return {"target": classes_B, "additional_forward_args": args}
    return {"target": None, "additional_forward_args": (*args, classes_B, foils_B)}


class _EmbeddingGradient(Configurable, ABC):
    requires = frozenset()
    parameters = {"target": "run", "reduce": "l2"}
    choices = {"target": ("run", "predicted", "gold"), "reduce": ("l2", "sum")}

    @abstractmethod
    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        """Attribution at the embedding output, (B, N, D); each subclass is one Captum method."""

    def attribute(self, trace: Trace) -> Attribution:
        batch = trace.batch
        classes_B, foils_B = _explained(trace, self.params["target"])
        values_BND = self.per_dimension(trace, classes_B, foils_B).detach()
        if self.params["reduce"] == "l2":
            scores_BN = values_BND.norm(dim=-1)
        else:
            scores_BN = values_BND.sum(dim=-1)
        scores_BN = scores_BN * batch.attention_mask_BN
        return Attribution(aggregated_BLN=scores_BN[:, None, :])


class Saliency(_EmbeddingGradient):
    """Gradient x input (the GlobEnc reference saliency)."""

    name = "saliency"
    description = "Gradient x input at the embedding output, L2 per token (Captum)"
    multiply_by_inputs = True

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        from captum.attr import LayerGradientXActivation  # captum imports matplotlib: 0.6 s

        method = LayerGradientXActivation(
            _forward(trace.loaded),
            trace.loaded.embeddings,
            multiply_by_inputs=self.multiply_by_inputs,
        )
        return method.attribute(
            trace.batch.input_ids_BN, **_captum_arguments(trace, classes_B, foils_B)
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

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        batch = trace.batch
        pad_id = trace.loaded.tokenizer.pad_token_id
        baseline = torch.where(
            batch.special_tokens_mask_BN.bool(),
            batch.input_ids_BN,
            torch.full_like(batch.input_ids_BN, pad_id),
        )
        from captum.attr import LayerIntegratedGradients

        method = LayerIntegratedGradients(_forward(trace.loaded), trace.loaded.embeddings)
        return method.attribute(
            batch.input_ids_BN,
            baselines=baseline,
            **_captum_arguments(
                trace, classes_B, foils_B, trace.loaded.position_ids(batch.input_ids_BN)
            ),
            n_steps=self.params["steps"],
            internal_batch_size=self.params["internal_batch_size"],
        )


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [Saliency(), Gradient(), IntegratedGradients()]
