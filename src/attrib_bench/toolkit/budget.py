"""Passes bounded by a token budget: how many items of one length a batched model pass holds.

An item is a sequence of ``cost`` tokens (an example's path step, a perturbed input): a pass of
k items holds k * cost tokens, and its memory (activations, kept for the backward pass where
there is one) grows with that, whatever the batch's example count. Long inputs then get fewer
items per pass instead of a larger pass.
"""

from __future__ import annotations

import math


def per_pass(count: int, cost: int, budget: int) -> int:
    """Items per pass when ``count`` items of ``cost`` tokens run in passes of at most
    ``budget`` tokens: as few passes as fit, made as even as their number allows (so that an
    API that cuts consecutive passes of this size, Captum's ``internal_batch_size`` and
    ``perturbations_per_eval``, makes that many passes). At least one: an item over the budget
    runs alone."""
    fit = max(1, budget // max(1, cost))
    passes = max(1, math.ceil(count / fit))
    return max(1, math.ceil(count / passes))
