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

import numpy as np
import torch
from torch import nn

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext
from attrib_bench.model.trace import trace_batch
from attrib_bench.results.stats import spearman_rows
from attrib_bench.toolkit.ranking import scored_row


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
            generator = torch.Generator(device=loaded.device).manual_seed(
                context.seed * 1000 + step
            )
            for module in modules:
                reinitialize(module, std, generator)
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


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [ModelRandomization()]
