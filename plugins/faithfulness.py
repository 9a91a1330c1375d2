"""Faithfulness by erasure (ERASER; the DecompX protocol): remove what a method ranks highest.

Definitions (DeYoung et al., "ERASER", ACL 2020, section 4.2; AOPC after Samek et al. 2017),
with f(.) what the run's target explains (attrib_bench.core.target):

- ``score=predicted`` and ``score=gold``: f = p(y | .), the probability of the target class y
  (``Trace.target_classes_B``: the class the model predicts on the full input x, or the label);
- ``score=contrastive``: f = s(.) = logit(y) - logit(foil) = log p(y | .) - log p(foil | .),
  the contrastive score itself (y: ``class=``, the foil: ``Trace.target_foils_B``), read from the
  same log-probabilities (the softmax normaliser cancels), so it costs no model call more.
  Probabilities would explain something else than the gradient methods differentiate.

- comprehensiveness = f(x) - f(x minus its top-k% tokens)   (higher: more faithful)
- sufficiency       = f(x) - f(only the top-k% tokens)      (lower: more faithful)

each averaged over the bins k of ``ratios`` (AOPC; default 10%, 20%, ..., 90%; ERASER's own
bins are ``ratios=0.01/0.05/0.1/0.2/0.5``). ``deletion`` and ``insertion`` are the
same two erasures read as curves over ``ratios`` (default 0%, 10%, ..., 100%): the area under
f(.) by the trapezoid rule, normalised to the ratio range (deletion: lower is better;
insertion: higher). ``log-odds`` (Shrikumar et al. 2017) is the drop of the target class's
log-odds log(p / (1 - p)) when the top 20% are removed (higher is better); under a contrastive
target it is the drop of s, the log-odds of y against the foil alone (so it equals
comprehensiveness at ``ratios=0.2``). ``masked-accuracy`` is the model's accuracy against the
gold label after erasure, averaged over the bins (DecompX's ACC; ``mode=remove``: lower is
better, ``mode=keep``: higher), whatever the target. Unbounded s makes contrastive values
logit differences, not probabilities: compare them only with runs of the same target.

Conventions, stated because results depend on them:

- Which row: only the method's last aggregated row (a whole-model method has one) is scored,
  unless ``layer=l`` (1-based) says otherwise; every layer would cost L times the model calls.
  The result has one row, reported as layer 1.
- Candidates: the example's real tokens except special tokens ([CLS], [SEP], <s>, </s>), which are
  never removed. k = ceil(ratio * n) over the n candidates (so every ratio above 0 removes at
  least one token). The top k are the k highest scores; ties go to the earlier position.
- Removal (``removal=``): ``mask`` replaces the token by [MASK] (DecompX), ``pad`` by
  [PAD] (with attention kept: the [PAD] embedding as a baseline), ``zero`` sets the token's
  embedding output (``LoadedModel.embeddings``: an encoder's ``hidden_states[0]``, word, position
  and token-type embeddings summed and normalised) to the zero vector, ``zero-word`` its word
  embedding (``get_input_embeddings()``) before the position and token-type embeddings are added
  (the same module as ``zero`` on a language model), ``delete`` drops the token and re-packs the
  sequence. ``auto`` (the default) is ``mask`` where the tokenizer has a mask token (the
  encoders) and ``delete`` where it has none (decoders: see ``resolve_removal``). All but
  ``delete`` and ``retokenize`` keep every token where it was: they pass the unmodified input's
  position ids, since RoBERTa-family models would otherwise renumber the tokens after a [PAD].
  ``delete`` is a genuine deletion: the model numbers the re-packed sequence itself. A language
  model is read at the target position: the original one where tokens stay in place, the
  re-packed input's own (its last real token under ``position=last``) after ``delete``.
- Cost: all (ratio, example) variants of a batch run as a few batched forward passes of at most
  ``chunk_tokens`` tokens each; under ``delete`` and ``retokenize``, which shorten the inputs,
  in passes of similar lengths (``attrib_bench.toolkit.erasure``). Predictions are cached per
  batch by the tokens an erasure removes, so another bin, evaluator or method erasing the same
  tokens of an example costs no model call, and an erasure that removes nothing reuses the
  original prediction (under ``retokenize``, where decoding and tokenising again gives the
  input back token for token: ``round_trip_restores``).
- An example with no candidate token or a non-finite score is unscoreable (NaN).
- ``removal=retokenize``: ferret's deletion, the kept tokens decoded and tokenised again
  (``attrib_bench.toolkit.erasure.retokenized``).

Normalized AOPC (Edin et al., ACL 2025; official code ``JoakimEdin/naopc``), ``normalise=naopc``
on comprehensiveness and sufficiency: an AOPC depends on the model and the example as much as on
the method, so each example's AOPC A is rescaled between the lowest and highest AOPC that any
ordering of its tokens reaches, (A - lowest) / (highest - lowest), 0 where the two are equal.
As in the official code this is done for sufficiency too, so its best ordering scores 0 (it
stays lower-is-better) and comprehensiveness's best scores 1. The bounds are over the
evaluator's own steps (``ratios``; ``ratios=all`` is the paper's every k from 1 to n), found
exactly for inputs of at most ``exact_cap`` candidate tokens (``search=auto``) and by the
official beam search above (``attrib_bench.toolkit.naopc``), whose bounds lie inside the exact
ones, so a score there may leave [0, 1]; a warning says when beam search takes over. The official
code starts its upper bound at 0; here it is the true maximum. Cost per example: 2^n - 1 erased
inputs at most for the exact search, about ``beam_size`` * n * (n + 1) for the beam, shared by
every method of the batch (the bounds do not depend on the method) and pooled with the other
erasures. The settings whose steps do not erase sets of fixed sizes (``protocol=ferret``,
``rationale=positive``, ``repeats=skip``, ``empty=skip``) and ``classes=all`` refuse it.

In-distribution removal (``scorer=DIR`` on every evaluator here): f(x) and f of every erased
input come from DIR, the run's model fine-tuned with random masking (``attrib-bench finetune
--masking``; Madsen et al. 2024; Zheng et al. 2025), which has seen inputs with tokens erased;
the ranking still comes from the method run on the run's model (``attrib_bench.model.scorer``).
NAOPC's bounds are then the scorer's too. The result's provenance names the scorer's weights.

ferret 0.4.2's protocol (``AOPC_Comprehensiveness_Evaluation``, ``AOPC_Sufficiency_Evaluation``
and ``AOPC_Comprehensiveness_Evaluation_by_class`` in ferret's evaluators/, default arguments)
is ``protocol=ferret`` on comprehensiveness and sufficiency: see ``AOPC``. The default,
``protocol=attrib-bench``, is the conventions above.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext, UsageError
from attrib_bench.core import console
from attrib_bench.core.interfaces import scored_classes
from attrib_bench.model.scorer import SCORER_DOC, SCORER_PREFIX, ScoredByCopy
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.erasure import (
    CACHE_KEY,
    NORMALISER_KEY,
    REMOVALS,
    erased_log_probs,
    explained,
    explained_logits,
    plan_erasures,
    resolve_removal,
    round_trip_restores,
)
from attrib_bench.toolkit.naopc import Beam, counted_sets, exact_bounds, normalised, step_weights
from attrib_bench.toolkit.ranking import (
    ROUNDINGS,
    parse_ratios,
    rationale_mask,
    scored_row,
    top_k_mask,
)

if TYPE_CHECKING:
    from attrib_bench.core.trace import Trace

AOPC_RATIOS = "0.1/0.2/0.3/0.4/0.5/0.6/0.7/0.8/0.9"
CURVE_RATIOS = "0/0.1/0.2/0.3/0.4/0.5/0.6/0.7/0.8/0.9/1"


#: ``ratios=all`` on the AOPC evaluators: every k from 1 to n (Edin et al.'s AOPC).
ALL_STEPS = "all"
#: ``normalise=``: the AOPC itself, or rescaled between its bounds over orderings (NAOPC).
NORMALISATIONS = ("none", "naopc")
#: ``search=``: how NAOPC finds the bounds.
SEARCHES = ("auto", "exact", "beam")
#: The most candidate tokens the exact search takes: 2^16 model calls per example.
MAX_EXACT_CAP = 16
#: Where NAOPC's bounds are kept within one batch's trace (they do not depend on the method).
BOUNDS_KEY = "faithfulness.naopc_bounds"


@dataclass(frozen=True, eq=False)
class Bounds:
    """One example's search for NAOPC's bounds (``attrib_bench.toolkit.naopc``): its candidate
    tokens' positions, the weight of each erased-set size, the class (and foil) whose f it
    reads, and exact or beam search. Token sets are bit masks over the candidates."""

    trace: Trace
    row: int
    removal: str
    positions: np.ndarray
    weights: np.ndarray
    target: tuple[torch.Tensor, torch.Tensor | None]
    exact: bool

    @property
    def n(self) -> int:
        return len(self.positions)

    def key(self) -> tuple:
        """What the bounds depend on, within one batch."""
        classes, foils = self.target
        foil = None if foils is None else foils.cpu().numpy().tobytes()
        target = (classes.cpu().numpy().tobytes(), foil)
        return self.removal, self.row, self.weights.tobytes(), self.exact, target

    def counted(self) -> list[int]:
        """The sets the exact search reads."""
        return counted_sets(self.n, self.weights)

    def keys(self, masks: Sequence[int]) -> list[tuple[str, int, bytes]]:
        """The erasure cache's key of each set (as ``Erasure.erasure_keys`` makes them, so a
        method erasing the same tokens shares the model call)."""
        length = self.trace.batch.input_ids_BN.shape[1]
        keys = []
        for mask in masks:
            erase_N = np.zeros(length, dtype=bool)
            erase_N[[p for i, p in enumerate(self.positions) if mask >> i & 1]] = True
            keys.append((self.removal, self.row, erase_N.tobytes()))
        return keys

    @staticmethod
    def drops_of(
        problems: Sequence[Bounds], masks: Sequence[Sequence[int]], chunk_tokens: int
    ) -> list[dict[int, float]]:
        """drop(E) = f(x) - f(x without E) of each problem's sets, from one pooled run of the
        batch's erasures."""
        if not problems:
            return []
        from attrib_bench.core.loaded_model import target_logits  # transformers: not at `list`

        trace = problems[0].trace
        keys = [problem.keys(sets) for problem, sets in zip(problems, masks, strict=True)]
        flat = [key for some in keys for key in some]
        cache = erased_log_probs(trace, flat, chunk_tokens, target_logits)
        original_BC = torch.log_softmax(trace.logits_BC.double(), dim=-1).cpu().numpy()
        out = []
        for problem, sets, some in zip(problems, masks, keys, strict=True):
            row = problem.row
            before = explained(trace, original_BC[None, row : row + 1], problem.target)[0, 0]
            after_V = explained(trace, np.stack([cache[k] for k in some])[:, None], problem.target)
            out.append(dict(zip(sets, (before - after_V[:, 0]).tolist(), strict=True)))
        return out


class Erasure(ScoredByCopy, Configurable, ABC):
    """Shared machinery: erase by rank, run the variants batched, reduce per example."""

    needs_reference = False
    in_default_run = False
    higher_is_better = True
    family = "faithfulness"
    #: "remove" erases the top k; "keep" erases everything but the top k.
    mode = "remove"
    parameters = {
        "ratios": AOPC_RATIOS,
        "removal": "auto",
        "layer": -1,
        "chunk_tokens": 8192,
        "scorer": "",
    }
    choices = {"removal": REMOVALS}
    parameter_docs = {
        "ratios": "the shares erased, '/'-separated, each in [0, 1]: k = ceil(ratio * n) of the "
        "n real non-special tokens; the score is the mean over them",
        "removal": "how a token is erased: mask ([MASK]), pad ([PAD], attention kept), zero "
        "(zero embedding output), zero-word (zero word embedding, before position embeddings), "
        "delete (re-packed), retokenize (kept tokens decoded and tokenised again, ferret's); "
        "auto: mask where the tokenizer has one, else delete",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "chunk_tokens": "the most tokens in one batched pass of erased inputs; bounds memory; "
        "an integer >= 1",
        "scorer": SCORER_DOC,
    }

    def validate(self) -> None:
        self.check_scorer()
        parse_ratios(self.params["ratios"])
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    def rationales(
        self, attribution: Attribution, context: EvalContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per ratio the rationale (the top k, or with ``rationale=positive`` those of them that
        score above 0), (R, B, N); the candidates, (B, N); which examples are scoreable, (B,)."""
        batch = context.trace.batch
        scores_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        candidates_BN = (
            (batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool()).cpu().numpy()
        )
        scoreable_B = candidates_BN.any(axis=1) & np.where(
            candidates_BN, np.isfinite(scores_BN), True
        ).all(axis=1)
        rounding = self.params.get("rounding", "ceil")
        positive = self.params.get("rationale", "top-k") == "positive"
        rationale_RBN = np.stack(
            [
                rationale_mask(scores_BN, candidates_BN, r, rounding, positive)
                for r in parse_ratios(self.params["ratios"])
            ]
        )
        return rationale_RBN, candidates_BN, scoreable_B

    def erasure_keys(
        self,
        attribution: Attribution,
        context: EvalContext,
        evaluated_RB: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, dict[tuple[int, int], tuple[str, int, bytes]]]:
        """What to erase at every ratio, (R, B, N); which examples are scoreable, (B,); and the
        erasure cache's key of each (ratio, example) step that needs a model call: evaluated
        (``evaluated_RB``, default every step), scoreable, and erasing something (or, under
        ``retokenize``, changed by the decode round trip even with nothing erased)."""
        trace = context.trace
        removal = resolve_removal(self.params["removal"], trace.loaded.tokenizer)
        rationale_RBN, candidates_BN, scoreable_B = self.rationales(attribution, context)
        erase_RBN = rationale_RBN if self.mode == "remove" else candidates_BN & ~rationale_RBN
        if evaluated_RB is None:
            evaluated_RB = np.ones(erase_RBN.shape[:2], dtype=bool)
        # An erasure of nothing is the input itself, unless a decode round trip changes it.
        changed_B = ~round_trip_restores(trace) if removal == "retokenize" else False
        run_RB = evaluated_RB & (erase_RBN.any(axis=-1) | changed_B)
        # Keyed by what is erased, so that bins, evaluators and methods that erase the same
        # tokens of an example share one model call.
        keys = {
            (r, b): (removal, b, erase_RBN[r, b].tobytes())
            for r, b in zip(*np.nonzero(run_RB & scoreable_B[None]), strict=True)
        }
        return erase_RBN, scoreable_B, keys

    def plan(self, attribution: Attribution, context: EvalContext) -> None:
        """Announce this method's erasures on the batch (``plan_erasures``), so that they run
        pooled with every other method's and evaluator's."""
        rationale_RBN, _, _ = self.rationales(attribution, context)
        _, _, keys = self.erasure_keys(attribution, context, self.evaluated(rationale_RBN))
        plan_erasures(self.scoring(context), list(keys.values()), self.params["chunk_tokens"])

    def erased(
        self,
        attribution: Attribution,
        context: EvalContext,
        evaluated_RB: np.ndarray | None = None,
    ) -> np.ndarray:
        """Log-probabilities after erasure at every ratio: (R, B, C), NaN for unscoreable rows
        and for the steps ``evaluated_RB`` leaves out (never run; default: none); the scorer's
        (``scoring``)."""
        trace = self.scoring(context)
        erase_RBN, scoreable_B, keys = self.erasure_keys(attribution, context, evaluated_RB)
        from attrib_bench.core.loaded_model import target_logits  # transformers: not at `list` time

        cache = erased_log_probs(
            trace, list(keys.values()), self.params["chunk_tokens"], target_logits
        )
        out_RBC = np.repeat(
            torch.log_softmax(trace.logits_BC.double(), dim=-1).cpu().numpy()[None],
            len(erase_RBN),
            axis=0,
        )
        for (r, b), key in keys.items():
            out_RBC[r, b] = cache[key]
        out_RBC[:, ~scoreable_B] = np.nan
        if evaluated_RB is not None:
            out_RBC[~evaluated_RB] = np.nan
        return out_RBC

    def evaluated(self, rationale_RBN: np.ndarray) -> np.ndarray:
        """(R, B) True at the steps that count: every step here (see ``AOPC``)."""
        return np.ones(rationale_RBN.shape[:2], dtype=bool)

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        rationale_RBN, _, scoreable_B = self.rationales(attribution, context)
        erased_RBC = self.erased(attribution, context, self.evaluated(rationale_RBN))
        scoring = self.scoring(context)
        original_BC = torch.log_softmax(scoring.logits_BC.double(), dim=-1).cpu().numpy()
        target = scored_classes(context.attributor, context.trace)  # what the method explains
        before_B = explained(context.trace, original_BC[None], target)[0]
        after_RB = explained(context.trace, erased_RBC, target)
        per_example = self.reduce(before_B, after_RB, erased_RBC, context)
        per_example[~scoreable_B] = np.nan
        return {"aggregated": per_example[None, :]}

    @abstractmethod
    def reduce(
        self,
        original_B: np.ndarray,
        erased_RB: np.ndarray,
        erased_RBC: np.ndarray,
        context: EvalContext,
    ) -> np.ndarray:
        """Per-example score from f (``explained``) before (B,) and after erasure (R, B), and
        the log-probabilities after erasure (R, B, C)."""


#: ``protocol=``: this harness's AOPC (the ERASER/DecompX conventions above), or ferret 0.4.2's.
PROTOCOLS = ("attrib-bench", "ferret")
#: ferret 0.4.2's thresholds, ``np.arange(0.1, 1.1, 0.1)`` at full precision: with int(r * n),
#: 0.7000000000000001 * 90 gives 63 tokens where 0.7 * 90 gives 62.
FERRET_RATIOS = "0.1/0.2/0.30000000000000004/0.4/0.5/0.6/0.7000000000000001/0.8/0.9/1.0"
#: What ``protocol=ferret`` sets (``AOPC_*_Evaluation`` with ferret's default arguments); a
#: parameter given beside it wins.
FERRET_PROTOCOL = {
    "ratios": FERRET_RATIOS,
    "removal": "retokenize",
    "rationale": "positive",
    "rounding": "floor",
    "repeats": "skip",
    "empty": "skip",
}


class AOPC(Erasure):
    """Comprehensiveness and sufficiency, with ferret's protocol as switches (``protocol=ferret``
    sets them all): ``rationale=positive`` (only positive scores), ``rounding=floor``
    (k = int(ratio * n)), ``repeats=skip`` (a step whose rationale equals the last evaluated
    one is not evaluated again, nor counted), ``empty=skip`` (nor is a step with an empty
    rationale; an example left with no step scores ``no_step``: ferret's 0 and 1), and
    ``removal=retokenize`` (the kept tokens decoded and tokenised again); and Normalized AOPC
    (``normalise=naopc``, see the module docstring)."""

    parameters = {
        **Erasure.parameters,
        "protocol": "attrib-bench",
        "rationale": "top-k",
        "rounding": "ceil",
        "repeats": "keep",
        "empty": "score",
        "normalise": "none",
        "search": "auto",
        "exact_cap": 10,
        "beam_size": 5,
    }
    choices = {
        **Erasure.choices,
        "protocol": PROTOCOLS,
        "rationale": ("top-k", "positive"),
        "rounding": ROUNDINGS,
        "repeats": ("keep", "skip"),
        "empty": ("score", "skip"),
        "normalise": NORMALISATIONS,
        "search": SEARCHES,
    }
    parameter_docs = {
        **Erasure.parameter_docs,
        "protocol": "attrib-bench: the conventions of this module; ferret: ferret 0.4.2's, "
        "setting ratios, removal, rationale, rounding, repeats and empty (one given beside it "
        "wins)",
        "rationale": "top-k: the k highest scores; positive: only those that are positive (ferret)",
        "rounding": "k = ceil(ratio * n), or floor: int(ratio * n) (ferret)",
        "repeats": "keep: every ratio counts; skip: a step erasing what the last one did is "
        "neither evaluated nor counted (ferret)",
        "empty": "score: a step erasing nothing counts; skip: it does not, and an example left "
        "with no step scores ferret's constant (ferret)",
        "ratios": "the shares erased, '/'-separated, each in [0, 1] (k = ceil(ratio * n) of the "
        "n real non-special tokens), or all: every k from 1 to n (Edin et al.'s AOPC); the "
        "score is the mean over the steps",
        "normalise": "none: the AOPC itself; naopc: rescaled per example between the lowest "
        "(0) and highest (1) AOPC any ordering of its tokens reaches (Edin et al. 2025)",
        "search": "how naopc finds the bounds: exact (every ordering; inputs of at most "
        "exact_cap tokens), beam (the official beam search), auto: exact up to exact_cap, "
        "beam above",
        "exact_cap": "the most candidate tokens naopc's exact search takes (2^n model calls "
        "per example); an integer from 1 to 16",
        "beam_size": "the orders each of naopc's two beams keeps; an integer >= 1 (the paper's "
        "experiments: 5)",
    }
    #: The score of an example none of whose steps is evaluated (ferret's constant).
    no_step: float
    #: Whether this run has said that beam search took over (once per evaluator).
    beam_noted = False

    def validate(self) -> None:
        if self.params["ratios"] == ALL_STEPS:
            if self.params["rationale"] != "top-k":
                raise UsageError(f"{self.name}:ratios=all needs rationale=top-k")
            self.params = {**self.params, "ratios": "1"}  # the other checks read a number
            try:
                super().validate()
            finally:
                self.params = {**self.params, "ratios": ALL_STEPS}
        else:
            super().validate()
        if not 1 <= self.params["exact_cap"] <= MAX_EXACT_CAP:
            raise self.out_of_range("exact_cap", f"an integer from 1 to {MAX_EXACT_CAP}")
        if self.params["beam_size"] < 1:
            raise self.out_of_range("beam_size", ">= 1")
        fixed = ("rationale", "top-k"), ("repeats", "keep"), ("empty", "score")
        if self.params["normalise"] == "naopc" and any(self.params[k] != v for k, v in fixed):
            raise UsageError(
                f"{self.name}:normalise=naopc needs rationale=top-k, repeats=keep and "
                "empty=score (the steps must erase sets of fixed sizes): drop protocol=ferret "
                "or those switches"
            )

    def rationales(self, attribution, context):
        """As ``Erasure.rationales``; under ``ratios=all`` the steps are k = 1, 2, ... up to the
        batch's most candidates (an example with fewer repeats its last step, which
        ``evaluated`` leaves out)."""
        if self.params["ratios"] != ALL_STEPS:
            return super().rationales(attribution, context)
        self.params = {**self.params, "ratios": "1"}  # candidates and scoreable rows
        try:
            _, candidates_BN, scoreable_B = super().rationales(attribution, context)
        finally:
            self.params = {**self.params, "ratios": ALL_STEPS}
        scores_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        n_B = candidates_BN.sum(axis=1)
        rationale_RBN = np.stack(
            [
                top_k_mask(scores_BN, candidates_BN, np.minimum(k, n_B))
                for k in range(1, max(1, int(n_B.max())) + 1)
            ]
        )
        return rationale_RBN, candidates_BN, scoreable_B

    def configure(self, raw):
        if raw.get("protocol") == "ferret":
            raw = {**FERRET_PROTOCOL, **raw}
        return super().configure(raw)

    def evaluated(self, rationale_RBN: np.ndarray) -> np.ndarray:
        """(R, B) True at the steps that count: all, unless ``empty=skip`` or ``repeats=skip``
        leave out the empty rationales and those equal to the last step evaluated (ferret)."""
        skip_empty, skip_repeats = self.params["empty"] == "skip", self.params["repeats"] == "skip"
        evaluated_RB = np.ones(rationale_RBN.shape[:2], dtype=bool)
        if self.params["ratios"] == ALL_STEPS:  # step k exists where the example has k tokens
            steps_R1 = np.arange(1, len(rationale_RBN) + 1)[:, None]
            evaluated_RB = rationale_RBN.sum(axis=-1) == steps_R1
        for b in range(rationale_RBN.shape[1]):
            last = None
            for r, chosen_N in enumerate(rationale_RBN[:, b]):
                if (skip_empty and not chosen_N.any()) or (
                    skip_repeats and last is not None and (chosen_N == last).all()
                ):
                    evaluated_RB[r, b] = False
                    continue
                last = chosen_N
        return evaluated_RB

    def reduce(self, original_B, erased_RB, erased_RBC, context):
        evaluated_RB = ~np.isnan(erased_RB)  # the steps left out are NaN (``erased``)
        counts_B = evaluated_RB.sum(axis=0)
        sums_B = np.where(evaluated_RB, original_B[None, :] - erased_RB, 0.0).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts_B > 0, sums_B / counts_B, self.no_step)

    def plan(self, attribution: Attribution, context: EvalContext) -> None:
        """The erasures of the method's ranking and, under ``normalise=naopc``, the sets the
        exact search of the bounds reads (the beam search's depend on its steps' results)."""
        super().plan(attribution, context)
        if self.params["normalise"] == "naopc":
            keys = [
                key
                for problem in self.bound_problems(attribution, context)
                if problem.exact
                for key in problem.keys(problem.counted())
            ]
            plan_erasures(self.scoring(context), keys, self.params["chunk_tokens"])

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        scores = super().score(attribution, context)
        if self.params["normalise"] != "naopc":
            return scores
        low_B, high_B = self.bounds(attribution, context)
        return {"aggregated": normalised(scores["aggregated"], low_B[None], high_B[None])}

    def bound_problems(self, attribution: Attribution, context: EvalContext) -> list[Bounds]:
        """One bound search per scoreable example: its candidates, the sizes its steps erase
        (the same for every ordering), and exact or beam search; scored by the scorer."""
        trace = self.scoring(context)
        removal = resolve_removal(self.params["removal"], trace.loaded.tokenizer)
        rationale_RBN, candidates_BN, scoreable_B = self.rationales(attribution, context)
        evaluated_RB = self.evaluated(rationale_RBN)
        erase_RBN = rationale_RBN if self.mode == "remove" else candidates_BN & ~rationale_RBN
        classes, foils = scored_classes(context.attributor, context.trace)  # the method's target
        search, cap = self.params["search"], self.params["exact_cap"]
        problems = []
        for b in np.flatnonzero(scoreable_B):
            positions = np.flatnonzero(candidates_BN[b])
            if search == "exact" and len(positions) > cap:
                raise UsageError(
                    f"{self.name}:normalise=naopc search=exact: example "
                    f"{trace.batch.examples[b].id} has {len(positions)} candidate tokens, "
                    f"more than exact_cap={cap} (2^n model calls); raise exact_cap (at most "
                    f"{MAX_EXACT_CAP}) or use search=auto (beam search above the cap)"
                )
            sizes = erase_RBN[evaluated_RB[:, b], b].sum(axis=-1)
            target = (classes[b : b + 1], None if foils is None else foils[b : b + 1])
            exact = search == "exact" or (search == "auto" and len(positions) <= cap)
            problems.append(
                Bounds(
                    trace,
                    int(b),
                    removal,
                    positions,
                    step_weights(sizes, len(positions)),
                    target,
                    exact,
                )
            )
        return problems

    def bounds(
        self, attribution: Attribution, context: EvalContext
    ) -> tuple[np.ndarray, np.ndarray]:
        """(B,) lowest and highest AOPC of any ordering (NaN for unscoreable rows), exact or by
        beam search; kept per batch (the scorer's namespace), since they do not depend on the
        method."""
        trace = self.scoring(context)
        memo = trace.shared.setdefault(BOUNDS_KEY, {})
        setting = (self.params["beam_size"],)
        problems = [
            p for p in self.bound_problems(attribution, context) if p.key() + setting not in memo
        ]
        budget = self.params["chunk_tokens"]
        exact = [p for p in problems if p.exact]
        drops = Bounds.drops_of(exact, [p.counted() for p in exact], budget)
        for problem, drop in zip(exact, drops, strict=True):
            memo[problem.key() + setting] = exact_bounds(problem.n, problem.weights, drop)
        beams = {p: Beam(p.n, self.params["beam_size"]) for p in problems if not p.exact}
        if beams and not self.beam_noted:
            self.beam_noted = True
            console.warn(
                f"{self.name}:normalise=naopc: inputs of more than exact_cap="
                f"{self.params['exact_cap']} candidate tokens take beam search (beam_size="
                f"{self.params['beam_size']}); their bounds are approximate, so their scores "
                "may leave [0, 1]"
            )
        seen: dict[Bounds, dict[int, float]] = {p: {} for p in beams}
        while any(not beam.done for beam in beams.values()):
            active = [p for p, beam in beams.items() if not beam.done]
            wanted = [beams[p].pending() for p in active]
            for problem, drop in zip(active, Bounds.drops_of(active, wanted, budget), strict=True):
                seen[problem].update(drop)
                beams[problem].advance(drop)
        for problem, beam in beams.items():
            memo[problem.key() + setting] = beam.bounds(problem.weights, seen[problem])
        B = trace.batch.input_ids_BN.shape[0]
        low_B, high_B = np.full(B, np.nan), np.full(B, np.nan)
        for problem in self.bound_problems(attribution, context):
            low_B[problem.row], high_B[problem.row] = memo[problem.key() + setting]
        return low_B, high_B


class Comprehensiveness(AOPC):
    """AOPC comprehensiveness: f(x) - f(x without its top k), averaged over ``ratios``.

    ``classes=all``: ferret's class-based AOPC (``aopc_class_compr``), the mean over every
    class c of the comprehensiveness of p(c) for the method re-run with c as its target.

    Reference: DeYoung et al. 2020, "ERASER: A Benchmark to Evaluate Rationalized NLP
    Models", ACL.
    """

    name = "comprehensiveness"
    description = (
        "AOPC comprehensiveness: f(x) - f(x without top-k%), k in ratios (ERASER); "
        "f: p(y), or the contrastive score; protocol=ferret: ferret 0.4.2's; "
        "classes=all: the mean over classes (ferret's class-based AOPC)"
    )
    no_step = 0.0
    parameters = {**AOPC.parameters, "classes": "target"}
    choices = {**AOPC.choices, "classes": ("target", "all")}
    parameter_docs = {
        **AOPC.parameter_docs,
        "classes": "target: the class the method explained; all: the mean over every class, "
        "the method re-run for each (ferret's class-based AOPC; classifiers only)",
    }

    def validate(self) -> None:
        super().validate()
        if self.params["classes"] == "all" and self.params["normalise"] == "naopc":
            raise UsageError(f"{self.name}:normalise=naopc explains one class: use classes=target")

    def plan(self, attribution: Attribution, context: EvalContext) -> None:
        """``classes=all`` erases by the method re-run per class (``each_class``), which only
        ``score`` runs: nothing to announce."""
        if self.params["classes"] == "target":
            super().plan(attribution, context)

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        if self.params["classes"] == "target":
            return super().score(attribution, context)
        score = super().score
        per_class = [score(a, c)["aggregated"] for a, c in self.each_class(context)]
        return {"aggregated": np.mean(per_class, axis=0)}

    def each_class(self, context: EvalContext) -> Iterator[tuple[Attribution, EvalContext]]:
        """For every class c, the method re-run on the batch traced with target ``score=gold``
        and every label c, and the context that scores p(c); erasures are shared (they are
        cached by the tokens erased, whatever the class)."""
        trace = context.trace
        if trace.target.score == "contrastive" or trace.loaded.is_language_model:
            raise UsageError(
                f"{self.name}:classes=all explains each class of a classifier in turn, not a "
                "contrastive score or a language model's vocabulary"
            )
        if context.attributor is None:
            raise ValueError("classes=all needs the attributor to re-run it")
        target = dataclasses.replace(trace.target, score="gold")
        for c in range(trace.logits_BC.shape[-1]):
            examples = [dataclasses.replace(e, label=c) for e in trace.batch.examples]
            batch = dataclasses.replace(trace.batch, examples=examples)
            traced = trace_batch(
                trace.loaded,
                batch,
                context.attributor.requires,
                trace.seed,
                fields=trace.field_specs,
                target=target,
            )
            traced.shared[CACHE_KEY] = trace.shared.setdefault(CACHE_KEY, {})
            traced.shared[NORMALISER_KEY] = trace.shared.setdefault(NORMALISER_KEY, {})
            for key in [key for key in trace.shared if key.startswith(SCORER_PREFIX)]:
                traced.shared[key] = trace.shared[key]  # a scorer's erasures, shared likewise
            yield context.attributor.attribute(traced), dataclasses.replace(context, trace=traced)


class Sufficiency(AOPC):
    """AOPC sufficiency: f(x) - f(only the top k), averaged over ``ratios``; lower is better.

    Reference: DeYoung et al. 2020, "ERASER: A Benchmark to Evaluate Rationalized NLP
    Models", ACL.
    """

    name = "sufficiency"
    description = (
        "AOPC sufficiency: f(x) - f(top-k% only), k in ratios; lower is better; "
        "protocol=ferret: ferret 0.4.2's"
    )
    higher_is_better = False
    mode = "keep"
    no_step = 1.0


def curve_area(values_RB: np.ndarray, ratios: tuple[float, ...]) -> np.ndarray:
    """Trapezoid area under each column's curve over ``ratios``, divided by the ratio range."""
    x = np.asarray(ratios)
    widths = np.diff(x)[:, None]
    area = ((values_RB[1:] + values_RB[:-1]) / 2 * widths).sum(axis=0)
    return area / (x[-1] - x[0])


class Deletion(Erasure):
    """The area under f as the top-ranked tokens are erased, ratio by ratio; lower is better.

    Reference: Petsiuk, Das & Saenko 2018, "RISE: Randomized Input Sampling for Explanation of
    Black-box Models", BMVC (the deletion and insertion metrics).
    """

    name = "deletion"
    description = "Deletion curve: area under f as top-ranked tokens are erased; lower is better"
    higher_is_better = False
    parameters = {**Erasure.parameters, "ratios": CURVE_RATIOS}
    parameter_docs = {
        **Erasure.parameter_docs,
        "ratios": "the curve's points, '/'-separated, at least two, increasing, each in [0, 1]: "
        "the share k = ceil(ratio * n) of the n real non-special tokens erased",
    }

    def validate(self) -> None:
        super().validate()
        ratios = parse_ratios(self.params["ratios"])
        if len(ratios) < 2 or (np.diff(ratios) <= 0).any():
            raise UsageError(f"{self.name}:ratios must be at least two increasing values")

    def reduce(self, original_B, erased_RB, erased_RBC, context):
        return curve_area(erased_RB, parse_ratios(self.params["ratios"]))


class Insertion(Deletion):
    """The area under f as the top-ranked tokens are restored, ratio by ratio.

    Reference: Petsiuk, Das & Saenko 2018, "RISE: Randomized Input Sampling for Explanation of
    Black-box Models", BMVC.
    """

    name = "insertion"
    description = "Insertion curve: area under f as top-ranked tokens are restored"
    higher_is_better = True
    mode = "keep"


class ABPC(Deletion):
    """The area between the perturbation curves of the target logit: least-relevant-first
    (LeRF) minus most-relevant-first (MoRF) erasure, ratio by ratio; higher is better.

    AttnLRP's faithfulness protocol (Table 1; its author's description, issue #40 of
    rachtibat/LRP-eXplains-Transformers): at every ratio the k = ceil(ratio * n) highest-scored
    tokens (MoRF) and, apart, the k lowest-scored (LeRF; ties to the earlier position in both)
    are erased by zeroing their input embeddings (``removal=zero-word``: the word embedding,
    before an encoder adds the position and token-type embeddings; ``removal=zero`` zeroes the
    embedding module's output instead, ``hidden_states[0]``), and the model's logit of the
    explained class y is read (a contrastive target: logit(y) - logit(foil)). The score is the
    trapezoid area under LeRF(k) - MoRF(k) over ``ratios``, divided by the ratio range
    (``curve_area``). Differences from the paper: special tokens are never erased (n counts the
    real non-special tokens), the curve has the points of ``ratios`` rather than one per token
    and the area is normalised, a mean over the curve.

    Reference: Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation
    for Transformers", ICML; Schulz et al. 2020, "Restricting the Flow: Information Bottlenecks
    for Attribution", ICLR (the area between perturbation curves, ABPC).
    """

    name = "abpc"
    description = (
        "AttnLRP's faithfulness: area between the LeRF and MoRF curves of the target logit "
        "(input embeddings zeroed); higher is better"
    )
    higher_is_better = True
    parameters = {**Deletion.parameters, "removal": "zero-word"}
    parameter_docs = {
        **Deletion.parameter_docs,
        "ratios": "the curves' points, '/'-separated, at least two, increasing, each in [0, 1]: "
        "the share k = ceil(ratio * n) of the n real non-special tokens erased, the most "
        "relevant (MoRF) and the least relevant (LeRF)",
        "removal": "how a token is erased: zero-word (the protocol's: zero word embedding, "
        "before position embeddings), zero (zero embedding output), or any of the erasure "
        "evaluators' (mask, pad, delete, retokenize, auto)",
    }

    def rationales(
        self, attribution: Attribution, context: EvalContext
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The MoRF rationales then the LeRF ones (the k lowest scores: the top k of the
        negated scores, ties to the earlier position), (2R, B, N); candidates; scoreable."""
        morf_RBN, candidates_BN, scoreable_B = super().rationales(attribution, context)
        scores_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        lerf_RBN = np.stack(
            [
                rationale_mask(-scores_BN, candidates_BN, r)
                for r in parse_ratios(self.params["ratios"])
            ]
        )
        return np.concatenate([morf_RBN, lerf_RBN]), candidates_BN, scoreable_B

    def curves(self, attribution: Attribution, context: EvalContext) -> np.ndarray:
        """The target logit (a contrastive target: logit(y) - logit(foil)) after each erasure,
        (2R, B): MoRF's R points then LeRF's, NaN for unscoreable rows; the scorer's. Read from
        the erasure cache's log-probabilities and log normalisers, only the target's columns."""
        trace = self.scoring(context)
        _, scoreable_B, keys = self.erasure_keys(attribution, context)
        from attrib_bench.core.loaded_model import target_logits  # transformers: not at `list` time

        cache = erased_log_probs(
            trace, list(keys.values()), self.params["chunk_tokens"], target_logits
        )
        normalisers = trace.shared[NORMALISER_KEY]
        target = scored_classes(context.attributor, context.trace)  # what the method explains
        original_BC = trace.logits_BC.double()
        log_probs_1BC = torch.log_softmax(original_BC, dim=-1).cpu().numpy()[None]
        log_z_1B = torch.logsumexp(original_BC, dim=-1).cpu().numpy()[None]
        R2 = 2 * len(parse_ratios(self.params["ratios"]))
        out_RB = np.repeat(explained_logits(trace, log_probs_1BC, log_z_1B, target), R2, axis=0)
        for (r, b), key in keys.items():
            classes, foils = target
            row_target = (classes[b : b + 1], None if foils is None else foils[b : b + 1])
            out_RB[r, b] = explained_logits(
                trace, cache[key][None, None], np.array([[normalisers[key]]]), row_target
            )[0, 0]
        out_RB[:, ~scoreable_B] = np.nan
        return out_RB

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        values_RB = self.curves(attribution, context)
        morf_RB, lerf_RB = np.split(values_RB, 2)
        per_example = curve_area(lerf_RB - morf_RB, parse_ratios(self.params["ratios"]))
        return {"aggregated": per_example[None, :]}


def log_odds(log_probs_BC: np.ndarray, classes_B: np.ndarray) -> np.ndarray:
    """log(p / (1 - p)) of each row's class, from log-probabilities without cancellation."""
    columns = np.arange(len(classes_B))
    own = log_probs_BC[columns, classes_B]
    others = log_probs_BC.copy()
    others[columns, classes_B] = -np.inf
    with np.errstate(divide="ignore"):
        return own - np.logaddexp.reduce(others, axis=-1)


class LogOdds(Erasure):
    """The drop of the target class's log-odds log(p / (1 - p)) with the top k removed.

    Reference: Shrikumar, Greenside & Kundaje 2017, "Learning Important Features Through
    Propagating Activation Differences", ICML.
    """

    name = "log-odds"
    description = "Drop of the target class's log-odds when the top 20% are removed"
    parameters = {**Erasure.parameters, "ratios": "0.2"}

    def reduce(self, original_B, erased_RB, erased_RBC, context):
        classes, foils = scored_classes(context.attributor, context.trace)
        if foils is not None:  # s is already the log-odds of y to the foil
            return (original_B[None, :] - erased_RB).mean(axis=0)
        classes_B = classes.cpu().numpy()
        scoring = self.scoring(context)
        original_BC = torch.log_softmax(scoring.logits_BC.double(), dim=-1).cpu().numpy()
        after_RB = np.stack([log_odds(erased_BC, classes_B) for erased_BC in erased_RBC])
        return (log_odds(original_BC, classes_B)[None, :] - after_RB).mean(axis=0)


class MaskedAccuracy(Erasure):
    """Accuracy against the gold label after erasure, averaged over the bins (DecompX's ACC).

    Reference: Modarressi et al. 2023, "DecompX: Explaining Transformers Decisions by
    Propagating Token Decomposition", ACL.
    """

    name = "masked-accuracy"
    description = "Gold-label accuracy after erasing the top-k% (mode=remove) or the rest (keep)"
    parameters = {**Erasure.parameters, "mode": "remove"}
    choices = {**Erasure.choices, "mode": ("remove", "keep")}
    parameter_docs = {
        **Erasure.parameter_docs,
        "mode": "remove: erase the top k (lower is better); keep: erase all but the top k "
        "(higher is better)",
    }

    @property
    def mode(self) -> str:
        return self.params["mode"]

    @property
    def higher_is_better(self) -> bool:
        return self.params["mode"] == "keep"

    def reduce(self, original_B, erased_RB, erased_RBC, context):
        gold = [e.label for e in context.trace.batch.examples]
        labels_B = np.array([-1 if g is None else g for g in gold])
        correct_RB = (erased_RBC.argmax(axis=-1) == labels_B[None, :]).astype(float)
        correct_RB[np.isnan(erased_RB)] = np.nan
        correct_RB[:, labels_B < 0] = np.nan
        return correct_RB.mean(axis=0)


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [
        Comprehensiveness(),
        Sufficiency(),
        Deletion(),
        Insertion(),
        ABPC(),
        LogOdds(),
        MaskedAccuracy(),
    ]
