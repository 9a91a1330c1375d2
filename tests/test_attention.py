"""Raw attention and rollout on hand-checked matrices."""

from __future__ import annotations

import pytest
import torch

from attrib_bench.core.interfaces import Batch
from attrib_bench.core.trace import Trace
from attrib_bench.toolkit.aggregation import pair_mask, rollout
from attrib_bench_plugins.attention import RawAttention, Rollout

# Two layers, three real tokens. Each layer's two heads average to W1 and W2 below.
W1 = torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
W2 = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])


def heads(mean: torch.Tensor) -> torch.Tensor:
    """Two heads (H, N, K) whose mean is ``mean``: one sharper, one flatter, rows still sum to 1."""
    uniform = torch.full_like(mean, 1.0 / mean.shape[-1])
    return torch.stack([1.5 * mean - 0.5 * uniform, 0.5 * mean + 0.5 * uniform])


def hand_trace(pad: int = 0) -> Trace:
    """A trace holding only W1 and W2 (plus ``pad`` padded positions filled with garbage)."""
    n = 3 + pad
    layers = []
    for mean in (W1, W2):
        attention = torch.rand(2, n, n)  # garbage everywhere, overwritten on the real block
        attention[:, :3, :3] = heads(mean)
        attention[:, :3, 3:] = 0.0  # padded keys get no attention
        layers.append(attention[None])
    mask = torch.tensor([[1] * 3 + [0] * pad])
    batch = Batch([], torch.zeros_like(mask), mask, None, torch.zeros_like(mask), [])
    return Trace(batch=batch, loaded=None, logits_BC=torch.zeros(1, 2), attentions=tuple(layers))


@pytest.mark.parametrize("pad", [0, 2])
def test_raw_attention_rows(pad):
    result = RawAttention().attribute(hand_trace(pad))
    local = result.local_BLN[0, :, :3]
    torch.testing.assert_close(local, torch.stack([W1[0], W2[0]]))
    # No residual: R^2 = W2 @ W1, row 0 = 1.0 * W1[1] = [0, 1, 0]; padded positions get 0.
    padded = torch.zeros(pad)
    expected = torch.stack(
        [torch.cat([W1[0], padded]), torch.cat([torch.tensor([0.0, 1.0, 0.0]), padded])]
    )
    torch.testing.assert_close(result.aggregated_BLN[0], expected)


@pytest.mark.parametrize("pad", [0, 2])
def test_rollout_hand_checked(pad):
    result = Rollout().attribute(hand_trace(pad))
    # M1 = 0.5 W1 + 0.5 I = [[.75, .25, 0], [0, 1, 0], [.1, .15, .75]]
    # M2 = 0.5 W2 + 0.5 I = [[.5, .5, 0], [.25, .75, 0], [0, 0, 1]]
    # row 0 of M2 @ M1 = .5 * [.75, .25, 0] + .5 * [0, 1, 0] = [.375, .625, 0]
    expected_local = torch.tensor([[0.75, 0.25, 0.0], [0.5, 0.5, 0.0]])
    expected_aggregated = torch.tensor([[0.75, 0.25, 0.0], [0.375, 0.625, 0.0]])
    torch.testing.assert_close(result.local_BLN[0, :, :3], expected_local)
    torch.testing.assert_close(result.aggregated_BLN[0, :, :3], expected_aggregated)
    if pad:
        assert result.aggregated_BLN[0, :, 3:].abs().max() == 0


def test_rollout_residual_parameter():
    result = Rollout().configure({"residual": "0.9"}).attribute(hand_trace())
    # M1 row 0 = 0.1 * [.5, .5, 0] + 0.9 * [1, 0, 0] = [.95, .05, 0]
    torch.testing.assert_close(result.local_BLN[0, 0, :3], torch.tensor([0.95, 0.05, 0.0]))
    # rollout rows of row-stochastic matrices stay row-stochastic
    torch.testing.assert_close(result.aggregated_BLN.sum(-1), torch.ones(1, 2))


def test_configure_returns_a_copy():
    base = Rollout()
    configured = base.configure({"residual": "0.7"})
    assert base.params["residual"] == 0.5 and configured.params["residual"] == 0.7


def test_a_deep_unnormalised_rollout_stays_finite_with_exact_ratios():
    """40 layers with row sums near 100 pass float32's range (1e80); the rows come back finite
    and proportional to the float64 product's, while a shallow rollout is left as it is."""
    generator = torch.Generator().manual_seed(0)
    mask_BN = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    matrices = [
        torch.rand(2, 4, 4, generator=generator) * 50 * pair_mask(mask_BN) for _ in range(40)
    ]
    rows_BLN = rollout(matrices, mask_BN)
    assert torch.isfinite(rows_BLN).all()
    reference = None
    for layer, matrix in enumerate(matrices):
        matrix = matrix.double()
        reference = matrix if reference is None else matrix @ reference
        for b in range(2):
            expected = reference[b, 0] / reference[b, 0].max()
            got = rows_BLN[b, layer].double() / rows_BLN[b, layer].double().max()
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=0)
    shallow = rollout(matrices[:3], mask_BN)
    assert torch.equal(shallow[:, 2], (matrices[2] @ (matrices[1] @ matrices[0]))[:, 0])
