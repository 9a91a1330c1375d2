"""Completeness: how far a method's attributions are from summing to the score it explains.

A method declares what its rows sum to with ``completeness`` (``AttributorInfo.completeness``):

- ``"score"``: each example's row sums to the explained score f(x) itself (a decomposition
  of the logit, biases included: DecompX with its head);
- ``"score-change"``: to f(x) - f(x'), x' the method's baseline, whose token ids the method
  gives with ``completeness_baseline(trace) -> (B, N)`` at the input's positions (Integrated
  Gradients with ``reduce=sum``: Sundararajan et al.'s completeness axiom).

f is the score the method explains (``scored_classes``: its ``target=`` class's logit, or the
run's target score; logit(y) - logit(foil) under a contrastive target), computed here as the
Captum methods compute it (``scored_forward``), on each example alone over its real tokens, in
the model's dtype. The row summed is the method's last aggregated row over the real tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from attrib_bench.core.interfaces import Attribution, scored_classes
from attrib_bench.core.plugin_info import attributor_info
from attrib_bench.toolkit.captum_inputs import example_arguments, scored_forward

if TYPE_CHECKING:
    from attrib_bench.core.trace import Trace


def _explained(forward: Any, ids_1N: torch.Tensor, arguments: dict) -> float:
    """f of one example: the target class's logit, or the contrastive score itself."""
    out = forward(ids_1N, *arguments["additional_forward_args"])
    target = arguments["target"]
    return float(out[0] if target is None else out[0, target[0]])


class Terms(NamedTuple):
    """Per example (B,), float64: the sum of the row, what it should sum to (f(x), or
    f(x) - f(x')), and |f(x)| + |f(x')|, the scale of the rounding in the latter."""

    sums_B: np.ndarray
    expected_B: np.ndarray
    scale_B: np.ndarray


@torch.no_grad()
def completeness_terms(attributor: Any, trace: Trace, attribution: Attribution) -> Terms | None:
    """The terms of ``attributor``'s claim on ``attribution``; None when it claims nothing."""
    claim = attributor_info(attributor).completeness
    if claim is None:
        return None
    batch = trace.batch
    forward = scored_forward(trace.loaded)
    classes_B, foils_B = scored_classes(attributor, trace)
    baseline_BN = attributor.completeness_baseline(trace) if claim == "score-change" else None
    rows_BN = attribution.aggregated_BLN[:, -1].detach().double() * batch.attention_mask_BN
    sums_B = rows_BN.sum(dim=-1).cpu().numpy()
    expected_B, scale_B = np.empty(len(sums_B)), np.empty(len(sums_B))
    for row in range(len(sums_B)):
        ids_1N, arguments = example_arguments(trace, row, classes_B, foils_B)
        expected_B[row] = scale_B[row] = _explained(forward, ids_1N, arguments)
        scale_B[row] = abs(scale_B[row])
        if baseline_BN is not None:
            real_N = batch.attention_mask_BN[row].bool()
            baseline_1N = baseline_BN[row : row + 1, real_N.to(baseline_BN.device)]
            at_baseline = _explained(forward, baseline_1N.to(ids_1N.device), arguments)
            expected_B[row] -= at_baseline
            scale_B[row] += abs(at_baseline)
    return Terms(sums_B, expected_B, scale_B)
