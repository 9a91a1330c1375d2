"""Gradient methods at the embedding layer (docs/math/gradients.md): ``saliency`` and
``gradient`` backpropagate through the trace's own forward pass (equal to Captum's
LayerGradientXActivation, tests/test_gradient.py), the others run Captum.

``layer=embeddings`` (the default) attributes at the output of the embedding module
(``LoadedModel.embeddings``: an encoder family's ``hidden_states[0]``, after the embedding
LayerNorm, GlobEnc's convention; the token embeddings, ``get_input_embeddings()``, for a decoder
language model and for any model without a spec); ``layer=word_embeddings`` at the output of the
word-embedding lookup (``get_input_embeddings()``), where ferret, Captum's tutorials and Inseq
attribute. The score differentiated is the run's target score (attrib_bench.core.target: by
default the logit of the predicted class; under ``score=contrastive`` the logit of ``class=``
minus that of its foil, per example; ``target=predicted|gold`` on the method overrides it with
that class's logit). Per token the hidden dimension is reduced by ``reduce``: ``l2`` (the default,
GlobEnc's), ``sum`` (signed) or ``abs-sum`` (ferret's plain gradient). A contrastive score (two
logits' difference) is no single output Captum could select, so the forward function then
returns the score itself. A language model's logits are read at each example's target position
(``target_logits``). Nothing but the model's own forward pass is needed, so these methods run on
any Hugging Face classifier or causal language model. ``cp-lrp`` and ``attnlrp`` are gradient x
input through a pass of their own whose backward carries the LRP rules
(``attrib_bench.toolkit.lrp_rules``, docs/math/lrp.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

import attrib_bench
from attrib_bench import Attribution, Batch, Configurable, Trace, UsageError
from attrib_bench.core.target import target_score
from attrib_bench.toolkit.budget import per_pass
from attrib_bench.toolkit.captum_inputs import (
    baseline_token,
    example_arguments,
    example_seed,
    explained_classes,
    scored_forward,
    seeded,
)
from attrib_bench.toolkit.graph_gradients import graph_gradients

if TYPE_CHECKING:  # model.load imports transformers, which `attrib-bench list` does without
    from attrib_bench.core.loaded_model import LoadedModel


def _attribution_layer(loaded: LoadedModel, choice: str) -> torch.nn.Module:
    """The module whose output is attributed: see the module docstring."""
    return loaded.embeddings if choice == "embeddings" else loaded.model.get_input_embeddings()


def _pad_baseline(trace: Trace) -> torch.Tensor:
    """The [PAD] baseline's token ids: special tokens kept, every other token [PAD]."""
    batch = trace.batch
    pad_id = trace.loaded.tokenizer.pad_token_id
    return torch.where(
        batch.special_tokens_mask_BN.bool(),
        batch.input_ids_BN,
        torch.full_like(batch.input_ids_BN, pad_id),
    )


def _padded(batch: Batch, row: int, values: torch.Tensor) -> torch.Tensor:
    """Example ``row``'s attribution over its real tokens, (1, n, D), at its places in the
    padded batch, (N, D): zero on padding."""
    real_N = batch.attention_mask_BN[row].bool()
    padded = values.new_zeros(batch.input_ids_BN.shape[1:] + values.shape[-1:])
    padded[real_N] = values[0]
    return padded


class _Scored(torch.nn.Module):
    """``scored_forward`` as a module: Captum's DeepLift hooks the nonlinear modules of a model."""

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__()
        self.model = loaded.model
        self.score = scored_forward(loaded)

    def forward(self, *args: torch.Tensor | None) -> torch.Tensor:
        return self.score(*args)


def _from_layer(loaded: LoadedModel, layer: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """``scored_forward`` as a function of ``layer``'s output (the token ids come as an argument):
    GradientShap interpolates and adds noise in its input space, which token ids are not."""
    forward = scored_forward(loaded)

    def from_layer(layer_output, input_ids, *args):
        handle = layer.register_forward_hook(lambda *_: layer_output)
        try:
            return forward(input_ids, *args)
        finally:
            handle.remove()

    return from_layer


@torch.no_grad()
def _layer_output(
    loaded: LoadedModel, layer: torch.nn.Module, input_ids: torch.Tensor, args: tuple
) -> torch.Tensor:
    """``layer``'s output on ``input_ids`` (``args``: ``scored_forward``'s other inputs)."""
    kept = []
    handle = layer.register_forward_hook(lambda _m, _a, output: kept.append(output))
    try:
        scored_forward(loaded)(input_ids, *args[:4])
    finally:
        handle.remove()
    return kept[0]


class _EmbeddingGradient(Configurable, ABC):
    requires = frozenset()
    family = "gradient"
    parameters = {"target": "run", "reduce": "l2", "layer": "embeddings"}
    parameter_docs = {
        "target": "the score differentiated: run, the run's --target score; predicted or gold, "
        "that class's logit",
        "reduce": "per token over the hidden dimension: l2 (GlobEnc's), sum (signed) or abs-sum "
        "(ferret's plain gradient)",
        "layer": "embeddings: the embedding module's output (after its LayerNorm, GlobEnc's); "
        "word_embeddings: the word-embedding lookup's output (ferret, Captum, Inseq)",
    }
    choices = {
        "target": ("run", "predicted", "gold"),
        "reduce": ("l2", "sum", "abs-sum"),
        "layer": ("embeddings", "word_embeddings"),
    }

    @abstractmethod
    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        """Attribution at the chosen layer's output, (B, N, D); each subclass is one Captum
        method."""

    def layer(self, trace: Trace) -> torch.nn.Module:
        return _attribution_layer(trace.loaded, self.params["layer"])

    def explained_target(self, trace: Trace) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The classes (and foils) this method's ``target=`` explains: what the removal
        evaluators score (attrib_bench.core.interfaces.scored_classes)."""
        return explained_classes(trace, self.params["target"])

    def attribute(self, trace: Trace) -> Attribution:
        batch = trace.batch
        classes_B, foils_B = self.explained_target(trace)
        values_BND = self.per_dimension(trace, classes_B, foils_B).detach()
        reduce = self.params["reduce"]
        if reduce == "l2":
            scores_BN = values_BND.norm(dim=-1)
        elif reduce == "sum":
            scores_BN = values_BND.sum(dim=-1)
        else:
            scores_BN = values_BND.abs().sum(dim=-1)
        scores_BN = scores_BN * batch.attention_mask_BN
        return Attribution(aggregated_BLN=scores_BN[:, None, :])


class Saliency(_EmbeddingGradient):
    """Gradient x input (the GlobEnc reference saliency), equal to Captum's
    LayerGradientXActivation (tests/test_gradient.py).

    Reference: Shrikumar et al. 2016, "Not Just a Black Box: Learning Important Features
    Through Propagating Activation Differences", arXiv:1605.01713 (gradient x input).

    Both backpropagate through the trace's forward pass, and on one batch the methods that
    explain the same classes and foils share one backward pass
    (``attrib_bench.toolkit.graph_gradients``): ``saliency`` and ``gradient`` at both layers at
    once, and the attention x gradient methods' pass when one of them ran first; each is still
    charged the forward and that backward, as if run alone.
    """

    name = "saliency"
    passes = "1 backward per batch, through the traced pass (shared with gradient)"
    requires = frozenset({"embedding_graph"})
    description = "Gradient x input at the embedding output, L2 per token (as Captum's)"
    multiply_by_inputs = True

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        gradient = graph_gradients(trace, classes_B, foils_B).layers[self.params["layer"]]
        activation = trace.need("embedding_graph")[1][self.params["layer"]].detach()
        # Captum's LayerGradientXActivation multiplies the same two tensors the same way.
        return gradient * activation if self.multiply_by_inputs else gradient


class Gradient(Saliency):
    """The plain gradient, with ``saliency``'s backward pass.

    Reference: Simonyan, Vedaldi & Zisserman 2014, "Deep Inside Convolutional Networks:
    Visualising Image Classification Models and Saliency Maps", ICLR workshop.
    """

    name = "gradient"
    passes = "1 backward per batch, shared with saliency"
    description = "Plain gradient at the embedding output, L2 per token (as Captum's)"
    multiply_by_inputs = False


class IntegratedGradients(_EmbeddingGradient):
    """Captum LayerIntegratedGradients on the attribution layer, [PAD] baseline.

    The baseline keeps the special tokens and replaces every other token by [PAD], so the path
    runs from a content-free input of the same length to the real one. Captum embeds the
    baseline by running the model on its token ids, so both runs get the real input's position
    ids: RoBERTa-family models would otherwise renumber the baseline's tokens around its [PAD]s.

    Each example's path runs over its real tokens alone (Captum called per example), so no
    pass computes padding (14% of the tokens of length-sorted batches of 16 SST-2 sentences).
    A pass holds path steps of one example, as many as fit in ``chunk_tokens`` tokens (2048:
    eight steps of a 255-token review, all 50 of a 40-token sentence), so peak memory is bounded
    by the budget, not by ``--batch-size``, ``steps`` or the input's length
    (attrib_bench.toolkit.budget.per_pass: as many passes as needed, as even as their number
    allows; a step longer than the budget runs alone). The chunking changes only the order in
    which the steps' gradients are summed. The passes run under sdpa (``scored_forward``).

    Reference: Sundararajan, Taly & Yan 2017, "Axiomatic Attribution for Deep Networks", ICML.
    """

    name = "integrated-gradients"
    passes = "steps forward and backward per example"
    description = "Integrated Gradients on the embeddings, [PAD] baseline (Captum; steps=50)"
    parameters = {**_EmbeddingGradient.parameters, "steps": 50, "chunk_tokens": 2048}
    parameter_docs = {
        **_EmbeddingGradient.parameter_docs,
        "steps": "points on the path from the [PAD] baseline to the input (Captum's n_steps); "
        "an integer >= 1",
        "chunk_tokens": "the most tokens in one pass (path steps of one example); bounds "
        "memory, changes only the order the steps are summed in; an integer >= 1",
    }

    def validate(self) -> None:
        if self.params["steps"] < 1:
            raise self.out_of_range("steps", ">= 1")
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    @property
    def completeness(self) -> str | None:
        """Signed per-token sums (``reduce=sum``) add up to f(x) - f([PAD] baseline), up to the
        path integral's error (Captum's convergence delta); a norm per token sums to nothing."""
        return "score-change" if self.params["reduce"] == "sum" else None

    def completeness_baseline(self, trace: Trace) -> torch.Tensor:
        return _pad_baseline(trace)

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        from captum.attr import LayerIntegratedGradients

        batch = trace.batch
        method = LayerIntegratedGradients(scored_forward(trace.loaded), self.layer(trace))
        steps, budget = self.params["steps"], self.params["chunk_tokens"]
        baseline_BN = _pad_baseline(trace)
        rows = []
        for row in range(len(batch.input_ids_BN)):
            ids, arguments = example_arguments(trace, row, classes_B, foils_B)
            real_N = batch.attention_mask_BN[row].bool()
            values = method.attribute(
                ids,
                baselines=baseline_BN[row : row + 1, real_N],
                **arguments,
                n_steps=steps,
                internal_batch_size=per_pass(steps, ids.shape[1], budget),
            )
            rows.append(_padded(batch, row, values))
        return torch.stack(rows)


class SequentialIntegratedGradients(IntegratedGradients):
    """Sequential Integrated Gradients: each token's attribution is its row of Integrated
    Gradients along a path on which only that token moves, from the baseline token to itself,
    every other token fixed at its own value (Captum LayerIntegratedGradients, one path per
    candidate token). A token's signed sum (``reduce=sum``) therefore adds up to f(x) - f(x
    with that token replaced by the baseline), up to the path integral's error; the row as a
    whole claims no completeness.

    The baseline token is [MASK] (``baseline=auto`` where the tokenizer has one; the paper's
    choice), else [PAD]; special tokens are not attributed (0). Each example runs alone over
    its real tokens; a pass holds path steps of one token's path, at most ``chunk_tokens``
    tokens. Cost: ``steps`` forward and backward passes per candidate token.

    Reference: Enguehard 2023, "Sequential Integrated Gradients: a simple but effective method
    for explaining language models", Findings of ACL.
    """

    name = "sequential-integrated-gradients"
    passes = "steps forward and backward per token"
    in_default_run = False
    description = "Sequential IG: one IG path per token, the others fixed ([MASK] baseline)"
    parameters = {**IntegratedGradients.parameters, "baseline": "auto"}
    choices = {**IntegratedGradients.choices, "baseline": ("auto", "mask", "pad")}
    parameter_docs = {
        **IntegratedGradients.parameter_docs,
        "steps": "points on each token's path (Captum's n_steps); an integer >= 1",
        "baseline": "the token each path starts from: auto ([MASK] where the tokenizer has "
        "one, else [PAD]), mask or pad",
        "chunk_tokens": "the most tokens in one pass (path steps of one token's path); bounds "
        "memory; an integer >= 1",
    }
    completeness = None

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        from captum.attr import LayerIntegratedGradients

        batch = trace.batch
        method = LayerIntegratedGradients(scored_forward(trace.loaded), self.layer(trace))
        steps, budget = self.params["steps"], self.params["chunk_tokens"]
        baseline = baseline_token(trace.loaded, self.params["baseline"])
        rows = []
        for row in range(len(batch.input_ids_BN)):
            ids, arguments = example_arguments(trace, row, classes_B, foils_B)
            real_N = batch.attention_mask_BN[row].bool()
            special_n = batch.special_tokens_mask_BN[row][real_N].bool()
            values = None
            for token in torch.nonzero(~special_n).flatten().tolist():
                start = ids.clone()
                start[0, token] = baseline
                path = method.attribute(
                    ids,
                    baselines=start,
                    **arguments,
                    n_steps=steps,
                    internal_batch_size=per_pass(steps, ids.shape[1], budget),
                )
                values = torch.zeros_like(path) if values is None else values
                values[:, token] = path[:, token]
            if values is None:  # no candidate token: a path from the input itself, all zero
                values = method.attribute(ids, baselines=ids, **arguments, n_steps=1)
            rows.append(_padded(batch, row, values))
        return torch.stack(rows)


class DiscretizedIntegratedGradients(_EmbeddingGradient):
    """Discretized Integrated Gradients: the path from the [PAD] baseline to each word runs
    through anchor words of the vocabulary (the neighbour graph of the word-embedding matrix,
    ``neighbours`` nearest each), each anchor made monotonic between the baseline and the point
    before it, and the gradients at the path's points are summed times the steps between them,
    as the official code (``attrib_bench.toolkit.discretized_paths``, docs/math/discretized-ig.md).

    The path lies among word embeddings, so the attribution layer is the word-embedding lookup.
    Special tokens keep their own embedding along the path (their baseline is themselves) and
    get 0. Each example runs alone over its real tokens, the path's points in passes of at most
    ``chunk_tokens`` tokens. The official code divides each row by its L2 norm, a positive
    factor that changes no ranking; it is not applied here.

    Reference: Sanyal & Ren 2021, "Discretized Integrated Gradients for Explaining Language
    Models", EMNLP.
    """

    name = "discretized-integrated-gradients"
    passes = "steps + 2 forward and backward per example"
    in_default_run = False  # (steps + 2) forward and backward passes per example
    description = "Discretized IG: a path through anchor words to the [PAD] baseline (steps=30)"
    parameters = {
        **_EmbeddingGradient.parameters,
        "reduce": "sum",
        "layer": "word_embeddings",
        "steps": 30,
        "neighbours": 500,
        "strategy": "greedy",
        "upscale": 0,
        "chunk_tokens": 2048,
    }
    choices = {
        **_EmbeddingGradient.choices,
        "layer": ("word_embeddings",),
        "strategy": ("greedy", "maxcount"),
    }
    parameter_docs = {
        **_EmbeddingGradient.parameter_docs,
        "reduce": "per token over the hidden dimension: sum (signed, the official code's), l2 "
        "or abs-sum",
        "layer": "word_embeddings only: the path's points are word embeddings",
        "steps": "anchor words per path (the official m, default 30): steps + 2 points",
        "neighbours": "the neighbour graph's k nearest words per word (official 500); an "
        "integer >= 1, capped at the vocabulary's size minus one",
        "strategy": "the next anchor: greedy, the neighbour closest to its monotonic version "
        "(official default); maxcount, the one with the most monotonic dimensions",
        "upscale": "times a midpoint is inserted between consecutive points (the official "
        "factor f, default 0): 2^f (steps + 1) + 1 points",
        "chunk_tokens": "the most tokens in one pass (path points of one example); bounds "
        "memory; an integer >= 1",
    }
    completeness = None

    def validate(self) -> None:
        for key, low in (("steps", 1), ("neighbours", 1), ("upscale", 0), ("chunk_tokens", 1)):
            if self.params[key] < low:
                raise self.out_of_range(key, f">= {low}")

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        from attrib_bench.toolkit.discretized_paths import monotonic_path, word_paths

        loaded, batch = trace.loaded, trace.batch
        layer = self.layer(trace)
        words_VD = getattr(layer, "weight", None)
        if not isinstance(words_VD, torch.Tensor) or words_VD.dim() != 2:
            raise UsageError(
                f"{self.name}: the input embeddings of {loaded.model.config.model_type} are "
                "not a vocabulary matrix, so there is no neighbour graph to draw paths from"
            )
        forward = _from_layer(loaded, layer)
        steps, budget = self.params["steps"], self.params["chunk_tokens"]
        baseline_BN = _pad_baseline(trace)
        rows = []
        for row in range(len(batch.input_ids_BN)):
            ids, arguments = example_arguments(trace, row, classes_B, foils_B)
            real_N = batch.attention_mask_BN[row].bool()
            bases = baseline_BN[row, real_N].tolist()
            with torch.no_grad():
                paths = word_paths(
                    layer,
                    ids[0].tolist(),
                    bases,
                    steps,
                    self.params["strategy"],
                    self.params["neighbours"],
                )
                points = [
                    monotonic_path(words_VD.detach(), path, base, steps, self.params["upscale"])
                    for path, base in zip(paths, bases, strict=True)
                ]
            points_PND = torch.stack(points, dim=1).to(words_VD.device)
            gradients_PND = self.path_gradients(forward, ids, arguments, points_PND, budget)
            moves_PND = torch.cat([points_PND[1:] - points_PND[:-1], points_PND[:1] * 0])
            values = (gradients_PND * moves_PND).sum(dim=0, keepdim=True)
            rows.append(_padded(batch, row, values))
        return torch.stack(rows)

    @staticmethod
    def path_gradients(
        forward: Callable[..., torch.Tensor],
        ids_1N: torch.Tensor,
        arguments: dict,
        points_PND: torch.Tensor,
        budget: int,
    ) -> torch.Tensor:
        """The gradient of the explained score at each point (P, N, D), the word embeddings set
        to the point, in passes of at most ``budget`` tokens."""
        args = arguments["additional_forward_args"]
        classes = arguments["target"]
        gradients = []
        for part in points_PND.split(per_pass(len(points_PND), ids_1N.shape[1], budget)):
            copies = len(part)
            part = part.detach().requires_grad_()
            tiled = [None if a is None else a.expand(copies, *a.shape[1:]) for a in args]
            out = forward(part, ids_1N.expand(copies, -1), *tiled)
            if classes is not None:
                out = out.gather(1, classes.expand(copies)[:, None])[:, 0]
            (gradient,) = torch.autograd.grad(out.sum(), part)
            gradients.append(gradient)
        return torch.cat(gradients)


class DeepLift(_EmbeddingGradient):
    """Captum LayerDeepLift (rescale rule) on the attribution layer, [PAD] baseline as in
    integrated-gradients.

    Captum applies DeepLift's rescale rule to the nonlinearities that are modules of a type it
    knows (in BERT the pooler's ``nn.Tanh``); GELU (``GELUActivation``), the attention softmax
    and LayerNorm are functional or unknown to it, so their multipliers are their gradients at
    the input: on a model with none it knows (RoBERTa's head uses ``torch.tanh``) the result is
    gradient x (input - baseline) at the layer. Reported as Captum computes it.

    Reference: Shrikumar, Greenside & Kundaje 2017, "Learning Important Features Through
    Propagating Activation Differences", ICML.
    """

    name = "deeplift"
    passes = "2 forward and 1 backward per example (input and baseline)"
    in_default_run = False  # 12x a forward pass on MiniLM (two passes and a backward, hooked)
    description = "DeepLift (rescale) on the embeddings, [PAD] baseline (Captum LayerDeepLift)"

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        import warnings

        from captum.attr import LayerDeepLift

        batch = trace.batch
        method = LayerDeepLift(_Scored(trace.loaded), self.layer(trace))
        baseline_BN = _pad_baseline(trace)
        rows = []
        # One example at a time over its real tokens: the rescale rule divides differences of
        # near-equal activations, which turns the float noise padding adds into visible changes.
        for row in range(batch.input_ids_BN.shape[0]):
            ids, arguments = example_arguments(trace, row, classes_B, foils_B)
            real_N = batch.attention_mask_BN[row].bool()
            with warnings.catch_warnings():  # Captum says it hooks the nonlinearities, each call
                warnings.filterwarnings("ignore", message=".*non-linear.*")
                warnings.filterwarnings("ignore", message=".*reused.*")
                values = method.attribute(
                    ids, baselines=baseline_BN[row : row + 1, real_N], **arguments
                )
            rows.append(_padded(batch, row, values))
        return torch.stack(rows)


class GradientShap(_EmbeddingGradient):
    """Captum GradientShap on the attribution layer's output, per example, seeded.

    The baseline distribution: ``baselines`` sequences of the example's length, special tokens
    kept and every other token drawn uniformly from the vocabulary's non-special tokens, embedded
    at the real input's positions; Captum draws ``samples`` (baseline, point on the path) pairs
    and adds Gaussian noise of ``stdevs`` to the layer output. Everything random is drawn from a
    seed of (run seed + ``seed``, example id), example by example.

    Reference: Lundberg & Lee 2017, "A Unified Approach to Interpreting Model Predictions",
    NeurIPS (GradientSHAP is Captum's gradient approximation of SHAP values).
    """

    name = "gradient-shap"
    passes = "samples forward and backward per example"
    in_default_run = False  # 51x a forward pass on MiniLM at samples=16
    description = "GradientSHAP on the embeddings, random-token baselines (Captum; samples=16)"
    parameters = {
        **_EmbeddingGradient.parameters,
        "samples": 16,
        "baselines": 8,
        "stdevs": 0.0,
        "seed": 0,
    }
    parameter_docs = {
        **_EmbeddingGradient.parameter_docs,
        "samples": "(baseline, point on the path) pairs Captum draws per example; an integer >= 1",
        "baselines": "random baseline sequences per example: special tokens kept, the others "
        "drawn from the non-special vocabulary; an integer >= 1",
        "stdevs": "standard deviation of the Gaussian noise added to the layer output; >= 0",
        "seed": "added to the run's seed; draws are seeded by (run seed + seed, example id); "
        "any integer",
    }

    def validate(self) -> None:
        for key in ("samples", "baselines"):
            if self.params[key] < 1:
                raise self.out_of_range(key, ">= 1")
        if self.params["stdevs"] < 0:
            raise self.out_of_range("stdevs", ">= 0")

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        from captum.attr import GradientShap as CaptumGradientShap

        loaded, batch, layer = trace.loaded, trace.batch, self.layer(trace)
        special = torch.tensor(loaded.tokenizer.all_special_ids, device=loaded.device)
        vocabulary = torch.arange(loaded.model.get_input_embeddings().num_embeddings)
        vocabulary = vocabulary[~torch.isin(vocabulary, special.cpu())].to(loaded.device)
        method = CaptumGradientShap(_from_layer(loaded, layer))
        rows = []
        for row in range(batch.input_ids_BN.shape[0]):
            ids, arguments = example_arguments(trace, row, classes_B, foils_B)
            args = arguments["additional_forward_args"]
            with seeded(example_seed(self.params["seed"], trace, row), loaded.device):
                picks = torch.randint(len(vocabulary), (self.params["baselines"], ids.shape[1]))
                keep = torch.isin(ids, special)
                baseline_ids = torch.where(keep, ids, vocabulary[picks.to(loaded.device)])
                repeated = tuple(
                    None if a is None or a.ndim < 2 else a.expand(len(baseline_ids), -1)
                    for a in args[:4:2]
                )
                expanded = (repeated[0], args[1].expand(len(baseline_ids)), repeated[1])
                position_ids = None if args[3] is None else args[3].expand(len(baseline_ids), -1)
                baselines = _layer_output(loaded, layer, baseline_ids, (*expanded, position_ids))
                values = method.attribute(
                    _layer_output(loaded, layer, ids, args),
                    baselines=baselines,
                    n_samples=self.params["samples"],
                    stdevs=self.params["stdevs"],
                    target=arguments["target"],
                    additional_forward_args=(ids, *args),
                )
            rows.append(_padded(batch, row, values))
        return torch.stack(rows)


class _NoiseTunnel(_EmbeddingGradient):
    """Captum NoiseTunnel over ``saliency`` or ``gradient`` at the attribution layer's output,
    per example over its real tokens, seeded: Captum adds Gaussian noise to the layer output
    (token ids take none), computes the base attribution (Captum's InputXGradient or, with
    ``base=gradient``, its Saliency without the absolute value) at each of ``samples`` noisy
    copies and combines them per dimension (``nt_type``); ``reduce`` then applies. The noise's
    standard deviation is ``noise`` times the range (max - min) of the example's layer output
    over its real tokens, the relative noise level of Smilkov et al. Captum draws the noise
    from a seed of (run seed, example id), so no example's rows depend on its batch. The noisy
    copies run in passes of at most ``chunk_tokens`` tokens; Captum draws each pass's noise in
    turn, so on a hidden size that is not a multiple of 16 (or on a GPU) another budget can
    draw other noise of the same distribution.
    """

    nt_type: str
    in_default_run = False  # samples forward and backward passes per example
    passes = "samples forward and backward per example"
    least_samples = 1
    parameters = {
        **_EmbeddingGradient.parameters,
        "base": "saliency",
        "samples": 50,
        "noise": 0.15,
        "chunk_tokens": 2048,
    }
    choices = {**_EmbeddingGradient.choices, "base": ("saliency", "gradient")}
    parameter_docs = {
        **_EmbeddingGradient.parameter_docs,
        "base": "the attribution taken at each noisy copy: saliency (gradient x input at the "
        "layer) or gradient (the plain gradient)",
        "samples": "noisy copies of each example (Captum's nt_samples); an integer >= 1",
        "noise": "the noise's standard deviation as a share of the range (max - min) of the "
        "example's layer output over its real tokens; >= 0",
        "chunk_tokens": "the most tokens in one pass (noisy copies of one example); bounds "
        "memory; an integer >= 1",
    }

    def validate(self) -> None:
        if self.params["samples"] < self.least_samples:
            raise self.out_of_range("samples", f">= {self.least_samples}")
        if not self.params["noise"] >= 0:  # NaN too
            raise self.out_of_range("noise", ">= 0")
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        from captum.attr import InputXGradient, NoiseTunnel
        from captum.attr import Saliency as CaptumSaliency

        loaded, batch, layer = trace.loaded, trace.batch, self.layer(trace)
        forward = _from_layer(loaded, layer)
        if self.params["base"] == "saliency":
            tunnel, options = NoiseTunnel(InputXGradient(forward)), {}
        else:
            tunnel, options = NoiseTunnel(CaptumSaliency(forward)), {"abs": False}
        samples = self.params["samples"]
        rows = []
        for row in range(batch.input_ids_BN.shape[0]):
            ids, arguments = example_arguments(trace, row, classes_B, foils_B)
            args = arguments["additional_forward_args"]
            output = _layer_output(loaded, layer, ids, args)
            stdev = self.params["noise"] * float(output.max() - output.min())
            with seeded(example_seed(0, trace, row), loaded.device):
                values = tunnel.attribute(
                    output,
                    nt_type=self.nt_type,
                    nt_samples=samples,
                    nt_samples_batch_size=per_pass(
                        samples, ids.shape[1], self.params["chunk_tokens"]
                    ),
                    stdevs=stdev,
                    target=arguments["target"],
                    additional_forward_args=(ids, *args),
                    **options,
                )
            rows.append(_padded(batch, row, values))
        return torch.stack(rows)


class SmoothGrad(_NoiseTunnel):
    """SmoothGrad: the mean of the base attribution (``saliency`` by default, or ``gradient``)
    over noisy copies of the attribution layer's output (Captum NoiseTunnel, ``smoothgrad``).

    Reference: Smilkov et al. 2017, "SmoothGrad: removing noise by adding noise",
    arXiv:1706.03825.
    """

    name = "smoothgrad"
    nt_type = "smoothgrad"
    description = (
        "SmoothGrad: mean of gradient x input over noisy embeddings (Captum NoiseTunnel; "
        "samples=50)"
    )


class VarGrad(_NoiseTunnel):
    """VarGrad: the variance of the base attribution (``saliency`` by default, or ``gradient``)
    over noisy copies of the attribution layer's output (Captum NoiseTunnel, ``vargrad``: the
    mean square minus the squared mean, per dimension). A variance over one copy is zero, so
    ``samples`` is at least 2.

    Reference: Adebayo et al. 2018, "Local Explanation Methods for Deep Neural Networks Lack
    Sensitivity to Parameter Values", ICLR workshop.
    """

    name = "vargrad"
    nt_type = "vargrad"
    least_samples = 2
    description = (
        "VarGrad: variance of gradient x input over noisy embeddings (Captum NoiseTunnel; "
        "samples=50)"
    )
    parameter_docs = {
        **_NoiseTunnel.parameter_docs,
        "samples": "noisy copies of each example (Captum's nt_samples); an integer >= 2",
    }


class _LRP(_EmbeddingGradient):
    """Gradient x input through the variant's rules; relevance summed per token. The pass under
    the rules is the trace's (``cp_lrp_graph``, ``attn_lrp_graph``): the traced pass itself
    when no other method of the batch needs a plain graph or the attention probabilities."""

    variant = ""
    family = "lrp"
    in_default_run = False
    parameters = {**_EmbeddingGradient.parameters, "reduce": "sum", "layer": "word_embeddings"}

    def per_dimension(
        self, trace: Trace, classes_B: torch.Tensor, foils_B: torch.Tensor | None
    ) -> torch.Tensor:
        (graph,) = trace.need(f"{self.variant}_lrp_graph")
        if graph.problem is not None:
            raise UsageError(f"{self.name}: {graph.problem}")
        layer = graph.layers[self.params["layer"]]
        score = target_score(graph.logits_BC, classes_B, foils_B).sum()
        (gradient,) = torch.autograd.grad(score, layer, retain_graph=True)
        return gradient * layer.detach()


class CPLRP(_LRP):
    """CP-LRP: gradient x input with the attention probabilities and the norms' scales held
    constant in the backward pass (and the identity rule on activations, LXT's efficient mode).

    Reference: Ali et al. 2022, "XAI for Transformers: Better Explanations through Conservative
    Propagation", ICML.
    """

    name = "cp-lrp"
    passes = "1 backward per batch, through the traced pass run under the rules"
    description = "CP-LRP (Ali et al. 2022): grad x input, softmax and norm scale held constant"
    variant = "cp"
    requires = frozenset({"cp_lrp_graph"})


class AttnLRP(_LRP):
    """AttnLRP in LXT's efficient mode: the identity rule on norms and activations, the uniform
    rule on the attention's two matrix products and on gated products.

    Reference: Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation
    for Transformers", ICML.
    """

    name = "attnlrp"
    passes = "1 backward per batch, through the traced pass run under the rules"
    description = "AttnLRP (Achtibat et al. 2024), LXT's efficient rules: one forward, one backward"
    variant = "attn"
    requires = frozenset({"attn_lrp_graph"})


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [
        Saliency(),
        Gradient(),
        IntegratedGradients(),
        DiscretizedIntegratedGradients(),
        SequentialIntegratedGradients(),
        DeepLift(),
        GradientShap(),
        SmoothGrad(),
        VarGrad(),
        CPLRP(),
        AttnLRP(),
    ]
