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
  embedding output (``LoadedModel.embeddings``) to the zero vector, ``delete`` drops the token
  and re-packs the sequence. ``auto`` (the default) is ``mask`` where the tokenizer has a mask
  token (the encoders) and ``delete`` where it has none (decoders: see ``resolve_removal``).
  The first three keep every token where it was: they pass the unmodified input's position ids,
  since RoBERTa-family models would otherwise renumber the tokens after a [PAD]. ``delete`` is a
  genuine deletion: the model numbers the re-packed sequence itself. A language model is read
  at the target position: the original one where tokens stay in place, the re-packed input's
  own (its last real token under ``position=last``) after ``delete``.
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

ferret 0.4.2's protocol (``AOPC_Comprehensiveness_Evaluation``, ``AOPC_Sufficiency_Evaluation``
and ``AOPC_Comprehensiveness_Evaluation_by_class`` in ferret's evaluators/, default arguments)
is ``protocol=ferret`` on comprehensiveness and sufficiency: see ``AOPC``. The default,
``protocol=attrib-bench``, is the conventions above.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator

import numpy as np
import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext, UsageError
from attrib_bench.core.interfaces import scored_classes
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.erasure import (
    CACHE_KEY,
    REMOVALS,
    erased_log_probs,
    explained,
    plan_erasures,
    resolve_removal,
    round_trip_restores,
)
from attrib_bench.toolkit.ranking import ROUNDINGS, rationale_mask, scored_row

AOPC_RATIOS = "0.1/0.2/0.3/0.4/0.5/0.6/0.7/0.8/0.9"
CURVE_RATIOS = "0/0.1/0.2/0.3/0.4/0.5/0.6/0.7/0.8/0.9/1"


def parse_ratios(text: str) -> tuple[float, ...]:
    """``"0.1/0.2"`` -> (0.1, 0.2): a "/"-separated list, since "," separates parameters."""
    try:
        ratios = tuple(float(part) for part in text.split("/") if part.strip())
    except ValueError:
        raise UsageError(f"ratios must be numbers separated by '/', got {text!r}") from None
    if not ratios or any(not 0.0 <= r <= 1.0 for r in ratios):
        raise UsageError(f"ratios must lie in [0, 1], got {text!r}")
    return ratios


class Erasure(Configurable, ABC):
    """Shared machinery: erase by rank, run the variants batched, reduce per example."""

    needs_reference = False
    in_default_run = False
    higher_is_better = True
    family = "faithfulness"
    #: "remove" erases the top k; "keep" erases everything but the top k.
    mode = "remove"
    parameters = {"ratios": AOPC_RATIOS, "removal": "auto", "layer": -1, "chunk_tokens": 8192}
    choices = {"removal": REMOVALS}
    parameter_docs = {
        "ratios": "the shares erased, '/'-separated, each in [0, 1]: k = ceil(ratio * n) of the "
        "n real non-special tokens; the score is the mean over them",
        "removal": "how a token is erased: mask ([MASK]), pad ([PAD], attention kept), zero "
        "(zero embedding), delete (re-packed), retokenize (kept tokens decoded and tokenised "
        "again, ferret's); auto: mask where the tokenizer has one, else delete",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
        "chunk_tokens": "the most tokens in one batched pass of erased inputs; bounds memory; "
        "an integer >= 1",
    }

    def validate(self) -> None:
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
        plan_erasures(context.trace, list(keys.values()), self.params["chunk_tokens"])

    def erased(
        self,
        attribution: Attribution,
        context: EvalContext,
        evaluated_RB: np.ndarray | None = None,
    ) -> np.ndarray:
        """Log-probabilities after erasure at every ratio: (R, B, C), NaN for unscoreable rows
        and for the steps ``evaluated_RB`` leaves out (never run; default: none)."""
        trace = context.trace
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
        original_BC = torch.log_softmax(context.trace.logits_BC.double(), dim=-1).cpu().numpy()
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
    ``removal=retokenize`` (the kept tokens decoded and tokenised again)."""

    parameters = {
        **Erasure.parameters,
        "protocol": "attrib-bench",
        "rationale": "top-k",
        "rounding": "ceil",
        "repeats": "keep",
        "empty": "score",
    }
    choices = {
        **Erasure.choices,
        "protocol": PROTOCOLS,
        "rationale": ("top-k", "positive"),
        "rounding": ROUNDINGS,
        "repeats": ("keep", "skip"),
        "empty": ("score", "skip"),
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
    }
    #: The score of an example none of whose steps is evaluated (ferret's constant).
    no_step: float

    def configure(self, raw):
        if raw.get("protocol") == "ferret":
            raw = {**FERRET_PROTOCOL, **raw}
        return super().configure(raw)

    def evaluated(self, rationale_RBN: np.ndarray) -> np.ndarray:
        """(R, B) True at the steps that count: all, unless ``empty=skip`` or ``repeats=skip``
        leave out the empty rationales and those equal to the last step evaluated (ferret)."""
        skip_empty, skip_repeats = self.params["empty"] == "skip", self.params["repeats"] == "skip"
        evaluated_RB = np.ones(rationale_RBN.shape[:2], dtype=bool)
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
        trace = context.trace
        classes, foils = scored_classes(context.attributor, trace)
        if foils is not None:  # s is already the log-odds of y to the foil
            return (original_B[None, :] - erased_RB).mean(axis=0)
        classes_B = classes.cpu().numpy()
        original_BC = torch.log_softmax(trace.logits_BC.double(), dim=-1).cpu().numpy()
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
        LogOdds(),
        MaskedAccuracy(),
    ]
