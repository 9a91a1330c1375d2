"""Leave-one-out agreement (ferret's ``taucorr_loo``): does a method rank tokens as their
removal does?

Definition (ferret 0.4.2, ``TauLOO_Evaluation``), with f(.) what the run's target explains
(p(y | .) of the target class y, or the contrastive score: see
``attrib_bench.toolkit.erasure.explained``):

- the leave-one-out score of candidate token j: loo_j = f(x) - f(x without token j), the drop
  of f (ferret: ``(p(x \\ j) - p(x)) * -1``);
- per example, loo-tau = Kendall's tau-b (``scipy.stats.kendalltau``, ferret's call) between
  the method's scores and loo over the example's candidates. Higher is better, in [-1, 1].

Conventions, stated because results depend on them:

- Candidates: the real tokens except special tokens, as the erasure evaluators take them
  (ferret drops the first and the last token, which is the same set for a single sentence; in
  a sentence pair ferret keeps the middle [SEP], this harness does not).
- Removal (``removal=``, faithfulness's choices): ``delete`` by default, ferret's (it deletes
  the token id, decodes the rest and re-tokenises the text; here the token is dropped from the
  ids and the sequence re-packed, without the decode round trip, which changes the input only
  where a deleted word piece lets its neighbours merge; ``removal=retokenize`` makes the round
  trip, as ferret). ``mask``, ``pad`` and ``zero`` replace the token in place.
- Which row: the method's last aggregated row unless ``layer=l`` (1-based), as faithfulness's.
- Cost: one model call per candidate token and example, computed once per batch (the memo on
  the trace) and shared by every method scored on it; the erased predictions also go into
  faithfulness's per-batch cache, so an erasure evaluator removing the same single token
  (comprehensiveness at 10% of a short sentence) reuses them, and the reverse.
- ``scorer=DIR``: the drops are those of DIR, the run's model fine-tuned with random masking
  (in-distribution removal, as on the erasure evaluators: ``attrib_bench.model.scorer``).
- NaN: an example with fewer than two candidates, a non-finite score, or constant scores or
  constant LOO scores (tau-b is undefined there).
"""

from __future__ import annotations

import numpy as np
import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext, Trace
from attrib_bench.core.interfaces import scored_classes
from attrib_bench.model.scorer import SCORER_DOC, ScoredByCopy
from attrib_bench.toolkit.erasure import (
    REMOVALS,
    candidates,
    erased_log_probs,
    explained,
    resolve_removal,
)
from attrib_bench.toolkit.ranking import scored_row


def loo_log_probs(trace: Trace, removal: str, chunk_tokens: int) -> np.ndarray:
    """The log-probabilities with each candidate token j left out, (N, B, C) float64 (the
    original ones where j is no candidate).

    Each single-token erasure is looked up in, and added to, faithfulness's cache (same keys:
    removal, example, erased tokens), so no erasure of the batch is run twice.
    """
    candidates_BN = candidates(trace)
    N = candidates_BN.shape[1]
    from attrib_bench.core.loaded_model import target_logits  # transformers: not at `list` time

    keys = {}  # (example, token) -> faithfulness's cache key of erasing that token alone
    for b, j in zip(*np.nonzero(candidates_BN), strict=True):
        erase_N = np.zeros(N, dtype=bool)
        erase_N[j] = True
        keys[int(b), int(j)] = (removal, int(b), erase_N.tobytes())
    cache = erased_log_probs(trace, list(keys.values()), chunk_tokens, target_logits)
    original_BC = torch.log_softmax(trace.logits_BC.double(), dim=-1).cpu().numpy()
    erased_NBC = np.repeat(original_BC[None], N, axis=0)  # (token left out, example, class)
    for (b, j), key in keys.items():
        erased_NBC[j, b] = cache[key]
    return erased_NBC


def loo_drops(
    trace: Trace, erased_NBC: np.ndarray, target: tuple[torch.Tensor, torch.Tensor | None]
) -> np.ndarray:
    """f(x) - f(x without token j) for every candidate j, (B, N) float64, NaN elsewhere, with
    f the score of ``target`` (the classes the scored method explains)."""
    original_BC = torch.log_softmax(trace.logits_BC.double(), dim=-1).cpu().numpy()
    before_1B = explained(trace, original_BC[None], target)
    drops_BN = (before_1B - explained(trace, erased_NBC, target)).T
    drops_BN[~candidates(trace)] = np.nan
    return drops_BN


def kendall_tau_b(scores: np.ndarray, loo: np.ndarray) -> float:
    """Kendall's tau-b, NaN where it is undefined (under two values, or a constant side)."""
    if len(scores) < 2 or np.ptp(scores) == 0 or np.ptp(loo) == 0:
        return float("nan")
    from scipy.stats import kendalltau  # here: `attrib-bench list` imports every plugin

    return float(kendalltau(scores, loo, variant="b").statistic)


class LooTau(ScoredByCopy, Configurable):
    """Kendall's tau-b between a method's scores and the leave-one-out drops of f.

    Reference: Attanasio et al. 2023, "ferret: a Framework for Benchmarking Explainers on
    Transformers", EACL system demonstrations (taucorr_loo, after Jain & Wallace 2019,
    "Attention is not Explanation", NAACL).
    """

    name = "loo-tau"
    description = (
        "Kendall tau-b between the scores and leave-one-out drops of f (ferret's taucorr_loo); "
        "one model call per token, shared by all methods"
    )
    needs_reference = False
    higher_is_better = True
    #: One model call per token and example: selected by name, like the erasure evaluators.
    in_default_run = False
    family = "faithfulness"
    parameters = {"removal": "delete", "layer": -1, "chunk_tokens": 8192, "scorer": ""}
    choices = {"removal": REMOVALS}
    parameter_docs = {
        "removal": "how the left-out token is erased, as faithfulness's: delete (ferret's, "
        "without its decode round trip), retokenize (with it), mask, pad, zero, zero-word; "
        "auto: mask where the tokenizer has one, else delete",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "chunk_tokens": "the most tokens in one batched pass; bounds memory; an integer >= 1",
        "scorer": SCORER_DOC,
    }

    def validate(self) -> None:
        self.check_scorer()
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        trace = self.scoring(context)  # the scorer's view, memo and cache its own
        removal = resolve_removal(self.params["removal"], trace.loaded.tokenizer)
        erased_NBC = trace.memo(
            f"loo.erased/{removal}",
            lambda: loo_log_probs(trace, removal, self.params["chunk_tokens"]),
        )
        target = scored_classes(context.attributor, context.trace)  # what the method explains
        drops_BN = loo_drops(trace, erased_NBC, target)
        scores_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        candidates_BN = candidates(trace)
        per_example = np.full(len(scores_BN), np.nan)
        for b, (scores_N, keep_N) in enumerate(zip(scores_BN, candidates_BN, strict=True)):
            scores = scores_N[keep_N]
            if np.isfinite(scores).all():
                per_example[b] = kendall_tau_b(scores, drops_BN[b, keep_N])
        return {"aggregated": per_example[None, :]}


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [LooTau()]
