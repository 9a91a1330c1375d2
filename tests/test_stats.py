"""Summaries and the vectorised Spearman against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from attrib_bench.results.stats import DRAW_BLOCK, bootstrap_ci, spearman_rows, summarize


def test_spearman_rows_equals_scipy_with_ties():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, size=(6, 9)).astype(float)  # many ties
    b = rng.normal(size=9)
    ours = spearman_rows(a, b)
    for row, value in zip(a, ours, strict=True):
        assert value == pytest.approx(spearmanr(row, b).statistic, abs=1e-12)


def test_constant_row_is_nan_like_scipy():
    ours = spearman_rows(np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 3.0]]), np.array([3.0, 1.0, 2.0]))
    assert math.isnan(ours[0]) and ours[1] == pytest.approx(-0.5)


def test_summary_counts_nan_apart():
    summary = summarize(np.array([0.5, np.nan, 0.7, 0.6]), seed=0)
    assert summary["n"] == 3 and summary["nan"] == 1
    assert summary["mean"] == pytest.approx(0.6)
    assert summary["std"] == pytest.approx(0.1)
    low, high = summary["ci95"]
    assert 0.5 <= low <= 0.6 <= high <= 0.7


def test_bootstrap_is_seeded():
    values = np.random.default_rng(1).normal(size=50)
    assert bootstrap_ci(values, 3) == bootstrap_ci(values, 3)
    assert bootstrap_ci(values, 3) != bootstrap_ci(values, 4)
    assert all(math.isnan(v) for v in bootstrap_ci(values[:1], 0))


def test_corpus_summary_with_the_mean_is_the_plain_summary():
    """Same bootstrap draws either way: a corpus statistic that is the mean changes nothing."""
    from attrib_bench.results.stats import summarize_corpus

    values = np.random.default_rng(3).normal(size=(40, 2))
    values[5, 1] = np.nan  # a row with an undefined part is left out whole
    corpus = summarize_corpus(values, lambda rows: float(rows[:, 0].mean()), seed=7)
    plain = summarize(np.delete(values[:, 0], 5), seed=7)
    assert corpus["mean"] == pytest.approx(plain["mean"])
    assert corpus["ci95"] == pytest.approx(plain["ci95"])
    assert (corpus["n"], corpus["nan"]) == (39, 1)
    assert np.isnan(corpus["std"])


@pytest.mark.parametrize("n", [1, 7, 5000, 300_000])
def test_blocked_draws_are_the_draws_of_one_call(n):
    """The bootstrap draws its (resamples, n) indices in blocks of bounded size: the same
    numbers as one draw, so every CI is what it was."""
    from attrib_bench.results.stats import resample_blocks

    blocks = list(resample_blocks(n, seed=5, resamples=50))
    assert max(block.size for block in blocks) <= max(n, DRAW_BLOCK)
    whole = np.random.default_rng(5).integers(0, n, size=(50, n))
    assert np.array_equal(np.concatenate(blocks), whole)


def test_the_bootstrap_of_many_examples_needs_little_memory():
    """50,000 examples: one draw of (1000, 50,000) indices and their values would hold 800 MB;
    the blocks hold a few tens, for the CI and for the paired comparison's shared resampling."""
    import tracemalloc

    from attrib_bench.results.paired import resampled_means

    values = np.random.default_rng(0).normal(size=(50_000, 3))
    tracemalloc.start()
    bootstrap_ci(values[:, 0], seed=0)
    resampled_means(values, seed=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20, peak / 2**20
