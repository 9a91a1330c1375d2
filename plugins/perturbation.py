"""Perturbation methods over tokens, through Captum: occlusion, Shapley value sampling,
KernelSHAP and LIME.

The features are the example's real tokens other than its special tokens ([CLS], [SEP], <s>,
BOS: kept in every perturbed input and scored 0), one feature per token. A removed token is
replaced by the ``baseline`` token: ``auto`` is [MASK] for a tokenizer that has one (the
encoders), else [PAD]; ``mask``, ``pad``, ``unk`` name it. Every other input (attention mask,
token types, position ids) is the real input's. The score is the run's target score, as in
plugins/gradient.py (``explained_classes``). Each example is explained alone over its real tokens,
with Captum's random draws seeded by (run seed + ``seed``, example id), so a result never depends
on the batch. Perturbed inputs go through the model in passes of at most ``chunk_tokens`` tokens
(as many inputs of the example's length as fit, the passes as even as their number allows:
attrib_bench.toolkit.budget.per_pass), so a long input gets fewer inputs per pass, not a larger
pass; the passes run under sdpa (``scored_forward``).
KernelSHAP and LIME fit scikit-learn models through Captum (linear regression; ridge, see Lime).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace
from attrib_bench.toolkit.budget import per_pass
from attrib_bench.toolkit.captum_inputs import (
    baseline_token,
    example_arguments,
    example_seed,
    explained_classes,
    scored_forward,
    seeded,
)

if TYPE_CHECKING:
    from attrib_bench.core.loaded_model import LoadedModel


class _TokenPerturbation(Configurable, ABC):
    requires = frozenset()
    family = "perturbation"
    parameters = {"target": "run", "baseline": "auto", "seed": 0, "chunk_tokens": 8192}
    choices = {"target": ("run", "predicted", "gold"), "baseline": ("auto", "mask", "pad", "unk")}
    parameter_docs = {
        "target": "the score explained: run, the run's --target score; predicted or gold, "
        "that class's logit",
        "baseline": "the token a removed token becomes: auto ([MASK] where the tokenizer has "
        "one, else [PAD]), mask, pad or unk",
        "seed": "added to the run's seed; Captum's draws are seeded by (run seed + seed, "
        "example id) (occlusion draws none); any integer",
        "chunk_tokens": "the most tokens in one pass of perturbed inputs; bounds memory; an "
        "integer >= 1",
    }

    def validate(self) -> None:
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    @abstractmethod
    def explain(
        self, forward: Any, content_1M: torch.Tensor, baseline: int, target: Any, per_eval: int
    ) -> Any:
        """Captum's attribution of the content tokens (1, M), ``per_eval`` perturbed inputs a
        pass."""

    def evaluations(self, features: int) -> int:
        """How many perturbed inputs Captum runs for ``features`` tokens: ``samples`` draws
        (KernelSHAP, LIME); occlusion and Shapley sampling override it."""
        return self.params["samples"]

    def explained_target(self, trace: Trace) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The classes (and foils) this method's ``target=`` explains: what the removal
        evaluators score (attrib_bench.core.interfaces.scored_classes)."""
        return explained_classes(trace, self.params["target"])

    def attribute(self, trace: Trace) -> Attribution:
        loaded, batch = trace.loaded, trace.batch
        classes_B, foils_B = self.explained_target(trace)
        baseline = baseline_token(loaded, self.params["baseline"])
        scores_BN = trace.logits_BC.new_zeros(batch.input_ids_BN.shape)
        for row in range(batch.input_ids_BN.shape[0]):
            ids_1N, arguments = example_arguments(trace, row, classes_B, foils_B)
            real_N = batch.attention_mask_BN[row].bool()
            content_N = ~batch.special_tokens_mask_BN[row, real_N].bool()
            forward = _content_forward(loaded, ids_1N, content_N, arguments)
            seed = example_seed(self.params["seed"], trace, row)
            count = self.evaluations(int(content_N.sum()))
            per_eval = per_pass(count, ids_1N.shape[1], self.params["chunk_tokens"])
            content_1M, target = ids_1N[:, content_N], arguments["target"]
            with seeded(seed, loaded.device), torch.no_grad():
                values = self.explain(forward, content_1M, baseline, target, per_eval)
            real_scores = scores_BN[row, real_N]
            real_scores[content_N] = values[0].to(scores_BN)
            scores_BN[row, real_N] = real_scores
        return Attribution(aggregated_BLN=scores_BN[:, None, :])


def _content_forward(loaded: LoadedModel, ids_1N: torch.Tensor, content_N: torch.Tensor, arguments):
    """The target score as a function of the content tokens (V, M): each row is put back into
    the example's input between its special tokens; Captum's target (when set) picks the class."""
    forward = scored_forward(loaded)
    args = arguments["additional_forward_args"]

    def from_content(content_VM: torch.Tensor) -> torch.Tensor:
        rows = content_VM.shape[0]
        ids_VN = ids_1N.expand(rows, -1).clone()
        ids_VN[:, content_N] = content_VM
        tiled = [None if a is None else a.expand(rows, *a.shape[1:]) for a in args]
        return forward(ids_VN, *tiled)

    return from_content


def _sampled_attribute(params: dict, explainer, content_1M, baseline, target, per_eval: int):
    """Captum's ``attribute`` of a sampling method: ``samples`` draws, batched evaluations."""
    return explainer.attribute(
        content_1M,
        baselines=baseline,
        target=target,
        n_samples=params["samples"],
        perturbations_per_eval=per_eval,
    )


class Occlusion(_TokenPerturbation):
    """Leave-one-out: the target score's drop when one token becomes the baseline token
    (Captum FeatureAblation, one feature per token; Captum's Occlusion with a window of one
    token is the same computation).

    Reference: Li, Monroe & Jurafsky 2016, "Understanding Neural Networks through
    Representation Erasure", arXiv:1612.08220 (leave-one-out erasure).
    """

    name = "occlusion"
    passes = "n forward per example of n content tokens, batched"
    in_default_run = False  # 32x a forward pass on MiniLM (one pass per token, batched)
    description = "Leave-one-out: score drop with each token set to [MASK] (Captum FeatureAblation)"

    def evaluations(self, features: int) -> int:
        return features

    def explain(self, forward, content_1M, baseline, target, per_eval):
        from captum.attr import FeatureAblation

        return FeatureAblation(forward).attribute(
            content_1M, baselines=baseline, target=target, perturbations_per_eval=per_eval
        )


class ShapleyValueSampling(_TokenPerturbation):
    """Captum ShapleyValueSampling: ``samples`` random token orderings.

    Reference: Castro, Gómez & Tejada 2009, "Polynomial Calculation of the Shapley Value Based
    on Sampling", Computers & Operations Research.
    """

    name = "shapley-value-sampling"
    passes = "samples x n forward per example, batched"
    description = "Shapley value sampling over tokens, [MASK] baseline (Captum; samples=25)"
    in_default_run = False
    parameters = {**_TokenPerturbation.parameters, "samples": 25}
    parameter_docs = {
        **_TokenPerturbation.parameter_docs,
        "samples": "random token orderings per example (one model call per token each); an "
        "integer >= 1",
    }

    def evaluations(self, features: int) -> int:
        return self.params["samples"] * features  # one per feature of each ordering

    def explain(self, forward, content_1M, baseline, target, per_eval):
        from captum.attr import ShapleyValueSampling as Captum

        explainer = Captum(forward)
        return _sampled_attribute(self.params, explainer, content_1M, baseline, target, per_eval)


class KernelShap(_TokenPerturbation):
    """Captum KernelShap: ``samples`` coalitions drawn under the Shapley kernel, fitted by
    linear regression.

    Reference: Lundberg & Lee 2017, "A Unified Approach to Interpreting Model Predictions",
    NeurIPS.
    """

    name = "kernel-shap"
    passes = "samples forward per example, batched"
    description = "KernelSHAP over tokens, [MASK] baseline (Captum; samples=200)"
    in_default_run = False
    parameters = {**_TokenPerturbation.parameters, "samples": 200}
    parameter_docs = {
        **_TokenPerturbation.parameter_docs,
        "samples": "coalitions (token subsets) drawn per example, one model call each; an "
        "integer >= 1",
    }

    def explain(self, forward, content_1M, baseline, target, per_eval):
        if content_1M.shape[1] == 1:  # the Shapley kernel is undefined for one feature, whose
            # value this is
            return Occlusion.explain(self, forward, content_1M, baseline, target, per_eval)
        from captum.attr import KernelShap as Captum

        explainer = Captum(forward)
        return _sampled_attribute(self.params, explainer, content_1M, baseline, target, per_eval)


class Lime(_TokenPerturbation):
    """Captum Lime: ``samples`` Bernoulli(0.5) token subsets weighted by Captum's exponential
    cosine kernel (width 1), fitted by ridge regression (alpha 1: the official ``lime``
    package's regressor); ``regression=lasso`` is Captum's default fit (Lasso, alpha 0.01),
    which zeroes every token when the score moves by less than about 0.01.

    Reference: Ribeiro, Singh & Guestrin 2016, "'Why Should I Trust You?': Explaining the
    Predictions of Any Classifier", KDD.
    """

    name = "lime"
    passes = "samples forward per example, batched"
    description = "LIME over tokens, [MASK] baseline (Captum; samples=200)"
    in_default_run = False
    parameters = {**_TokenPerturbation.parameters, "samples": 200, "regression": "ridge"}
    choices = {**_TokenPerturbation.choices, "regression": ("ridge", "lasso")}
    parameter_docs = {
        **_TokenPerturbation.parameter_docs,
        "samples": "token subsets drawn per example, one model call each; an integer >= 1",
        "regression": "the surrogate's fit: ridge (alpha 1, the lime package's) or lasso "
        "(alpha 0.01, Captum's default)",
    }

    def explain(self, forward, content_1M, baseline, target, per_eval):
        from captum._utils.models.linear_model import SkLearnLasso, SkLearnRidge
        from captum.attr import Lime as Captum

        ridge = self.params["regression"] == "ridge"
        fit = SkLearnRidge(alpha=1.0) if ridge else SkLearnLasso(alpha=0.01)
        explainer = Captum(forward, interpretable_model=fit)
        return _sampled_attribute(self.params, explainer, content_1M, baseline, target, per_eval)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [Occlusion(), ShapleyValueSampling(), KernelShap(), Lime()]
