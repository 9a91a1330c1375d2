"""F-Fidelity (Zheng et al., ICLR 2025): removal scored in distribution, by random subsets.

A removal score is confounded when the erased input is one the model never saw. F-Fidelity
fine-tunes a copy of the model on inputs with a random share beta of their features removed
(``attrib-bench finetune --model RUN_MODEL --masking 0.1``, here the ``scorer=`` parameter), and
at evaluation removes no more than that copy was trained on: of the tokens an explanation
selects, each is removed independently with probability min(alpha, beta * n / k), n the
example's candidate tokens and k the selected ones, so that on average at most beta * n tokens
go. Definitions, with f(.) what the run's target explains (``attrib_bench.toolkit.erasure``;
the paper's "label-based" version is ``output=accuracy``), S_r the selected tokens at ratio r
and x ⊖ M the input with the tokens M erased:

- ``mode=plus`` (FFid+, the official code's ``ours_random_MoRF``): S_r is the top
  k = ceil(r * n) candidates by the method's score, and
  FFid+ = mean over r of [ f(x) - E_M f(x ⊖ M) ],  M ⊆ S_r, each token in M with probability p_r;
  higher is better (removing what the method ranks first should change f).
- ``mode=minus`` (FFid-, ``ours_random_LeRF``): S_r is the bottom k candidates, the same
  difference; lower is better (removing what the method ranks last should not).

E_M is the mean over ``samples`` draws of M, from a generator seeded by (the run's seed, the
example's id) (``attrib_bench.toolkit.erasure.example_generator``): the draws never depend on
the batch, the method or the mode, so methods are compared on common random numbers.

Defaults are the official code's (github.com/AslanDing/Finetune-Fidelity,
code/evaluation_model.py's ``evaluation_finetune_ffid``): alpha 0.5 (``robust_ratio``), beta
0.1 (``max_ratio``, ``use_max=True``; the fine-tune's ``RandomPixelRemoval(0.1)``), 50 samples,
sparsities 5%, 10%, ..., 100%. Differences, stated: k rounds up as the other erasure
evaluators here do (the official code takes int(n / 100 * (s + 1)) pixels at sparsity s%); f
is by default the probability of the target class, whose change the paper's label-based
fidelity thresholds at the argmax (``output=accuracy`` is that: 1 when the argmax is the target
class, else 0, the target class being the class the method explains).

Without ``scorer=`` the protocol runs on the run's model and says so in a warning, once: its
random subsets are then out of distribution as any removal is. Cost: up to
``samples`` * len(``ratios``) erased inputs per example, fewer where draws repeat (the erasure
cache keys them by the tokens erased, shared with every method and evaluator of the batch).
"""

from __future__ import annotations

import numpy as np
import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext
from attrib_bench.core import console
from attrib_bench.core.interfaces import scored_classes
from attrib_bench.model.scorer import SCORER_DOC, ScoredByCopy
from attrib_bench.toolkit.erasure import (
    REMOVALS,
    candidates,
    erased_log_probs,
    example_generator,
    explained,
    plan_erasures,
    resolve_removal,
)
from attrib_bench.toolkit.ranking import parse_ratios, ratio_k, scored_row, top_k_mask

#: The official code's sparsities, 5% to 100% by 5%.
FFID_RATIOS = "/".join(f"{s / 100:g}" for s in range(5, 101, 5))


def removal_probability(alpha: float, beta: float, n: int, k: int) -> float:
    """Each selected token's chance of removal: alpha, lowered to beta * n / k where alpha * k
    would remove more than beta * n tokens on average (the official ``use_max``)."""
    return min(alpha, beta * n / k)


class FFidelity(ScoredByCopy, Configurable):
    """F-Fidelity: FFid+ (``mode=plus``) or FFid- (``mode=minus``), the drop of f when random
    subsets of the top (bottom) k tokens are removed, of bounded size, scored by a masked
    fine-tune of the model (``scorer=``).

    Reference: Zheng et al. 2025, "F-Fidelity: A Robust Framework for Faithfulness Evaluation
    of Explainable AI", ICLR.
    """

    name = "ffidelity"
    description = (
        "F-Fidelity: f(x) - f(x minus random bounded subsets of the top-k (plus) or bottom-k "
        "(minus) tokens), scored by a masked fine-tune (scorer=)"
    )
    needs_reference = False
    in_default_run = False
    family = "faithfulness"
    parameters = {
        "mode": "plus",
        "ratios": FFID_RATIOS,
        "alpha": 0.5,
        "beta": 0.1,
        "samples": 50,
        "output": "probability",
        "removal": "auto",
        "layer": -1,
        "chunk_tokens": 8192,
        "scorer": "",
    }
    choices = {
        "mode": ("plus", "minus"),
        "output": ("probability", "accuracy"),
        "removal": REMOVALS,
    }
    parameter_docs = {
        "mode": "plus: FFid+, subsets of the top k removed (higher is better); minus: FFid-, "
        "subsets of the bottom k (lower is better)",
        "ratios": "the shares k = ceil(ratio * n) of the n real non-special tokens selected, "
        "'/'-separated, each in (0, 1]; the score is the mean over them (default: the official "
        "5%, 10%, ..., 100%)",
        "alpha": "the chance each selected token is removed, in (0, 1] (official: 0.5)",
        "beta": "the bound: at most beta * n tokens removed on average, the share the scorer "
        "was fine-tuned to erase, in (0, 1] (official: 0.1)",
        "samples": "random subsets drawn per ratio and example, an integer >= 1 (official: 50)",
        "output": "probability: f, as the other erasure evaluators read it; accuracy: 1 where "
        "the argmax is the explained class, else 0 (the paper's label-based fidelity)",
        "removal": "how a token is erased, as the erasure evaluators' (auto: mask where the "
        "tokenizer has one, else delete)",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "chunk_tokens": "the most tokens in one batched pass of erased inputs; bounds memory; "
        "an integer >= 1",
        "scorer": SCORER_DOC,
    }
    #: Whether this evaluator has said that it runs without a scorer (once).
    unscored_noted = False

    @property
    def higher_is_better(self) -> bool:
        return self.params["mode"] == "plus"

    def validate(self) -> None:
        self.check_scorer()
        if 0.0 in parse_ratios(self.params["ratios"]):
            raise self.out_of_range("ratios", "'/'-separated shares in (0, 1]")
        for key in ("alpha", "beta"):
            if not 0.0 < self.params[key] <= 1.0:
                raise self.out_of_range(key, "in (0, 1]")
        if self.params["samples"] < 1:
            raise self.out_of_range("samples", ">= 1")
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    def draws(self, attribution: Attribution, context: EvalContext) -> np.ndarray:
        """(R, S, B, N) True at the tokens each sample removes: per ratio r the selected k
        (top or bottom), each kept in the sample with probability ``removal_probability``;
        draws over each example's own candidates, so they do not depend on the batch."""
        trace = context.trace
        scores_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        candidates_BN = candidates(trace)
        if self.params["mode"] == "minus":  # the lowest first, ties to the earlier position
            scores_BN = -scores_BN
        ratios = parse_ratios(self.params["ratios"])
        samples = self.params["samples"]
        out = np.zeros((len(ratios), samples, *candidates_BN.shape), dtype=bool)
        for b, example in enumerate(trace.batch.examples):
            positions = np.flatnonzero(candidates_BN[b])
            n = len(positions)
            if not n:
                continue
            generator = example_generator(context.seed, example.id)
            uniform_RSn = torch.rand((len(ratios), samples, n), generator=generator).numpy()
            for r, ratio in enumerate(ratios):
                k = ratio_k(ratio, n)
                chosen_N = top_k_mask(scores_BN[b : b + 1], candidates_BN[b : b + 1], [k])[0]
                p = removal_probability(self.params["alpha"], self.params["beta"], n, k)
                removed_Sn = (uniform_RSn[r] < p) & chosen_N[positions][None]
                out[r, :, b][:, positions] = removed_Sn
        return out

    def keys(
        self, attribution: Attribution, context: EvalContext
    ) -> tuple[np.ndarray, np.ndarray, dict[tuple[int, int, int], tuple[str, int, bytes]]]:
        """The draws (R, S, B, N), which examples are scoreable (B,), and the erasure cache's
        key of each (ratio, sample, example) that removes something."""
        trace = context.trace
        removal = resolve_removal(self.params["removal"], trace.loaded.tokenizer)
        scores_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        candidates_BN = candidates(trace)
        scoreable_B = candidates_BN.any(axis=1) & np.where(
            candidates_BN, np.isfinite(scores_BN), True
        ).all(axis=1)
        removed_RSBN = self.draws(attribution, context)
        run_RSB = removed_RSBN.any(axis=-1) & scoreable_B
        keys = {
            (r, s, b): (removal, b, removed_RSBN[r, s, b].tobytes())
            for r, s, b in zip(*np.nonzero(run_RSB), strict=True)
        }
        return removed_RSBN, scoreable_B, keys

    def plan(self, attribution: Attribution, context: EvalContext) -> None:
        """Announce the draws' erasures, pooled with the batch's others (``plan_erasures``)."""
        _, _, keys = self.keys(attribution, context)
        plan_erasures(self.scoring(context), list(keys.values()), self.params["chunk_tokens"])

    def f(self, log_probs_RBC: np.ndarray, target, context: EvalContext) -> np.ndarray:
        """f of each row, (R, B): ``explained``'s, or 1/0 for the argmax being the class."""
        if self.params["output"] == "probability":
            return explained(context.trace, log_probs_RBC, target)
        classes_B = target[0].cpu().numpy()
        return (log_probs_RBC.argmax(axis=-1) == classes_B[None]).astype(float)

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        if not self.params["scorer"] and not self.unscored_noted:
            self.unscored_noted = True
            console.warn(
                f"{self.name}: no scorer= given, so the run's model scores the erased inputs, "
                "out of distribution; F-Fidelity scores them with a masked fine-tune: "
                f"attrib-bench finetune --model RUN_MODEL --masking {self.params['beta']:g}"
            )
        scoring = self.scoring(context)
        removed_RSBN, scoreable_B, keys = self.keys(attribution, context)
        from attrib_bench.core.loaded_model import target_logits  # transformers: not at `list`

        cache = erased_log_probs(
            scoring, list(keys.values()), self.params["chunk_tokens"], target_logits
        )
        original_BC = torch.log_softmax(scoring.logits_BC.double(), dim=-1).cpu().numpy()
        R, S = removed_RSBN.shape[:2]
        erased_RSBC = np.broadcast_to(original_BC, (R, S, *original_BC.shape)).copy()
        for (r, s, b), key in keys.items():
            erased_RSBC[r, s, b] = cache[key]
        target = scored_classes(context.attributor, context.trace)  # what the method explains
        before_B = self.f(original_BC[None], target, context)[0]
        after_RSB = self.f(erased_RSBC.reshape(R * S, *original_BC.shape), target, context)
        drops_RB = before_B[None] - after_RSB.reshape(R, S, -1).mean(axis=1)
        per_example = drops_RB.mean(axis=0)
        per_example[~scoreable_B] = np.nan
        return {"aggregated": per_example[None, :]}


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [FFidelity()]
