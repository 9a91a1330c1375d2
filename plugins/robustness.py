"""Robustness and infidelity of an attribution (Quantus's robustness family and Captum's
infidelity, for tokens): does the explanation stay put when the input barely moves, and does
it predict how the model's score moves?

Robustness re-runs the method being scored (``EvalContext.attributor``) on perturbed copies of
each example, alone over its real tokens (a batch of one: the scores never depend on batch
companions), and compares its scored row over the candidate tokens (real, not special) with
the row it gives the unperturbed example, re-attributed the same way (so a zero perturbation
scores exactly 0). The explained class stays the unperturbed example's (its trace's logits
are kept), so the explanation changes with the input, not with the question asked of it.

Embedding noise (``perturbation=embedding``): delta, uniform in [-radius, radius] per
coordinate (the L-infinity ball ``captum.metrics.sensitivity_max`` draws from by default) on
the candidate tokens, zero on the others, is added by a forward hook to every output of the
model's embedding module (``LoadedModel.embeddings``: an encoder's embedding output after its
LayerNorm, a decoder's token embeddings) while the method runs. Every kind of method sees it:
the attention family reads the traced forward pass, and the gradient (``gradient``, Captum's
layer methods) and perturbation methods run their own passes through the same module, so
their baselines, path steps and occluded inputs are shifted by the same delta: the method
explains the model x -> f(e(x) + delta). A pass of another length than the example's (a method
that deletes tokens) cannot be shifted and fails the pair with one line. Samples are drawn
from (run seed + ``seed``, example id).

Token swaps (``perturbation=swap``, the sensitivity evaluators): k = ceil(share * n) of the n
candidate tokens, drawn among those with a replacement, become a replacement drawn uniformly
from ``synonyms``, a JSON object word -> list of words (a token matches a word by its decoded
text, case-insensitive; a replacement must be one token, written with the token's leading
space). A model's own masked-LM head would be the other source; the classifiers and causal
LMs attrib-bench loads have none, so without a synonym list swaps fail with one UsageError.

- ``sensitivity-max`` / ``sensitivity-avg`` (Yeh et al. 2019): the max / mean over ``samples``
  of ||Phi(x') - Phi(x)||_2, divided by ||Phi(x)||_2 under ``normalise=true`` (Captum's and
  Quantus's default; a zero Phi(x) is divided by 1, as Captum does).
- ``local-lipschitz`` (Alvarez-Melis & Jaakkola 2018): the max over samples of
  ||Phi(x') - Phi(x)||_2 / ||e(x') - e(x)||_2, the denominator the noise's norm.
- ``infidelity`` (Yeh et al. 2019) through ``captum.metrics.infidelity``: see ``Infidelity``.

Lower is better for all. The three robustness evaluators with the same ``samples``, ``radius``
and ``seed`` share one set of re-attributions per method and batch (``Trace.memo``). Cost: the
method runs ``samples + 1`` more times per example, a batch of one each.
"""

from __future__ import annotations

import dataclasses
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext, UsageError
from attrib_bench.core.interfaces import Batch, scored_classes
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.erasure import candidates, example_generator, explained
from attrib_bench.toolkit.perturbed_inputs import example_batch, shifted_embeddings
from attrib_bench.toolkit.ranking import scored_row

if TYPE_CHECKING:
    from attrib_bench.core.trace import Trace

PERTURBATIONS = ("embedding", "swap")


def noise_generator(seed: int, example_id: str) -> torch.Generator:
    """The generator of an example's perturbations: (seed, example id), apart from the
    ``random`` attributor's stream of the same seed."""
    return example_generator(seed, f"{example_id}/robustness")


def embedding_noise(
    generator: torch.Generator, samples: int, keep_N: np.ndarray, hidden: int, radius: float
) -> torch.Tensor:
    """(samples, N, hidden) float32 on the CPU: uniform in [-radius, radius] at the ``keep_N``
    tokens, 0 elsewhere."""
    uniform = torch.rand(samples, len(keep_N), hidden, generator=generator)
    return (2 * uniform - 1) * radius * torch.as_tensor(keep_N, dtype=torch.float32)[:, None]


def load_synonyms(path: str, who: str) -> dict[str, list[str]]:
    """The synonym list of ``path``: a JSON object word -> list of words, keys lower-cased."""
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{who}:synonyms={path!r} cannot be read as JSON ({error})") from None
    if not isinstance(table, dict) or not all(
        isinstance(words, list) and all(isinstance(w, str) for w in words)
        for words in table.values()
    ):
        raise UsageError(f"{who}:synonyms={path!r} must be a JSON object word -> list of words")
    return {word.lower(): words for word, words in table.items()}


def replacements(tokenizer: Any, token_id: int, synonyms: dict[str, list[str]]) -> list[int]:
    """The one-token replacements of ``token_id``: its synonyms tokenised with its leading
    space, those that make one token other than itself."""
    text = tokenizer.decode([token_id])
    space = text[: len(text) - len(text.lstrip())]
    found = []
    for word in synonyms.get(text.strip().lower(), []):
        ids = tokenizer(space + word, add_special_tokens=False)["input_ids"]
        if len(ids) == 1 and ids[0] != token_id and ids[0] not in found:
            found.append(ids[0])
    return found


def swapped_ids(
    tokenizer: Any,
    ids_N: torch.Tensor,
    keep_N: np.ndarray,
    synonyms: dict[str, list[str]],
    share: float,
    samples: int,
    generator: torch.Generator,
) -> torch.Tensor | None:
    """(samples, N) token ids with ceil(share * n) of the n ``keep_N`` tokens swapped (among
    those with a replacement, see the module docstring); None when no token has one."""
    options = {
        position: found
        for position in np.flatnonzero(keep_N)
        if (found := replacements(tokenizer, int(ids_N[position]), synonyms))
    }
    if not options:
        return None
    count = min(len(options), math.ceil(round(share * int(keep_N.sum()), 9)))
    positions = list(options)
    out = ids_N.repeat(samples, 1)
    for sample in range(samples):
        chosen = torch.randperm(len(positions), generator=generator)[:count].tolist()
        for index in chosen:
            found = options[positions[index]]
            pick = int(torch.randint(len(found), (1,), generator=generator))
            out[sample, positions[index]] = found[pick]
    return out


def _method_key(attributor: Any) -> str:
    """What identifies a configured method: its name and parameters."""
    return f"{attributor.name}{sorted(getattr(attributor, 'params', {}).items())}"


@dataclasses.dataclass
class Perturbed:
    """One example's re-attributions: the unperturbed rows (1, L, n), each sample's, the
    candidate tokens (n,), and the norm of each sample's input change (embedding noise)."""

    base: torch.Tensor
    samples: list[torch.Tensor]
    keep_N: np.ndarray
    input_change_S: np.ndarray | None


class _Robustness(Configurable, ABC):
    needs_reference = False
    in_default_run = False  # the method runs samples + 1 more times per example
    higher_is_better = False
    family = "robustness"
    parameters = {"samples": 10, "radius": 0.02, "layer": -1, "seed": 0}
    parameter_docs = {
        "samples": "perturbed copies of each example the method is re-run on; an integer >= 1",
        "radius": "embedding noise: each coordinate uniform in [-radius, radius] (Captum's "
        "sensitivity_max default 0.02), on the real non-special tokens; > 0",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "seed": "added to the run's seed; perturbations are drawn from (run seed + seed, "
        "example id); any integer",
    }

    def validate(self) -> None:
        if self.params["samples"] < 1:
            raise self.out_of_range("samples", ">= 1")
        if not self.params["radius"] > 0 or not math.isfinite(self.params["radius"]):
            raise self.out_of_range("radius", "a finite number > 0")
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")

    @property
    def perturbation(self) -> str:
        return "embedding"

    def perturbed(self, context: EvalContext) -> list[Perturbed | None]:
        """Every example's re-attributions (None: no candidate token, or nothing to swap),
        shared by the evaluators that draw the same perturbations (``Trace.memo``)."""
        if context.attributor is None:
            raise UsageError(
                f"{self.name} re-runs the method on perturbed inputs: it needs the method "
                "itself, not attributions computed elsewhere"
            )
        synonyms = self.synonyms(context.trace)
        drawn = (
            f"swap/{self.params['synonyms']}/{self.params['share']}"
            if self.perturbation == "swap"
            else f"embedding/{self.params['radius']}"
        )
        key = (
            f"robustness/{_method_key(context.attributor)}/{drawn}/{self.params['samples']}/"
            f"{self.params['seed']}"
        )
        return context.trace.memo(key, lambda: self._perturb_all(context, synonyms))

    def synonyms(self, trace: Trace) -> dict[str, list[str]] | None:
        return None

    def _perturb_all(
        self, context: EvalContext, synonyms: dict[str, list[str]] | None
    ) -> list[Perturbed | None]:
        trace = context.trace
        keep_BN = candidates(trace)
        real_BN = trace.batch.attention_mask_BN.bool().cpu().numpy()
        return [
            self._perturb(context, row, keep_BN[row][real_BN[row]], synonyms)
            if keep_BN[row].any()
            else None
            for row in range(len(trace.batch.examples))
        ]

    def _perturb(
        self,
        context: EvalContext,
        row: int,
        keep_N: np.ndarray,
        synonyms: dict[str, list[str]] | None,
    ) -> Perturbed | None:
        trace, attributor = context.trace, context.attributor
        loaded, batch = trace.loaded, trace.batch
        samples = self.params["samples"]
        generator = noise_generator(trace.seed + self.params["seed"], batch.examples[row].id)

        def attribute(
            one: Batch, base_logits: torch.Tensor | None = None
        ) -> tuple[Trace, torch.Tensor]:
            traced = trace_batch(
                loaded, one, attributor.requires, trace.seed, trace.field_specs, trace.target
            )
            if base_logits is not None:  # the unperturbed example's class is explained
                traced.logits_BC = base_logits
            rows = attributor.attribute(traced).aggregated_BLN.detach()
            traced.release_graph()
            return traced, rows

        one = example_batch(batch, row)
        widths: list[int] = []  # the embedding output's width: the noise's last dimension
        handle = loaded.embeddings.register_forward_hook(
            lambda _m, _a, output: widths.append(output.shape[-1])
        )
        try:
            base_trace, base = attribute(one)
        finally:
            handle.remove()
        outputs = []
        if self.perturbation == "swap":
            ids_SN = swapped_ids(
                loaded.tokenizer, one.input_ids_BN[0].cpu(), keep_N, synonyms,
                self.params["share"], samples, generator,
            )  # fmt: skip
            if ids_SN is None:
                return None
            for ids_N in ids_SN.to(one.input_ids_BN.device):
                swapped = example_batch(batch, row, ids_N[None])
                swapped.tokens = [loaded.tokenizer.convert_ids_to_tokens(ids_N.tolist())]
                outputs.append(attribute(swapped, base_trace.logits_BC)[1])
            return Perturbed(base, outputs, keep_N, None)
        delta_SND = embedding_noise(generator, samples, keep_N, widths[0], self.params["radius"])
        for delta_ND in delta_SND:
            with shifted_embeddings(loaded, delta_ND, self.name):
                outputs.append(attribute(one, base_trace.logits_BC)[1])
        change_S = delta_SND.double().flatten(1).norm(dim=1).numpy()
        return Perturbed(base, outputs, keep_N, change_S)

    def differences(self, perturbed: Perturbed) -> tuple[np.ndarray, float]:
        """||Phi(x') - Phi(x)||_2 per sample over the candidates, and ||Phi(x)||_2."""
        layer = self.params["layer"]
        row = lambda rows: (  # noqa: E731
            scored_row(Attribution(rows), layer)[0].double().cpu().numpy()[perturbed.keep_N]
        )
        base = row(perturbed.base)
        changes = np.array([np.linalg.norm(row(rows) - base) for rows in perturbed.samples])
        return changes, float(np.linalg.norm(base))

    @abstractmethod
    def reduce(self, perturbed: Perturbed) -> float:
        """One example's score from its re-attributions."""

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        values = [
            float("nan") if one is None else self.reduce(one) for one in self.perturbed(context)
        ]
        return {"aggregated": np.asarray([values], dtype=float)}


class _Sensitivity(_Robustness):
    parameters = {
        **_Robustness.parameters,
        "normalise": True,
        "perturbation": "embedding",
        "synonyms": "",
        "share": 0.1,
    }
    choices = {"perturbation": PERTURBATIONS}
    #: The synonym list read from ``synonyms`` by ``validate`` (None: none given).
    table: dict[str, list[str]] | None = None
    parameter_docs = {
        **_Robustness.parameter_docs,
        "normalise": "divide each change by ||Phi(x)||_2, as Captum's sensitivity_max and "
        "Quantus do (a zero Phi(x) by 1, as Captum)",
        "perturbation": "embedding: uniform noise of radius on the embedding output; swap: "
        "candidate tokens swapped for synonyms (needs synonyms=PATH)",
        "synonyms": "perturbation=swap: a JSON file, an object word -> list of words; a "
        "replacement must be one token",
        "share": "perturbation=swap: the share of the n candidate tokens swapped, k = "
        "ceil(share * n) (at most those with a synonym); in (0, 1]",
    }

    def validate(self) -> None:
        super().validate()
        if not 0 < self.params["share"] <= 1:
            raise self.out_of_range("share", "in (0, 1]")
        path = self.params["synonyms"]
        if path and self.params["perturbation"] != "swap":
            raise UsageError(f"{self.name}:synonyms is read under perturbation=swap only")
        self.table = load_synonyms(path, self.name) if path else None

    @property
    def perturbation(self) -> str:
        return self.params["perturbation"]

    def synonyms(self, trace: Trace) -> dict[str, list[str]] | None:
        if self.perturbation == "swap" and self.table is None:
            raise UsageError(
                f"{self.name}:perturbation=swap needs replacement tokens and "
                f"{trace.loaded.name or trace.loaded.model_id} has no masked-LM head: pass "
                "synonyms=PATH (a JSON object word -> list of words)"
            )
        return self.table

    #: How the per-sample changes become the example's score.
    aggregate: Callable[[np.ndarray], float]

    def reduce(self, perturbed: Perturbed) -> float:
        changes, norm = self.differences(perturbed)
        if self.params["normalise"]:
            changes = changes / (norm if norm != 0.0 else 1.0)
        return float(self.aggregate(changes))


class SensitivityMax(_Sensitivity):
    """The largest change of the explanation over perturbed copies of the input.

    Reference: Yeh et al. 2019, "On the (In)fidelity and Sensitivity of Explanations", NeurIPS.
    """

    name = "sensitivity-max"
    description = (
        "Max over perturbed inputs of ||Phi(x') - Phi(x)|| / ||Phi(x)|| (embedding noise or "
        "token swaps); lower is better"
    )
    aggregate = staticmethod(np.max)


class SensitivityAvg(_Sensitivity):
    """The mean change of the explanation over perturbed copies of the input.

    Reference: Yeh et al. 2019, "On the (In)fidelity and Sensitivity of Explanations", NeurIPS.
    """

    name = "sensitivity-avg"
    description = (
        "Mean over perturbed inputs of ||Phi(x') - Phi(x)|| / ||Phi(x)|| (embedding noise or "
        "token swaps); lower is better"
    )
    aggregate = staticmethod(np.mean)


class LocalLipschitz(_Robustness):
    """The largest ratio of the explanation's change to the embedding's change, over noisy
    copies of the input.

    Reference: Alvarez-Melis & Jaakkola 2018, "On the Robustness of Interpretability Methods",
    ICML Workshop on Human Interpretability in Machine Learning.
    """

    name = "local-lipschitz"
    description = (
        "Max over embedding noise of ||Phi(x') - Phi(x)|| / ||e(x') - e(x)||; lower is better"
    )

    def reduce(self, perturbed: Perturbed) -> float:
        changes, _ = self.differences(perturbed)
        return float(np.max(changes / perturbed.input_change_S))


def gate_noise(
    generator: torch.Generator, samples: int, keep_N: np.ndarray, std: float
) -> torch.Tensor:
    """(samples, N) float64: N(0, std^2) at the ``keep_N`` tokens (drawn over them alone, so
    the draws never depend on padding), 0 elsewhere."""
    drawn = torch.randn(samples, int(keep_N.sum()), generator=generator, dtype=torch.float64)
    out = torch.zeros(samples, len(keep_N), dtype=torch.float64)
    out[:, torch.as_tensor(keep_N)] = drawn * std
    return out


class Infidelity(Configurable):
    """Infidelity of the token scores as the explanation of per-token gates, through
    ``captum.metrics.infidelity``.

    Each token's embedding (the output of ``LoadedModel.embeddings``) is multiplied by a gate
    g_i, so f(g) is the model on e(x) * g with f the score the method explains (p(y), or
    log p(y) - log p(foil) for a contrastive target: ``attrib_bench.toolkit.erasure.explained``,
    float64), and g = 1 is the input. Captum's perturbation: I ~ N(0, std^2) per candidate token
    (real, not special; 0 at the others), ``samples`` draws seeded by (run seed + ``seed``,
    example id); the perturbed input is g = 1 - I (I_i = 1 would zero the token's embedding).
    Infidelity = mean over the draws of (sum_i I_i Phi_i - (f(1) - f(1 - I)))^2, Phi the
    method's scored row; ``normalize=true`` first rescales Phi by the least-squares beta
    (Captum's ``normalize``), so that only its shape counts. Lower is better; an example with
    no candidate token is NaN.

    Reference: Yeh et al. 2019, "On the (In)fidelity and Sensitivity of Explanations", NeurIPS.
    """

    name = "infidelity"
    description = (
        "Captum infidelity of the scores for Gaussian gates on the token embeddings; lower is "
        "better"
    )
    needs_reference = False
    in_default_run = False  # samples + 1 forward passes per example
    higher_is_better = False
    family = "infidelity"
    parameters = {
        "samples": 10,
        "std": 0.1,
        "normalize": False,
        "layer": -1,
        "seed": 0,
        "chunk_tokens": 8192,
    }
    parameter_docs = {
        "samples": "Gaussian gate perturbations per example (Captum's n_perturb_samples); an "
        "integer >= 1",
        "std": "their standard deviation: a token's embedding is scaled by 1 - I, I ~ "
        "N(0, std^2); > 0",
        "normalize": "rescale the scores by the least-squares beta first (Captum's normalize)",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "seed": "added to the run's seed; draws are seeded by (run seed + seed, example id); "
        "any integer",
        "chunk_tokens": "the most tokens in one pass of gated inputs; bounds memory; an "
        "integer >= 1",
    }

    def validate(self) -> None:
        if self.params["samples"] < 1:
            raise self.out_of_range("samples", ">= 1")
        if not self.params["std"] > 0 or not math.isfinite(self.params["std"]):
            raise self.out_of_range("std", "a finite number > 0")
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        from captum.metrics import infidelity

        trace, samples = context.trace, self.params["samples"]
        keep_BN = candidates(trace)
        B, N = keep_BN.shape
        rows_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu()
        rows_BN = rows_BN * torch.as_tensor(keep_BN)
        perturbations_VN = torch.cat(
            [
                gate_noise(
                    noise_generator(trace.seed + self.params["seed"], example.id),
                    samples,
                    keep_N,
                    self.params["std"],
                )
                for example, keep_N in zip(trace.batch.examples, keep_BN, strict=True)
            ]
        )  # each example's draws together: Captum's repeat_interleave order

        def perturb(gates_VN: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return perturbations_VN, gates_VN - perturbations_VN

        values_B = infidelity(
            gated_forward(trace, scored_classes(context.attributor, trace), self.params),
            perturb,
            torch.ones(B, N, dtype=torch.float64),
            rows_BN,
            additional_forward_args=torch.arange(B),
            n_perturb_samples=samples,
            normalize=self.params["normalize"],
        )
        values_B = values_B.numpy().astype(float)
        values_B[~keep_BN.any(axis=1)] = np.nan
        return {"aggregated": values_B[None]}


def gated_forward(
    trace: Trace, target: tuple[torch.Tensor, torch.Tensor | None], params: dict[str, Any]
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """f(gates) for Captum: the explained score (V,) in float64 of the batch's examples
    ``rows_V`` with their token embeddings scaled by ``gates_VN``, in passes of at most
    ``chunk_tokens`` tokens, under sdpa (no attention probabilities are read)."""
    loaded, batch = trace.loaded, trace.batch
    inputs = batch.model_inputs()
    classes_B, foils_B = target
    step = max(1, params["chunk_tokens"] // batch.input_ids_BN.shape[1])

    def forward(gates_VN: torch.Tensor, rows_V: torch.Tensor) -> torch.Tensor:
        scores = []
        for start in range(0, len(rows_V), step):
            rows = rows_V[start : start + step].to(batch.input_ids_BN.device)
            gates = gates_VN[start : start + step].to(batch.input_ids_BN.device)
            handle = loaded.embeddings.register_forward_hook(
                lambda _m, _a, output, gates=gates: output * gates[..., None].to(output.dtype)
            )
            try:
                with torch.no_grad(), loaded.fast_attention():
                    logits = loaded.model(**{k: t[rows] for k, t in inputs.items()}).logits
            finally:
                handle.remove()
            logits = loaded.target_logits(logits, trace.target_positions_B[rows])
            log_probs = torch.log_softmax(logits.double(), dim=-1).cpu().numpy()
            foils = None if foils_B is None else foils_B[rows]
            scores.append(explained(trace, log_probs[None], (classes_B[rows], foils))[0])
        return torch.as_tensor(np.concatenate(scores))

    return forward


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [SensitivityMax(), SensitivityAvg(), LocalLipschitz(), Infidelity()]
