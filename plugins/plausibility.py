"""Plausibility: agreement with word-level human rationales, by the ERASER definitions.

Subword scores become word scores through the fast tokenizer's offsets (``Batch.word_ids_BN``):
the sum of a word's pieces (``pool=max``: their maximum), for the words of ``text.split()`` that
the input still holds; words cut off by truncation are left out (the run reports the share of
rationale words lost). An example without rationale words among them is unscoreable (NaN), as
HateXplain's non-toxic posts are. As for faithfulness, the method's last aggregated row is scored
unless ``layer=l`` says otherwise.

Per example (DeYoung et al., "ERASER", ACL 2020, section 4.1 and its ``metrics.py``):

- ``token-f1``: the top-k words (k = the number of rationale words; ``k_ratio=r``: ceil(r * words))
  are the predicted rationale; precision, recall and F1 over word positions
  (``score_hard_rationale_predictions``, its ``instance_macro`` F1 is the mean of these).
- ``iou-f1``: the predicted words' maximal runs are spans; a predicted span is a true positive
  when its best intersection-over-union with a rationale span is >= 0.5; precision = TP / predicted
  spans, recall = TP / rationale spans (``partial_match_score`` for one instance). The default,
  ``part=f1``, is ERASER's macro IOU F1: the F1 of the mean precision and the mean recall over
  the scored examples (every one has rationale and predicted words, so both means run over the
  same examples, as in ERASER). That is no mean of per-example values, so the evaluator states
  it as a corpus-level statistic (``parts``, ``aggregate``) for the runner to summarise; the
  per-example score it returns is the instance's own F1. ``part=instance-f1`` is the mean of
  those per-example F1s; ``part=precision`` and ``part=recall`` the two means.
- ``auprc``: the area under the precision-recall curve of the soft word scores, sklearn's
  ``precision_recall_curve`` integrated by the trapezoid rule (ERASER's ``_auprc``).

Rationale spans are the maximal runs of rationale words, exactly ERASER's evidence spans on
``eraser_movies`` and ``hatexplain_eraser``, whose spans never touch or overlap.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext, UsageError
from attrib_bench.data.rationales import word_scores
from attrib_bench.toolkit.ranking import auprc, ratio_k, scored_row


def top_k_words(scores: np.ndarray, k: int) -> np.ndarray:
    """Mask of the k highest scores; ties go to the earlier word."""
    order = np.lexsort((np.arange(len(scores)), -scores))
    chosen = np.zeros(len(scores), dtype=bool)
    chosen[order[:k]] = True
    return chosen


def f1(precision: float, recall: float) -> float:
    """ERASER's ``_f1``: 0 when either part is 0."""
    if precision == 0 or recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def token_prf(truth: np.ndarray, predicted: np.ndarray) -> tuple[float, float, float]:
    """Instance precision, recall and F1 of predicted against true word positions."""
    overlap = int((truth & predicted).sum())
    precision = overlap / predicted.sum() if predicted.any() else 0.0
    recall = overlap / truth.sum() if truth.any() else 0.0
    return precision, recall, f1(precision, recall)


def spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of True as [start, end) pairs."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


def iou_prf(
    truth: np.ndarray, predicted: np.ndarray, threshold: float = 0.5
) -> tuple[float, float, float]:
    """ERASER's partial match for one instance: precision, recall, F1 at an IOU threshold."""
    true_spans, predicted_spans = spans(truth), spans(predicted)
    hits = 0
    for p_start, p_end in predicted_spans:
        best = 0.0
        for t_start, t_end in true_spans:
            overlap = max(0, min(p_end, t_end) - max(p_start, t_start))
            union = (p_end - p_start) + (t_end - t_start) - overlap
            best = max(best, overlap / union if union else 0.0)
        hits += best >= threshold
    precision = hits / len(predicted_spans) if predicted_spans else 0.0
    recall = hits / len(true_spans) if true_spans else 0.0
    return precision, recall, f1(precision, recall)


class Plausibility(Configurable, ABC):
    """Word scores of the scored row, against each example's word rationale."""

    needs_reference = False
    in_default_run = False
    family = "plausibility"
    parameters = {"pool": "sum", "layer": -1}
    choices = {"pool": ("sum", "max")}
    parameter_docs = {
        "pool": "a word's score from its pieces' scores: sum or max",
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
    }
    #: Per-example values of a corpus-level statistic (see IouF1), returned as "aggregated/<part>".
    parts: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")

    @abstractmethod
    def metric(self, truth: np.ndarray, scores: np.ndarray) -> float:
        """The per-example score of the visible words' rationale and soft scores."""

    def metrics(self, truth: np.ndarray, scores: np.ndarray) -> tuple[float, ...]:
        """The per-example score, then the value of each of ``parts``."""
        return (self.metric(truth, scores),)

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        batch = context.trace.batch
        if all(e.rationale is None for e in batch.examples):
            raise UsageError(
                "the dataset has no word rationales (use an ERASER folder such as "
                "HateXplain's ERASER release, or the default dataset)"
            )
        if batch.word_ids_BN is None:
            raise UsageError("the batch has no word alignment (make it with make_batches)")
        rows_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        keys = ("aggregated", *(f"aggregated/{part}" for part in self.parts))
        out = {key: np.full(len(batch.examples), math.nan) for key in keys}
        for row, example in enumerate(batch.examples):
            if example.rationale is None:
                continue
            rationale = np.asarray(example.rationale, dtype=bool)
            pooled, visible = word_scores(
                rows_BN[row], batch.word_ids_BN[row].numpy(), len(rationale), self.params["pool"]
            )
            truth = rationale[visible]
            if truth.any() and np.isfinite(pooled[visible]).all():
                for key, value in zip(keys, self.metrics(truth, pooled[visible]), strict=True):
                    out[key][row] = value
        return {key: values[None, :] for key, values in out.items()}


class TokenF1(Plausibility):
    """Token F1 of the top-k words against the rationale's words.

    Reference: DeYoung et al. 2020, "ERASER: A Benchmark to Evaluate Rationalized NLP
    Models", ACL.
    """

    name = "token-f1"
    description = "Token F1 of the top-k words vs human rationales (ERASER; k = rationale size)"
    parameters = {**Plausibility.parameters, "k_ratio": 0.0}
    parameter_docs = {
        **Plausibility.parameter_docs,
        "k_ratio": "the predicted words: 0, as many as the rationale has; r > 0, the top "
        "ceil(r * words); in [0, 1]",
    }

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.params["k_ratio"] <= 1.0:
            raise self.out_of_range("k_ratio", "in [0, 1] (0: the rationale size)")

    def predicted(self, truth: np.ndarray, scores: np.ndarray) -> np.ndarray:
        ratio = self.params["k_ratio"]
        k = ratio_k(ratio, len(scores)) if ratio > 0 else int(truth.sum())
        return top_k_words(scores, k)

    def metric(self, truth: np.ndarray, scores: np.ndarray) -> float:
        return token_prf(truth, self.predicted(truth, scores))[2]


class IouF1(TokenF1):
    """ERASER's partial match; by default its macro F1, a corpus-level statistic.

    With ``part=f1``, ``score`` returns each example's own F1 under "aggregated" and its
    precision and recall under "aggregated/precision" and "aggregated/recall" (``parts``); the
    runner summarises the examples with ``aggregate`` over those two columns, its bootstrap
    resampling examples, instead of averaging the per-example F1.

    Reference: DeYoung et al. 2020, "ERASER: A Benchmark to Evaluate Rationalized NLP
    Models", ACL.
    """

    name = "iou-f1"
    description = (
        "ERASER macro IOU F1: F1 of the mean precision and recall of top-k word spans "
        "matching a rationale span at IOU >= 0.5"
    )
    parameters = {**TokenF1.parameters, "part": "f1"}
    choices = {**TokenF1.choices, "part": ("f1", "instance-f1", "precision", "recall")}
    parameter_docs = {
        **TokenF1.parameter_docs,
        "part": "f1: ERASER's macro F1 of the mean precision and recall; instance-f1: the mean "
        "of per-example F1s; precision or recall: that mean alone",
    }

    @property
    def parts(self) -> tuple[str, ...]:
        return ("precision", "recall") if self.params["part"] == "f1" else ()

    def metrics(self, truth: np.ndarray, scores: np.ndarray) -> tuple[float, ...]:
        precision, recall, score = iou_prf(truth, self.predicted(truth, scores))
        if self.parts:
            return score, precision, recall
        return ({"precision": precision, "recall": recall}.get(self.params["part"], score),)

    def metric(self, truth: np.ndarray, scores: np.ndarray) -> float:
        return self.metrics(truth, scores)[0]

    def aggregate(self, values_EP: np.ndarray) -> float:
        """ERASER's macro F1 of the examples given, rows of (precision, recall) as in ``parts``."""
        precision, recall = np.asarray(values_EP, dtype=float).mean(axis=0)
        return f1(float(precision), float(recall))


class Auprc(Plausibility):
    """The area under the precision-recall curve of the word scores against the rationale.

    Reference: DeYoung et al. 2020, "ERASER: A Benchmark to Evaluate Rationalized NLP
    Models", ACL.
    """

    name = "auprc"
    description = "AUPRC of soft word scores vs human rationales (ERASER)"

    def metric(self, truth: np.ndarray, scores: np.ndarray) -> float:
        return auprc(truth, scores)


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [TokenF1(), IouF1(), Auprc()]
