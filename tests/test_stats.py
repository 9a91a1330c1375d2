"""Summaries and the vectorised Spearman against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from attrib_bench.results.stats import bootstrap_ci, spearman_rows, summarize


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
