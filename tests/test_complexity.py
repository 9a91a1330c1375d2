"""Sparseness (Gini index) and complexity (entropy): float64 references from the definitions,
their extreme rows, the candidate tokens they read, and a run through the API."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

import attrib_bench
from attrib_bench import Attribution, EvalContext, UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.erasure import candidates
from attrib_bench_plugins.complexity import (
    Complexity,
    Sparseness,
    contribution_entropy,
    gini_index,
)


def gini_reference(values: list[float]) -> float:
    """Hurley & Rickard's Gini index (Chalasani et al.'s sparseness), from its definition:
    1 - 2 sum_k (c_(k) / ||c||_1) (n - k + 1/2) / n, the c_(k) sorted ascending."""
    c = sorted(abs(v) for v in values)
    n, total = len(c), math.fsum(abs(v) for v in values)
    return 1 - 2 * math.fsum(c[k - 1] / total * (n - k + 0.5) / n for k in range(1, n + 1))


def entropy_reference(values: list[float]) -> float:
    total = math.fsum(abs(v) for v in values)
    return -math.fsum(abs(v) / total * math.log(abs(v) / total) for v in values if v != 0)


def test_gini_and_entropy_equal_their_definitions_on_random_rows():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 17):
        for _ in range(5):
            values = rng.normal(size=n) * rng.exponential(size=n)
            values[rng.random(n) < 0.2] = 0.0
            if not values.any():
                continue
            magnitudes = np.abs(values)
            assert gini_index(magnitudes) == pytest.approx(gini_reference(values), abs=1e-12)
            assert contribution_entropy(magnitudes) == pytest.approx(
                entropy_reference(values), abs=1e-12
            )


@pytest.mark.parametrize("n", [2, 3, 10])
def test_one_hot_is_sparsest_and_uniform_is_the_most_complex(n):
    one_hot = np.zeros(n)
    one_hot[n // 2] = 3.0
    uniform = np.full(n, 0.7)
    assert gini_index(one_hot) == pytest.approx((n - 1) / n, abs=1e-15)
    assert contribution_entropy(one_hot) == 0.0
    assert gini_index(uniform) == pytest.approx(0.0, abs=1e-15)
    assert contribution_entropy(uniform) == pytest.approx(math.log(n), abs=1e-14)
    rows = np.abs(np.random.default_rng(n).normal(size=(50, n)))
    assert all(0 <= gini_index(r) <= (n - 1) / n + 1e-12 for r in rows)
    assert all(0 <= contribution_entropy(r) <= math.log(n) + 1e-12 for r in rows)


def test_undefined_rows_are_nan():
    for measure in (gini_index, contribution_entropy):
        assert math.isnan(measure(np.zeros(4)))
        assert math.isnan(measure(np.zeros(0)))


@pytest.fixture(scope="module")
def trace(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    return trace_batch(loaded, one_batch(loaded, examples()), set())


def test_scores_read_the_scored_row_over_candidate_tokens_only(trace):
    """Special tokens and padding carry huge scores here: the scores must not see them."""
    keep_BN = candidates(trace)
    B, N = keep_BN.shape
    rows = torch.rand(B, 2, N, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rows = rows - 0.5  # signed: magnitudes are scored
    real = trace.batch.attention_mask_BN.bool()
    rows[torch.as_tensor(~keep_BN)[:, None, :].expand_as(rows) & real[:, None, :]] = 1e6
    rows[~real[:, None, :].expand_as(rows)] = 0.0
    attribution = Attribution(aggregated_BLN=rows)
    context = EvalContext(trace, None, 0)
    for evaluator, measure in ((Sparseness(), gini_reference), (Complexity(), entropy_reference)):
        for layer, row in ((-1, 1), (1, 0)):
            configured = evaluator.configure({"layer": str(layer)})
            scores = configured.score(attribution, context)["aggregated"]
            expected = [measure(rows[b, row][keep_BN[b]].tolist()) for b in range(B)]
            assert scores.shape == (1, B)
            np.testing.assert_allclose(scores[0], expected, rtol=0, atol=1e-12)


def test_layer_range_is_validated():
    for evaluator in (Sparseness(), Complexity()):
        for bad in ("0", "-2"):
            with pytest.raises(UsageError, match=rf"{evaluator.name}:layer must be"):
                evaluator.configure({"layer": bad})


def test_a_run_reports_both(tiny_bert):
    result = attrib_bench.run(
        model=str(tiny_bert),
        limit=4,
        attributors=["random", "attention"],
        evaluators=["sparseness", "complexity"],
        cache=False,
    )
    for method in ("random", "attention"):
        row = result.methods[method]
        assert row.evaluators["sparseness"]["status"] == "ok"
        sparse, complex_ = row.example_scores("sparseness"), row.example_scores("complexity")
        assert sparse.shape == (4,) and np.isfinite(sparse).all() and (sparse >= 0).all()
        assert np.isfinite(complex_).all() and (complex_ >= 0).all()
    assert result.evaluator_info["complexity"]["higher_is_better"] is False
