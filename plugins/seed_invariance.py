"""Seed invariance of attributions: does an explanation describe the data, or the seed?

In a run over several models of one architecture (``run --models A,B,...``: fine-tuning
seeds, MultiBERTs, pretraining-seed proxies), per example and layer, the agreement between a
method's rows of the same input under two models: Spearman over the example's real tokens
([CLS] and [SEP] included, as the ``spearman`` evaluator), or the Jaccard overlap of the top k
tokens (ties to the earlier position, as the faithfulness evaluators rank). ``against=seeds``
averages every pair of the run's models; ``against=random-init`` averages each model against a
randomly initialised one of the same architecture: the floor the seed agreement must beat.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

import attrib_bench
from attrib_bench import Configurable
from attrib_bench.results.stats import spearman_rows
from attrib_bench.toolkit.ranking import top_k_mask


def top_k_jaccard(a_LN: np.ndarray, b_LN: np.ndarray, k: int) -> np.ndarray:
    """Per row, |top k of a & top k of b| / |top k of a | top k of b| (k capped at N)."""
    layers, n = a_LN.shape
    everything = np.ones((layers, n), dtype=bool)
    k_L = np.full(layers, min(k, n))
    top_a = top_k_mask(a_LN, everything, k_L)
    top_b = top_k_mask(b_LN, everything, k_L)
    return (top_a & top_b).sum(axis=1) / (top_a | top_b).sum(axis=1)


class SeedInvariance(Configurable):
    """Agreement of a method's rows of the same input under models that differ in their seed.

    Reference: none (this project's evaluator; its question follows Ren et al. 2023, "All Roads
    Lead to Rome? Exploring the Invariance of Transformers' Representations", arXiv).
    """

    name = "seed-invariance"
    description = (
        "agreement of a method's rows of the same input under two models (--models), per layer: "
        "Spearman or top-k Jaccard, mean over model pairs (against=random-init: the floor)"
    )
    family = "invariance"
    parameters = {"measure": "spearman", "k": 5, "against": "seeds"}
    choices = {"measure": ("spearman", "jaccard"), "against": ("seeds", "random-init")}
    parameter_docs = {
        "measure": "spearman over the real tokens, or jaccard: the overlap of the top k tokens",
        "k": "the top tokens jaccard compares (capped at the token count); an integer >= 1",
        "against": "seeds: the mean over every pair of the run's models; random-init: each "
        "model against a randomly initialised one, the floor",
    }

    def validate(self) -> None:
        if self.params["k"] < 1:
            raise self.out_of_range("k", "at least 1")

    @property
    def needs_floor(self) -> bool:
        return self.params["against"] == "random-init"

    def _agreement(self, a_LN: np.ndarray, b_LN: np.ndarray) -> np.ndarray:
        if a_LN.shape != b_LN.shape:
            raise ValueError(
                f"rows of shape {a_LN.shape} and {b_LN.shape}: the models must share the "
                "tokenizer and the number of layers"
            )
        if self.params["measure"] == "spearman":
            return spearman_rows(a_LN, b_LN)
        return top_k_jaccard(a_LN, b_LN, self.params["k"])

    def score_models(self, rows: list[np.ndarray], floor: np.ndarray | None) -> np.ndarray:
        if self.needs_floor:
            if floor is None:
                raise ValueError("against=random-init needs the random-init model's rows")
            pairs = [(one, floor) for one in rows]
        else:
            if len(rows) < 2:
                raise ValueError(f"{len(rows)} model(s): seed agreement needs at least 2")
            pairs = list(combinations(rows, 2))
        return np.mean([self._agreement(a, b) for a, b in pairs], axis=0)


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [SeedInvariance()]
