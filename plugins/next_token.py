"""Evaluators of next-token attributions against the word that decides the next token.

``mrr``: the reciprocal rank of the evidence word (the example's rationale word; of several,
the best-ranked one) among the prefix words the input holds, the mean of which is the MRR of
Ferrando et al. (ACL 2023) on BLiMP and IOI (``attrib_bench.data.next_token``). A word's score is
the sum of its pieces' attribution (``data.rationales.word_scores``), higher ranks first; special
tokens belong to no word and are left out. Ties rank pessimistically: every other word scoring
at least as high as the evidence ranks before it, so a constant row gets 1 / (number of words),
the worst, and a method cannot gain from giving many words one score. Scored for every layer of
both kinds (no model call); an example without rationale words among those it holds is NaN.

``mrr:unit=token,rank=dense`` is the published figures' own protocol (Ferrando et al.'s
notebook and ``lm_saliency.py``; docs/next-token.md): every prefix token of a word ranked alone,
rank = n - (dense rank of its score among the n tokens) + 1 (scipy's ``rankdata(..., 'dense')``;
equal scores share a rank, so with ties the top score's rank exceeds 1), and the best-ranked
token of the evidence word counts.
"""

from __future__ import annotations

import math

import numpy as np

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext, UsageError
from attrib_bench.data.rationales import word_scores


def reciprocal_rank(scores: np.ndarray, evidence: np.ndarray) -> float:
    """1 / the rank of the best-scored evidence word, ties pessimistic; NaN without evidence."""
    if not evidence.any():
        return math.nan
    best = scores[evidence].max()
    return 1.0 / (1 + int((scores[~evidence] >= best).sum()))


def dense_reciprocal_rank(scores: np.ndarray, evidence: np.ndarray) -> float:
    """1 / the best rank of an evidence token, rank = n - dense rank + 1 (the published
    notebook's); NaN without evidence."""
    from scipy import stats  # not at import: `attrib-bench list` loads every plugin

    if not evidence.any():
        return math.nan
    ranks = len(scores) - stats.rankdata(scores, method="dense") + 1
    return 1.0 / float(ranks[evidence].min())


class Mrr(Configurable):
    """The reciprocal rank of the evidence word among the prefix words, per layer.

    Reference: Ferrando et al. 2023, "Explaining How Transformers Use Context to Build
    Predictions", ACL.
    """

    name = "mrr"
    description = "Reciprocal rank of the evidence word among the prefix words (sum of pieces)"
    needs_reference = False
    in_default_run = False
    family = "plausibility"
    parameters = {"unit": "word", "rank": "pessimistic"}
    choices = {"unit": ("word", "token"), "rank": ("pessimistic", "dense")}
    parameter_docs = {
        "unit": "word: a word's score is the sum of its pieces', words ranked; token: every "
        "prefix token of a word ranked alone, the evidence word's best token counts",
        "rank": "pessimistic: every other unit scoring at least as high ranks before; dense: "
        "n - scipy's dense rank + 1, the published notebook's rule",
    }

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        batch = context.trace.batch
        if all(e.rationale is None for e in batch.examples):
            raise UsageError(
                "mrr needs an evidence word per example (a next-token dataset such as "
                "a folder of BLiMP CSVs, or word rationales)"
            )
        if batch.word_ids_BN is None:
            raise UsageError("the batch has no word alignment (make it with make_batches)")
        scores: dict[str, np.ndarray] = {}
        for kind in attrib_bench.KINDS:
            rows = attribution.rows(kind)
            if rows is None:
                continue
            rows_BLN = rows.detach().double().cpu().numpy()
            out_LB = np.full(rows_BLN.shape[:2][::-1], math.nan)
            for b, example in enumerate(batch.examples):
                if example.rationale is None:
                    continue
                evidence = np.asarray(example.rationale, dtype=bool)
                word_ids = batch.word_ids_BN[b].numpy()
                inside = word_ids >= 0  # tokens of a word: special tokens and padding are not
                rank = dense_reciprocal_rank if self.params["rank"] == "dense" else reciprocal_rank
                for layer, row in enumerate(rows_BLN[b]):
                    if self.params["unit"] == "token":
                        marked = evidence[word_ids[inside]]
                        out_LB[layer, b] = rank(row[inside], marked)
                    else:
                        pooled, visible = word_scores(row, word_ids, len(evidence))
                        out_LB[layer, b] = rank(pooled[visible], evidence[visible])
            scores[kind] = out_LB
        return scores


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [Mrr()]
