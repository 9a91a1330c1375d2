"""The invertible alignment map: GLOW-style blocks (docs/math/similarity.md, "Learned alignment
maps") built from FrEIA's modules and one of ours, a learned invertible linear layer.

FrEIA has affine couplings (``GLOWCouplingBlock``) but no learned *general* invertible linear
map (``FixedLinearTransform`` is fixed, ``OrthogonalTransform`` orthogonal), and without one a
stack of couplings cannot hold even a rotation. ``InvertibleLinear`` is GLOW's LU form (Kingma &
Dhariwal 2018, section 3.2), which reaches every invertible matrix. This module imports FrEIA
at its top: ``alignment`` imports it only once FrEIA is known to be installed.
"""

from __future__ import annotations

import FrEIA.framework as ff
import FrEIA.modules as fm
import torch
from torch import nn

#: A least-squares start whose smallest singular value is below this share of its largest is
#: treated as singular (not invertible): the map then starts at the identity.
SINGULAR = 1e-4


class InvertibleLinear(fm.InvertibleModule):
    """y = x A + b, A = P L (U + diag(sign * exp(log_s))): P a fixed permutation, L unit lower
    triangular, U strictly upper triangular, the diagonal's signs fixed; log|det A| = sum log_s.
    Starts as the identity; ``set_matrix`` moves it to any invertible A."""

    def __init__(self, dims_in, dims_c=None):
        super().__init__(dims_in, dims_c or [])
        d = dims_in[0][0]
        self.register_buffer("permutation", torch.eye(d))
        self.register_buffer("signs", torch.ones(d))
        self.lower = nn.Parameter(torch.zeros(d, d))
        self.upper = nn.Parameter(torch.zeros(d, d))
        self.log_scale = nn.Parameter(torch.zeros(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def matrix(self) -> torch.Tensor:
        eye = torch.eye(len(self.bias), dtype=self.bias.dtype, device=self.bias.device)
        lower = self.lower.tril(-1) + eye
        upper = self.upper.triu(1) + torch.diag(self.signs * self.log_scale.exp())
        return self.permutation @ lower @ upper

    @torch.no_grad()
    def set_matrix(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Set A (invertible) and b from their LU decomposition, A = P L U."""
        p, lower, upper = torch.linalg.lu(a.double())
        diagonal = torch.diagonal(upper)
        for target, value in (
            (self.permutation, p),
            (self.lower, lower),
            (self.upper, upper),
            (self.signs, diagonal.sign()),
            (self.log_scale, diagonal.abs().log()),
            (self.bias, b),
        ):
            target.copy_(value.to(target))

    def forward(self, x_or_z, c=None, rev: bool = False, jac: bool = True):
        (v,) = x_or_z
        a = self.matrix()
        log_det = self.log_scale.sum().expand(v.shape[0])
        if not rev:
            return (v @ a + self.bias,), log_det
        return (torch.linalg.solve(a.T, (v - self.bias).T).T,), -log_det

    def output_dims(self, input_dims):
        return input_dims


def _subnet(hidden: int):
    def build(d_in: int, d_out: int) -> nn.Module:
        net = nn.Sequential(
            nn.Linear(d_in, hidden), nn.SELU(), nn.Linear(hidden, hidden), nn.SELU(),
            nn.Linear(hidden, d_out),
        )  # fmt: skip
        # Zero last layer: every coupling starts as the identity (FrEIA's recommended init).
        nn.init.zeros_(net[-1].weight)
        nn.init.zeros_(net[-1].bias)
        return net

    return build


class GlowINN(nn.Module):
    """x -> y through an invertible linear layer, then ``blocks`` times a GLOW coupling (both
    halves, each from the other by a subnetwork d/2 -> h -> h -> d with SELU, its log-scale
    soft-clamped as ``clamp * tanh``) and another invertible linear layer. Every coupling starts
    as the identity and every linear layer but the last too, so the map starts at the last's A
    (``start_at``): the couplings then act on x's own coordinates. The log-determinant is
    dropped (plain MSE training, as BERT-INN's code)."""

    def __init__(self, dim: int, hidden: int, blocks: int, clamp: float):
        super().__init__()
        self.net = ff.SequenceINN(dim)
        self.net.append(InvertibleLinear)
        for _ in range(blocks):
            self.net.append(
                fm.GLOWCouplingBlock, subnet_constructor=_subnet(hidden), clamp=clamp,
                clamp_activation="TANH",
            )  # fmt: skip
            self.net.append(InvertibleLinear)
        self.start = "identity"

    def start_at(self, weights: torch.Tensor, bias: torch.Tensor) -> None:
        """Start the map at x -> x W + b where W is invertible (its singular values within
        ``SINGULAR`` of each other's scale); otherwise keep the identity start."""
        values = torch.linalg.svdvals(weights.double())
        if values.min() > SINGULAR * values.max():
            self.net.module_list[-1].set_matrix(weights, bias)
            self.start = "least-squares"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _log_det = self.net(x)
        return y

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        x, _log_det = self.net(y, rev=True)
        return x
