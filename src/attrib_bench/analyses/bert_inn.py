"""BERT-INN as released (Ren et al. 2023; docs/math/similarity.md, "BERT-INN as released").

The official code builds one RealNVP block of INNLab (two affine couplings) and trains it with
its own initialisation and schedule; this module is our transcription of that configuration, so
its published setting can be rerun (``alignment.fit_alignments(maps=("bert-inn",))``):

- masks interleaved, not halves: m is 1 at even features; the first coupling keeps the even
  features and transforms the odd ones, the second the reverse;
- one log-scale network S and one shift network T, both shared by the two couplings, each
  d -> 4d -> 4d -> d with SELU, reading the full d-vector with the kept features only;
- coupling(x, b) = b x + (1 - b) (x (exp(tanh(S(b x))) + 1e-8) + T(b x)) (clip 1);
- every linear layer initialised Xavier-normal, its bias drawn as a (out, 1) Xavier-normal
  matrix, N(0, 2 / (out + 1)): the map does not start at the identity;
- Adam at 1e-6, the learning rate multiplied by 0.99 after every batch, 3,000 batches of 64
  taken in order (an incomplete last batch skipped, the data restarted), one map for every layer
  pair (x's layer l to y's layer l), a batch's gradients accumulated over its layers: one
  optimiser step per layer, zeroed once per batch.

Its limits (the docs): one pair of couplings cannot mix features linearly (no rotation), and
under that schedule the learning rate is below 1e-8 of its start after about 1,800 batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

#: The released training: batches, batch size, Adam's learning rate, its factor per batch.
STEPS, BATCH, LR, GAMMA = 3000, 64, 1e-6, 0.99
#: INNLab's additive guard on the scale.
EPS = 1e-8


def _net(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, hidden), nn.SELU(), nn.Linear(hidden, hidden), nn.SELU(),
        nn.Linear(hidden, dim),
    )  # fmt: skip


class BertINN(nn.Module):
    """The released block: two couplings sharing S and T (see the module)."""

    def __init__(self, dim: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or 4 * dim
        self.log_scale = _net(dim, hidden)
        self.shift = _net(dim, hidden)
        self.register_buffer("mask", (torch.arange(dim) % 2 == 0).float())

    def _coupling(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        kept = keep * x
        scale = torch.tanh(self.log_scale(kept)).exp() + EPS
        return kept + (1 - keep) * (x * scale + self.shift(kept))

    def _uncoupling(self, y: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        kept = keep * y
        scale = torch.tanh(self.log_scale(kept)).exp() + EPS
        return kept + (1 - keep) * (y - self.shift(kept)) / scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._coupling(self._coupling(x, self.mask), 1 - self.mask)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return self._uncoupling(self._uncoupling(y, 1 - self.mask), self.mask)


def released_init(model: nn.Module) -> None:
    """The official ``weights_init``: Xavier-normal weights; each bias Xavier-normal as an
    (out, 1) matrix, so N(0, 2 / (out + 1)). Draws from torch's global generator."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_normal_(module.weight)
            nn.init.xavier_normal_(module.bias.data.unsqueeze(1))


def train_released(
    model: nn.Module,
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    steps: int = STEPS,
    batch_size: int = BATCH,
    lr: float = LR,
    gamma: float = GAMMA,
    on_batch: Callable[[], None] | None = None,
) -> list[float]:
    """The released loop over ``pairs`` (x, y) of equal rows, one per layer (see the module).
    Returns the learning rate of each batch that was trained; ``on_batch`` is called after
    each of the ``steps`` (a progress bar)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=gamma)
    rows = pairs[0][0].shape[0]
    full = rows // batch_size
    if full == 0:
        raise ValueError(f"the released loop needs at least {batch_size} rows, got {rows}")
    rates = []
    model.train()
    for step in range(steps):
        start = (step % (full + 1)) * batch_size
        if start + batch_size <= rows:  # the last, incomplete batch fails there: skipped
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.zero_grad()
            for x, y in pairs:
                loss = nn.functional.mse_loss(model(x[start : start + batch_size]),
                                              y[start : start + batch_size])  # fmt: skip
                loss.backward()
                optimizer.step()
        scheduler.step()
        if on_batch is not None:
            on_batch()
    model.eval()
    return rates
