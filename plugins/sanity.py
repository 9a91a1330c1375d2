"""Sanity check by model-parameter randomisation (Adebayo et al., NeurIPS 2018), cascading.

Step 1 re-initialises the classification head (every module outside the encoder, plus the
pooler); step s > 1 also re-initialises encoder layers L, L - 1, ..., L - s + 2, from the top
down. After each step the method attributes the same batch on the randomised model and the
score is the Spearman correlation between that attribution and the one on the trained model
(the method's last aggregated row, or ``layer=l``; over the example's real tokens, special
tokens kept unless ``drop_special=true``). Steps are reported as layers: "layer" s of the result
is step s. A faithful method decorrelates (near 0) as soon as the head is random; a method whose
attribution barely changes does not depend on what the model learned (lower is better).

Which class a class-specific method (``target=predicted``) explains on the randomised model:
``target=randomised`` (the default) the randomised model's own prediction, ``target=trained``
the trained model's, so that only the model changes between the two attributions and not the
question asked of it. Methods without a target (the attention family, ``random``) and
``target=gold`` are unaffected.

Tied weights (a language model whose head is its input embedding matrix, as SmolLM2's): the
randomised copy is untied first (``untied_copy``), so step 1 re-initialises the head alone and
the input embeddings stay trained at every step, as on an untied model. Re-initialising the
shared matrix would randomise the input too, and step 1 would not be the head's step.

Re-initialisation draws like BERT's own initialiser (Linear and Embedding weights from
N(0, initializer_range), biases 0, LayerNorm weight 1 and bias 0) from a generator seeded by the
run seed and the step, so every batch and method sees the same randomised models. Cost: the
method runs ``steps`` more times per batch (default L + 1) on one deep copy of the model.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

import attrib_bench
from attrib_bench import Attribution, Batch, Configurable, EvalContext, Trace
from attrib_bench.model.trace import trace_batch
from attrib_bench.results.stats import spearman_rows
from attrib_bench.toolkit.erasure import candidates, example_generator
from attrib_bench.toolkit.perturbed_inputs import example_batch, shifted_embeddings
from attrib_bench.toolkit.ranking import scored_row

if TYPE_CHECKING:
    from attrib_bench.core.loaded_model import LoadedModel


def reinitialize(module: nn.Module, std: float, generator: torch.Generator) -> None:
    """Fresh weights for every submodule, as BERT's initialiser draws them."""
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, (nn.Linear, nn.Embedding)):
                sub.weight.normal_(0.0, std, generator=generator)
            elif isinstance(sub, nn.LayerNorm) or "LayerNorm" in type(sub).__name__:
                if getattr(sub, "weight", None) is not None:
                    sub.weight.fill_(1.0)
            else:
                continue
            if getattr(sub, "bias", None) is not None:
                sub.bias.zero_()


def untied_copy(model: nn.Module) -> nn.Module:
    """A deep copy whose output embeddings own their weights (a copy of the tied matrix)."""
    copied = copy.deepcopy(model)
    output = copied.get_output_embeddings()
    if output is not None and output.weight is copied.get_input_embeddings().weight:
        output.weight = nn.Parameter(output.weight.detach().clone())
    return copied


def reinitialize_step(
    modules: list[nn.Module], std: float, device: torch.device, seed: int, step: int
) -> None:
    """Step ``step`` of the cascade: its modules re-initialised from (seed, step), so every
    batch, method and evaluator sees the same randomised models."""
    generator = torch.Generator(device=device).manual_seed(seed * 1000 + step)
    for module in modules:
        reinitialize(module, std, generator)


def cascade(model: nn.Module, layers: list[nn.Module]) -> list[list[nn.Module]]:
    """The modules each step re-initialises: the head first, then layers from the top down."""
    base = model.base_model
    head = [child for child in model.children() if child is not base]
    if getattr(base, "pooler", None) is not None:
        head.append(base.pooler)
    return [head, *[[layer] for layer in reversed(layers)]]


class ModelRandomization(Configurable):
    """Spearman between the attributions on the trained and the cascading-randomised model.

    Reference: Adebayo et al. 2018, "Sanity Checks for Saliency Maps", NeurIPS.
    """

    name = "sanity"
    description = (
        "Spearman between attributions on the trained and cascading-randomised model "
        "(head, then layers top-down); lower is better"
    )
    needs_reference = False
    in_default_run = False
    higher_is_better = False
    family = "sanity"
    parameters = {"steps": -1, "layer": -1, "drop_special": False, "target": "randomised"}
    choices = {"target": ("randomised", "trained")}
    parameter_docs = {
        "steps": "randomisation steps: 1 re-initialises the head, s also layers L..L-s+2; -1, "
        "the head and every layer (L + 1 steps); -1 or an integer >= 1",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "drop_special": "leave [CLS], [SEP] and the other special tokens out of the Spearman "
        "correlation",
        "target": "the class a method with target=predicted explains on the randomised model: "
        "randomised, that model's own prediction; trained, the trained model's",
    }

    def validate(self) -> None:
        if self.params["steps"] == 0 or self.params["steps"] < -1:
            raise self.out_of_range("steps", "-1 (head and every layer) or >= 1")
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        if context.attributor is None:
            raise ValueError("the sanity check needs the attributor to re-run it")
        trace, batch = context.trace, context.trace.batch
        keep_BN = batch.attention_mask_BN.bool()
        if self.params["drop_special"]:
            keep_BN &= ~batch.special_tokens_mask_BN.bool()
        keep_BN = keep_BN.cpu().numpy()
        trained_BN = scored_row(attribution, self.params["layer"]).detach().cpu().numpy()
        model = untied_copy(trace.loaded.model)
        loaded = dataclasses.replace(trace.loaded, model=model)
        layers = loaded.adapter.layers
        steps = cascade(model, layers)
        if self.params["steps"] != -1:
            steps = steps[: self.params["steps"]]
        std = getattr(model.config, "initializer_range", 0.02)
        requires = context.attributor.requires
        out = []
        for step, modules in enumerate(steps, start=1):
            reinitialize_step(modules, std, loaded.device, context.seed, step)
            randomized_trace = trace_batch(
                loaded, batch, requires, trace.seed, fields=trace.field_specs, target=trace.target
            )
            if self.params["target"] == "trained":
                # A trace's logits name its predicted class (Trace.predicted_B, and the target
                # class and runner-up foil: Trace.target_classes_B, target_foils_B).
                randomized_trace.logits_BC = trace.logits_BC
            randomized = context.attributor.attribute(randomized_trace)
            random_BN = scored_row(randomized, self.params["layer"]).detach().cpu().numpy()
            out.append(
                [
                    spearman_rows(trained_BN[b][keep_BN[b]], random_BN[b][keep_BN[b]])
                    for b in range(len(batch.examples))
                ]
            )
        return {"aggregated": np.asarray(out, dtype=float)}


def randomised(trace: Trace, seed: int) -> LoadedModel:
    """The fully randomised model, the cascade's last step (head and every layer, drawn as
    ``sanity`` draws them), built once per batch and seed."""

    def build() -> LoadedModel:
        model = untied_copy(trace.loaded.model)
        loaded = dataclasses.replace(trace.loaded, model=model)
        std = getattr(model.config, "initializer_range", 0.02)
        for step, modules in enumerate(cascade(model, loaded.adapter.layers), start=1):
            reinitialize_step(modules, std, loaded.device, seed, step)
        return loaded

    return trace.memo(f"sanity/randomised/{seed}", build)


def attribute_on(
    attributor: Any,
    loaded: LoadedModel,
    batch: Batch,
    trace: Trace,
    logits_BC: torch.Tensor,
    layer: int,
) -> torch.Tensor:
    """``attributor``'s scored row (B, N) of ``batch`` on ``loaded``, traced as ``trace`` was,
    explaining the class the trained model's ``logits_BC`` name (the same question of both
    models), float64 on the CPU."""
    traced = trace_batch(
        loaded, batch, attributor.requires, trace.seed, trace.field_specs, trace.target
    )
    traced.logits_BC = logits_BC
    rows_BN = scored_row(attributor.attribute(traced), layer).detach().double().cpu()
    traced.release_graph()
    return rows_BN


def histogram_entropy(values: np.ndarray, bins: int) -> float:
    """The entropy of the histogram of ``values`` in ``bins`` equal bins over their range
    (Quantus's ``discrete_entropy``); NaN for no values."""
    from scipy.stats import entropy  # scipy: not at `list` time

    if len(values) == 0:
        return float("nan")
    return float(entropy(np.histogram(values, bins=bins)[0]))


class _Randomisation(Configurable):
    needs_reference = False
    in_default_run = False  # the method runs again on a randomised copy of the model
    family = "randomisation"

    def validate(self) -> None:
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")

    def attributor(self, context: EvalContext) -> Any:
        if context.attributor is None:
            raise ValueError(f"{self.name} needs the attributor to re-run it")
        return context.attributor


class EfficientMPRT(_Randomisation):
    """eMPRT: the relative rise in the complexity of the explanation from the trained to the
    fully randomised model.

    Complexity is the entropy of the histogram of the method's scored row over the candidate
    tokens (real, not special), in ``bins`` equal bins over the row's range, as Quantus's
    ``EfficientMPRT`` with its default ``complexity_func`` (``discrete_entropy``, 100 bins,
    raw signed scores). The fully randomised model is ``sanity``'s last step (head and every
    layer re-initialised, the embeddings kept, seeded by the run seed), and the method explains
    the trained model's class on it. Per example (H_random - H_trained) / H_trained, NaN where
    H_trained is 0 (every score in one bin). Higher is better: a method that reads the model
    gives noisier explanations of a random one; a method that ignores the model scores 0.
    Quantus's extra scores (``compute_extra_scores``, off by default) are not computed. Cost: the
    method runs once more per batch.

    Reference: Hedström et al. 2023, "Sanity Checks Revisited: An Exploration to Repair the
    Model Parameter Randomisation Test", XAI in Action workshop, NeurIPS.
    """

    name = "emprt"
    description = (
        "Efficient MPRT: relative rise of the histogram entropy of the scores from the trained "
        "to the fully randomised model; higher is better"
    )
    higher_is_better = True
    parameters = {"bins": 100, "layer": -1}
    parameter_docs = {
        "bins": "equal-width bins of the histogram whose entropy is the complexity (Quantus's "
        "default 100); an integer >= 1",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
    }

    def validate(self) -> None:
        super().validate()
        if self.params["bins"] < 1:
            raise self.out_of_range("bins", ">= 1")

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        attributor, trace = self.attributor(context), context.trace
        layer, bins = self.params["layer"], self.params["bins"]
        trained_BN = scored_row(attribution, layer).detach().double().cpu().numpy()
        loaded = randomised(trace, context.seed)
        random_BN = attribute_on(
            attributor, loaded, trace.batch, trace, trace.logits_BC, layer
        ).numpy()
        values = []
        for trained_N, random_N, keep_N in zip(
            trained_BN, random_BN, candidates(trace), strict=True
        ):
            before = histogram_entropy(trained_N[keep_N], bins)
            after = histogram_entropy(random_N[keep_N], bins)
            values.append((after - before) / before if before > 0 else float("nan"))
        return {"aggregated": np.asarray([values], dtype=float)}


class SmoothMPRT(_Randomisation):
    """sMPRT: the Spearman correlation between the trained and the fully randomised model's
    explanations, each first averaged over noisy copies of the input.

    Per example, alone over its real tokens, the method runs on ``samples`` copies of the input
    on each model: ``samples - 1`` with Gaussian noise added to the embedding output
    (``LoadedModel.embeddings``) of the candidate tokens (real, not special), of standard
    deviation ``noise`` times the range (max - min) of those tokens' embedding values, and the
    input itself (Quantus's ``SmoothMPRT``: its noise_magnitude 0.1 relative to the input's
    range, the last sample noise-free). Both models see the same noise, drawn from (run seed +
    ``seed``, example id), and explain the trained model's class. The two averages are
    compared as Quantus does by default: the Spearman correlation of their magnitudes (its
    ``abs=True``; its normalisation does not change ranks) over the candidate tokens. The fully
    randomised model is ``sanity``'s last step, as for ``emprt``. Lower is better: 1 for a
    method that ignores the model. Cost: the method runs 2 x ``samples`` times per example, a
    batch of one each.

    Reference: Hedström et al. 2023, "Sanity Checks Revisited: An Exploration to Repair the
    Model Parameter Randomisation Test", XAI in Action workshop, NeurIPS.
    """

    name = "smprt"
    description = (
        "Smooth MPRT: Spearman between the noise-averaged attributions on the trained and the "
        "fully randomised model; lower is better"
    )
    higher_is_better = False
    parameters = {"samples": 50, "noise": 0.1, "layer": -1, "seed": 0}
    parameter_docs = {
        "samples": "copies of the input each explanation is averaged over, the last one "
        "noise-free (Quantus's nr_samples, 50); an integer >= 1",
        "noise": "the noise's standard deviation relative to the range of the example's "
        "embedding values (Quantus's noise_magnitude, 0.1); >= 0",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "seed": "added to the run's seed; noise is drawn from (run seed + seed, example id); "
        "any integer",
    }

    def validate(self) -> None:
        super().validate()
        if self.params["samples"] < 1:
            raise self.out_of_range("samples", ">= 1")
        if not 0 <= self.params["noise"] < math.inf:
            raise self.out_of_range("noise", "a finite number >= 0")

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        trace = context.trace
        models = (trace.loaded, randomised(trace, context.seed))
        values = []
        for row, keep_N in enumerate(candidates(trace)):
            if not keep_N.any():
                values.append(float("nan"))
                continue
            real_N = trace.batch.attention_mask_BN[row].bool().cpu().numpy()
            trained_N, random_N = self.smoothed(context, row, keep_N[real_N], models)
            values.append(float(spearman_rows(np.abs(trained_N), np.abs(random_N))))
        return {"aggregated": np.asarray([values], dtype=float)}

    def smoothed(
        self, context: EvalContext, row: int, keep_N: np.ndarray, models: tuple[LoadedModel, ...]
    ) -> list[np.ndarray]:
        """Example ``row``'s explanation on each of ``models``, averaged over the noisy copies,
        over the candidate tokens ``keep_N`` (of its real tokens)."""
        trace, attributor = context.trace, self.attributor(context)
        one = example_batch(trace.batch, row)
        layer, samples = self.params["layer"], self.params["samples"]
        logits_1C = trace.logits_BC[row : row + 1]

        def explain(loaded: LoadedModel) -> torch.Tensor:
            return attribute_on(attributor, loaded, one, trace, logits_1C, layer)[0]

        embedded: list[torch.Tensor] = []  # the example's embedding output, for the noise scale
        handle = trace.loaded.embeddings.register_forward_hook(
            lambda _m, _a, output: embedded.append(output.detach())
        )
        try:
            clean = explain(models[0])
        finally:
            handle.remove()
        values_ND = embedded[0][0].double().cpu()[torch.as_tensor(keep_N)]
        std = self.params["noise"] * float(values_ND.max() - values_ND.min())
        generator = example_generator(
            trace.seed + self.params["seed"], f"{trace.batch.examples[row].id}/smprt"
        )
        noise_SND = torch.randn(
            samples - 1,
            len(keep_N),
            embedded[0].shape[-1],
            generator=generator,
            dtype=torch.float64,
        )
        noise_SND *= std * torch.as_tensor(keep_N, dtype=torch.float64)[:, None]
        out = []
        for loaded in models:
            rows = [clean if loaded is models[0] else explain(loaded)]
            for delta_ND in noise_SND:
                with shifted_embeddings(loaded, delta_ND, self.name):
                    rows.append(explain(loaded))
            out.append(torch.stack(rows).mean(dim=0).numpy()[keep_N])
        return out


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [ModelRandomization(), EfficientMPRT(), SmoothMPRT()]
