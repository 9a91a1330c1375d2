"""Passes bounded by a token budget (attrib_bench.toolkit.budget)."""

from __future__ import annotations

import math

import pytest

from attrib_bench.toolkit.budget import per_pass


def pieces(count: int, cost: int, budget: int) -> list[range]:
    """The passes as Captum cuts them from ``per_pass``: consecutive chunks of that size."""
    size = per_pass(count, cost, budget)
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


@pytest.mark.parametrize("count", [0, 1, 2, 7, 50, 64, 101])
@pytest.mark.parametrize("cost", [1, 3, 40, 255, 512, 5000])
@pytest.mark.parametrize("budget", [1, 16, 512, 2048, 8192])
def test_pieces_cover_the_work_in_order_within_the_budget(count, cost, budget):
    parts = pieces(count, cost, budget)
    assert [i for part in parts for i in part] == list(range(count))  # all, in order, once
    assert all(len(part) >= 1 for part in parts)
    fit = max(1, budget // cost)
    for part in parts:  # within the budget, or one item that alone is over it
        assert len(part) * cost <= budget or len(part) == 1
    # as few passes as fit, each of per_pass items but the last, which holds what is left
    assert len(parts) == math.ceil(count / fit)
    size = per_pass(count, cost, budget)
    assert all(len(part) == size for part in parts[:-1])
    assert not parts or len(parts[-1]) <= size


def test_a_long_input_gets_fewer_items_per_pass_not_a_larger_pass():
    assert per_pass(50, 20, 2048) == 50  # a short sentence: every IG step in one pass
    assert per_pass(50, 255, 2048) == 8  # a 255-token review: seven passes of at most 8
    assert per_pass(50, 512, 2048) == 4
    assert per_pass(50, 4096, 2048) == 1  # over the budget: one at a time
