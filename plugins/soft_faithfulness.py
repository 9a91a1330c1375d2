"""Soft comprehensiveness and soft sufficiency (Zhao & Aletras 2023, "Incorporating
Attribution Importance for Improving Faithfulness Metrics", ACL; code: casszhao/SoftFaith).

Hard erasure removes a token or keeps it; soft erasure drops each element of a token's
embedding vector at random, more often the more (comprehensiveness) or the less (sufficiency)
important the method says the token is, so the ranking's magnitudes count, not only its order.

With s the method's scores over the example's candidate tokens (real, non-special) and f(.)
what the run's target explains (p(y | .) of the target class y: see
``attrib_bench.toolkit.erasure.explained``):

- importance in [0, 1] by min-max over the candidates: q_j = (s_j - min s) / (max s - min s)
  (the official code's min-max option; signed scores put the most negative token at 0);
- e_j, the embedding output of token j (``LoadedModel.embeddings``, after its LayerNorm: where
  the official code masks), becomes e_j * m_j, m_j in {0, 1}^D with independent elements
  m_jd ~ Bernoulli(keep_j): keep_j = 1 - q_j for comprehensiveness (x'_C, the important tokens
  erased most), keep_j = q_j for sufficiency (x'_S, the important tokens kept most); special
  tokens and padding are kept whole;
- the null input 0: every candidate's embedding zeroed (the soft erasure with keep_j = 0), whose
  sufficiency is S0 = 1 - max(0, f(x) - f(0));
- ``normalise=true`` (default, the paper's Soft-NC and Soft-NS, both higher-is-better in [0, 1]):
  Soft-NC = clip(max(0, f(x) - f(x'_C)) / (1 - S0), 0, 1),
  Soft-NS = clip((Soft-S - S0) / (1 - S0), 0, 1), Soft-S = 1 - max(0, f(x) - f(x'_S));
  NaN where 1 - S0 = 0 (the null input does not lower f: the normalisation is undefined; the
  official code adds 1e-5 there instead). It needs a probability: a contrastive target is a
  UsageError.
- ``normalise=false``: the raw differences, read like the hard evaluators: comprehensiveness
  f(x) - f(x'_C) (higher is better), sufficiency f(x) - f(x'_S) (lower is better), any target.

Conventions: the masks are drawn per example from a generator seeded by (run seed + ``seed``,
the example's id, the metric) over the example's own length, so they never depend on the batch;
``samples`` masks per example (default 1, the paper's single draw) are each scored and the
scores averaged. Cost: ``samples`` model calls per example and method, plus the null input once
per example (shared by every method), batched in passes of at most ``chunk_tokens`` tokens.
Unscoreable (NaN): no candidate, a non-finite score, or constant scores (no min-max).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext, Trace, UsageError
from attrib_bench.core.interfaces import scored_classes
from attrib_bench.toolkit.erasure import (
    candidates,
    example_generator,
    explained,
    forward_erased,
)
from attrib_bench.toolkit.ranking import scored_row

NULL_KEY = "soft_faithfulness.null_log_probabilities"


def importance(scores_BN: np.ndarray, candidates_BN: np.ndarray) -> np.ndarray:
    """Min-max normalised scores over each row's candidates, (B, N), 0 elsewhere; a row with no
    candidate, a non-finite candidate score or constant candidate scores is NaN."""
    out = np.zeros_like(scores_BN, dtype=np.float64)
    for b, (scores_N, keep_N) in enumerate(zip(scores_BN, candidates_BN, strict=True)):
        chosen = scores_N[keep_N]
        if not keep_N.any() or not np.isfinite(chosen).all() or np.ptp(chosen) == 0:
            out[b] = np.nan
            continue
        out[b, keep_N] = (chosen - chosen.min()) / np.ptp(chosen)
    return out


def soft_masks(
    keep_N: np.ndarray, samples: int, width: int, seed: int, example_id: str, metric: str
) -> torch.Tensor:
    """(samples, n, width) Bernoulli keep masks of one example: element d of token j is kept
    with probability ``keep_N[j]`` (n: the example's real tokens). Drawn on the CPU in float64
    from the example's own generator, so that neither the batch nor the device changes them."""
    generator = example_generator(seed, f"{example_id}/{metric}")
    uniform = torch.rand((samples, len(keep_N), width), generator=generator, dtype=torch.float64)
    return uniform < torch.as_tensor(keep_N, dtype=torch.float64)[None, :, None]


def _model_inputs(trace: Trace) -> dict[str, torch.Tensor]:
    """The batch's inputs with the unmodified input's position ids, as faithfulness passes."""
    batch = trace.batch
    inputs = batch.model_inputs()
    positions_BN = trace.loaded.position_ids(batch.input_ids_BN)
    if positions_BN is not None:
        inputs["position_ids"] = positions_BN
    return inputs


def null_log_probs(trace: Trace, chunk_tokens: int) -> np.ndarray:
    """Log-probabilities with every candidate's embedding zeroed, (B, C) float64."""
    from attrib_bench.core.loaded_model import target_logits  # transformers: not at `list` time

    inputs = _model_inputs(trace)
    erase_BN = torch.as_tensor(candidates(trace), device=trace.batch.input_ids_BN.device)
    B, N = erase_BN.shape
    step = max(1, chunk_tokens // N)
    out = []
    for start in range(0, B, step):
        rows = slice(start, start + step)
        chunk = {name: t[rows] for name, t in inputs.items()}
        positions = trace.target_positions_B[rows]
        log_probs = forward_erased(trace, chunk, erase_BN[rows], "zero", positions, target_logits)
        out.append(log_probs.cpu().numpy())
    return np.concatenate(out)


def soft_log_probs(
    trace: Trace, keep_BN: np.ndarray, samples: int, seed: int, metric: str, chunk_tokens: int
) -> np.ndarray:
    """Log-probabilities under soft erasure, (samples, B, C) float64: embedding element d of
    token j of example b kept with probability ``keep_BN[b, j]`` (see ``soft_masks``)."""
    from attrib_bench.core.loaded_model import target_logits  # transformers: not at `list` time

    batch = trace.batch
    inputs = _model_inputs(trace)
    B, N = keep_BN.shape
    lengths = batch.lengths
    variants = [(s, b) for b in range(B) for s in range(samples)]
    step = max(1, chunk_tokens // N)
    out = np.zeros((samples, B, trace.logits_BC.shape[-1]))
    for start in range(0, len(variants), step):
        chunk = variants[start : start + step]
        examples = torch.tensor([b for _, b in chunk], device=batch.input_ids_BN.device)

        def mask_output(_module, _args, output, chunk=chunk):
            # The width is the embedding output's: known only here, so the masks are drawn here.
            drawn = {
                b: soft_masks(
                    keep_BN[b, : lengths[b]],
                    samples,
                    output.shape[-1],
                    seed,
                    batch.examples[b].id,
                    metric,
                )
                for b in {b for _, b in chunk}
            }
            keep_VND = torch.ones(output.shape, dtype=torch.bool)
            for v, (s, b) in enumerate(chunk):
                keep_VND[v, : lengths[b]] = drawn[b][s]
            return output * keep_VND.to(device=output.device, dtype=output.dtype)

        handle = trace.loaded.embeddings.register_forward_hook(mask_output)
        try:
            with torch.no_grad(), trace.loaded.fast_attention():  # logits alone: sdpa
                logits = trace.model(**{name: t[examples] for name, t in inputs.items()}).logits
        finally:
            handle.remove()
        logits = target_logits(trace.loaded, logits, trace.target_positions_B[examples])
        log_probs = torch.log_softmax(logits.double(), dim=-1).cpu().numpy()
        for (s, b), values in zip(chunk, log_probs, strict=True):
            out[s, b] = values
    return out


class SoftErasure(Configurable, ABC):
    """Shared machinery: normalise the scores, soft-erase, compare f before and after."""

    #: Bernoulli masks keep token j where u < q_j: the float noise of re-attributing an example
    #: alone (1e-7 in saliency) can flip an element whose u is that close to q_j, so an example
    #: alone may score slightly differently from the same example in a batch.
    batch_independent = False

    needs_reference = False
    #: Model calls per example and method, like the erasure evaluators: selected by name.
    in_default_run = False
    #: "remove": keep probability 1 - q (comprehensiveness); "keep": q (sufficiency).
    mode = "remove"
    family = "faithfulness"
    parameters = {"normalise": True, "samples": 1, "seed": 0, "layer": -1, "chunk_tokens": 8192}
    parameter_docs = {
        "normalise": "true: the paper's Soft-NC / Soft-NS in [0, 1], normalised by the null "
        "input (needs a probability, not a contrastive score); false: the raw drop of f",
        "samples": "random masks drawn per example, their scores averaged (1: the paper's "
        "single draw); an integer >= 1",
        "seed": "added to the run's seed; masks are drawn from (run seed + seed, example id, "
        "metric); any integer",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "chunk_tokens": "the most tokens in one batched pass; bounds memory; an integer >= 1",
    }

    def validate(self) -> None:
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")
        if self.params["samples"] < 1:
            raise self.out_of_range("samples", ">= 1")
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        trace = context.trace
        normalise = self.params["normalise"]
        if normalise and trace.target.score == "contrastive":
            raise UsageError(
                f"{self.name}:normalise=true divides probabilities; a contrastive score is not "
                "one: use normalise=false"
            )
        chunk_tokens = self.params["chunk_tokens"]
        scores_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        candidates_BN = candidates(trace)
        q_BN = importance(scores_BN, candidates_BN)
        scoreable_B = ~np.isnan(q_BN).any(axis=1)
        q_BN = np.nan_to_num(q_BN)
        keep_BN = np.where(candidates_BN, 1.0 - q_BN if self.mode == "remove" else q_BN, 1.0)
        soft_SBC = soft_log_probs(
            trace,
            keep_BN,
            self.params["samples"],
            context.seed + self.params["seed"],
            self.name,
            chunk_tokens,
        )
        original_BC = torch.log_softmax(trace.logits_BC.double(), dim=-1).cpu().numpy()
        target = scored_classes(context.attributor, trace)  # the class the method explains
        before_B = explained(trace, original_BC[None], target)[0]
        after_SB = explained(trace, soft_SBC, target)
        if normalise:
            null_BC = trace.memo(NULL_KEY, lambda: null_log_probs(trace, chunk_tokens))
            null_B = explained(trace, null_BC[None], target)[0]
            drop0_B = np.maximum(0.0, before_B - null_B)  # 1 - S0
            with np.errstate(divide="ignore", invalid="ignore"):
                per_sample_SB = self.normalised(before_B[None], after_SB, drop0_B[None])
            per_sample_SB[:, drop0_B == 0] = np.nan
        else:
            per_sample_SB = before_B[None] - after_SB
        per_example = per_sample_SB.mean(axis=0)
        per_example[~scoreable_B] = np.nan
        return {"aggregated": per_example[None, :]}

    @abstractmethod
    def normalised(
        self, before_SB: np.ndarray, after_SB: np.ndarray, drop0_SB: np.ndarray
    ) -> np.ndarray:
        """The paper's normalised score from f(x), f(x') and 1 - S0 = max(0, f(x) - f(0))."""


class SoftComprehensiveness(SoftErasure):
    """Soft-NC: the drop of f when each token's embedding elements are dropped with its
    min-max importance as the probability.

    Reference: Zhao & Aletras 2023, "Incorporating Attribution Importance for Improving
    Faithfulness Metrics", ACL.
    """

    name = "soft-comprehensiveness"
    description = (
        "Soft-NC (Zhao & Aletras 2023): drop of p(y) when embedding elements are dropped with "
        "probability = min-max importance, normalised by the null input; seeded"
    )
    higher_is_better = True
    mode = "remove"

    def normalised(self, before_SB, after_SB, drop0_SB):
        return np.clip(np.maximum(0.0, before_SB - after_SB) / drop0_SB, 0.0, 1.0)


class SoftSufficiency(SoftErasure):
    """Soft-NS: f kept when each token's embedding elements are kept with its min-max
    importance as the probability.

    Reference: Zhao & Aletras 2023, "Incorporating Attribution Importance for Improving
    Faithfulness Metrics", ACL.
    """

    name = "soft-sufficiency"
    description = (
        "Soft-NS (Zhao & Aletras 2023): p(y) kept when embedding elements are kept with "
        "probability = min-max importance, normalised by the null input; seeded"
    )
    mode = "keep"

    @property
    def higher_is_better(self) -> bool:
        return bool(self.params["normalise"])

    def normalised(self, before_SB, after_SB, drop0_SB):
        soft_s = 1.0 - np.maximum(0.0, before_SB - after_SB)
        s0 = 1.0 - drop0_SB
        return np.clip((soft_s - s0) / drop0_SB, 0.0, 1.0)


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [SoftComprehensiveness(), SoftSufficiency()]
