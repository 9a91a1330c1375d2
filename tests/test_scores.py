"""The run's compact per-example score columns behave as the dicts they replace, and hold an
example's scores in its L numbers (no array object of its own)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from attrib_bench.runner.scores import ExampleIndex, ScoreColumn


def test_a_column_reads_back_what_was_written_in_any_order():
    index = ExampleIndex()
    first, second = ScoreColumn(index), ScoreColumn(index)
    expected = {}
    rng = np.random.default_rng(0)
    for number in range(40):  # past the first growth (16 rows)
        example = f"ex-{number}"
        expected[example] = rng.normal(size=3)
        first[example] = expected[example]
    second["ex-7"] = [1.0, np.nan, 3.0]  # another column of the method: its own examples
    assert len(first) == 40 and list(first) == list(expected)
    for example, values in expected.items():
        assert np.array_equal(first[example], values)
    assert list(second) == ["ex-7"] and "ex-8" not in second and "ex-7" in second
    assert np.array_equal(second["ex-7"], [1.0, np.nan, 3.0], equal_nan=True)
    first["ex-3"] = [9.0, 9.0, 9.0]  # a rewrite replaces, never adds
    assert len(first) == 40 and first["ex-3"].tolist() == [9.0, 9.0, 9.0]
    read = first["ex-4"]
    read[0] = 123.0  # a copy: the column is unchanged
    assert first["ex-4"][0] == expected["ex-4"][0]
    with pytest.raises(KeyError):
        second["ex-8"]
    with pytest.raises(ValueError, match="2 layers for 'ex-41', 3 before"):
        first["ex-41"] = [1.0, 2.0]


def test_twenty_thousand_examples_cost_their_numbers_not_an_array_each():
    """20,000 examples x 6 layers in 3 columns of one method: at most 1.5x the float64 numbers
    (doubling growth) plus the shared index, against about 4x for an array per example."""
    ids = [f"sst2-train-{i}" for i in range(20_000)]
    values = np.ones(6)
    tracemalloc.start()
    index = ExampleIndex()
    columns = [ScoreColumn(index) for _ in range(3)]
    for column in columns:
        for example in ids:
            column[example] = values
    compact, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tracemalloc.start()
    plain = [{example: values.copy() for example in ids} for _ in range(3)]
    per_array, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    numbers = 3 * len(ids) * 6 * 8
    assert compact < 2.2 * numbers  # allocated rows (<= 2x) plus one index of 20,000 ids
    assert per_array > 3 * numbers and len(plain) == 3
