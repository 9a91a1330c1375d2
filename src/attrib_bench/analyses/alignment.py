"""Learned alignment maps between two models' representations (issue 12; Ren et al. 2023).

``fit_alignments`` fits f: h_x -> h_y on a training split and reports MSE(f(h_x), h_y) and R^2 on
held-out rows, for three maps (docs/math/similarity.md, "Learned alignment maps"):

- ``linear``: an affine map (``nn.Linear`` with bias);
- ``mlp``: a non-bijective map, affine plus a residual 4-layer GELU MLP (the official comparison
  is a plain 4-layer GELU MLP; see the starts below);
- ``inn``: an invertible network (``invertible_maps.GlowINN``): a learned invertible linear
  layer, then GLOW blocks, each FrEIA's ``GLOWCouplingBlock`` (both halves, each updated from
  the other by a subnetwork d/2 -> h -> h -> d with SELU, log-scale soft-clamped as
  ``clamp * tanh``) and another invertible linear layer. The linear layers (GLOW's LU form)
  mix every coordinate with every other, so the map contains every invertible linear map,
  which a stack of couplings alone does not (one RealNVP block held a random rotation to
  R^2 0.50). Trained like the others with plain MSE on f(x) vs y, no log-determinant term, as
  in the official code.

Starts (calibration). With a few hundred sentences for a few hundred features, Adam from a random
initialisation with early stopping stops far from the optimum (MiniLM against itself: held-out
linear MSE 0.79-0.90 while the closed-form R^2 was 1.000), so a comparison of maps trained that
way measures the training, not the representations. Each map therefore starts from the best
simple map of its own class, and Adam only fine-tunes it; the validation MSE of the start is the
first early-stopping mark, so training keeps the start unless it improves on the validation rows:

- ``linear`` starts at the closed-form least-squares solution on the fit rows (the training rows
  less the validation rows), with the rule of ``similarity.linreg_r2``: ordinary least squares
  when the rows outnumber x's width, otherwise ridge with lambda = 1e-3 x trace(Xc^T Xc) / d_x;
- ``mlp`` is that same affine start plus a residual MLP whose last layer is zero-initialised, so
  it starts exactly at the linear solution and can only add a nonlinear correction (still not
  bijective: the residual is unconstrained);
- ``inn`` starts at that same least-squares solution, held by its last linear layer (its
  couplings and other linear layers start as the identity), where the solution is invertible
  (its singular values within ``invertible_maps.SINGULAR`` of each other's scale); so it starts
  no worse than the linear map and can only add a bijective correction. Where the rows
  outnumber the features but span fewer directions (post-LayerNorm states lie in a
  hyperplane), it starts at an invertible completion of the rank-truncated solution
  (``invertible_lstsq``), which predicts the fit rows as that solution does; where y hardly
  depends on x (a random-init floor), the solution's singular values span more than 1e4, and
  those below 1e-3 of the largest are raised to that share. With no more rows
  than features (n <= d: rank < d), composing with the singular solution would make the map
  non-bijective, which is what the INN exists to rule out, so it starts at the identity,
  the exact answer for a model compared with itself. ``inn_start="identity"`` always starts
  there; from the identity, an LU layer keeps the signs of its leading minors, so it cannot
  reach every rotation (a random one of d = 8: R^2 0.86).

Protocol, and where it departs from the official code on purpose:

- Both x and y are standardised per feature with the *training* split's mean and standard
  deviation (test rows never inform them); the reported MSE is in standardised y units (each
  target feature has unit variance on the training rows), so it is comparable across layers and
  models. R^2 = 1 - SS_res / SS_tot pooled over all target features, SS_tot around the held-out
  rows' own mean.
- Scores are on held-out rows (the official code scores on the training rows).
- A validation split (``val_fraction`` of the training rows, seeded) drives early stopping with
  ``patience`` epochs; the weights of the best validation epoch are restored.
- Adam, minibatches, and a cosine learning-rate schedule that ends at ``LR_FLOOR`` (10%) of the
  start rather than decaying to nothing (the official 0.99-per-step decay is below 1e-10 of the
  start after ~900 of 3,000 steps).
- All randomness (initialisation, validation split, batch order) comes from ``seed`` inside
  ``torch.random.fork_rng``: the caller's global RNG state is untouched, and the same seed on
  the same device gives the same numbers.
- With ``test_groups`` (the sentence of each held-out row) each score also gets a percentile
  bootstrap 95% interval over the held-out *sentences* (``results.stats.bootstrap_ci``): rows of
  one sentence are not independent, so the sentences are resampled whole; R^2 keeps the
  held-out mean of all rows. Every map after the first also gets the paired interval of its MSE
  minus the first map's, from the same draws: two maps' own intervals can overlap while every
  draw ranks them alike, so whether one map is better is read from this interval.
- An INN maps R^d to R^d: when d_x != d_y the ``inn`` map is refused with a ``UsageError``
  rather than padded or projected, since any projection would make the map non-bijective and
  the comparison the map exists for meaningless. The maps are not symmetric: x -> y is fitted.

FrEIA is an optional dependency (``pip install 'attrib-bench[similarity]'``), imported only when
the ``inn`` map is asked for.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from attrib_bench.analyses.bert_inn import STEPS, BertINN, released_init, train_released
from attrib_bench.core.errors import UsageError
from attrib_bench.results.stats import bootstrap_ci

MAPS = ("linear", "mlp", "inn")
#: Also fitted when named: the released BERT-INN configuration (``bert_inn``), its own training.
OPTIONAL_MAPS = ("bert-inn",)
#: Every map a caller may name.
CHOICES = MAPS + OPTIONAL_MAPS
#: The maps that must be bijective, so need equal widths.
INVERTIBLE_MAPS = ("inn", "bert-inn")
#: Where the INN starts: the least-squares solution where invertible, or the identity.
INN_STARTS = ("least-squares", "identity")
#: The smallest singular value ``invertible_lstsq`` leaves, as a share of the largest: ten times
#: ``invertible_maps.SINGULAR``, below which the INN would refuse the start.
CONDITION = 1e-3
#: The cosine schedule ends at this share of the starting learning rate.
LR_FLOOR = 0.1
_EPS = 1e-8


def cosine_lr(epoch: int, max_epochs: int, base_lr: float, floor: float = LR_FLOOR) -> float:
    """Learning rate at ``epoch`` (0-based): cosine from ``base_lr`` to ``floor * base_lr``.

    Never below ``floor * base_lr``, also past ``max_epochs``.
    """
    if max_epochs <= 1:
        return base_lr
    progress = min(max(epoch, 0) / (max_epochs - 1), 1.0)
    return base_lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _standardise(train: torch.Tensor, test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature z-scores of both splits, with the training split's mean and std only."""
    mean = train.mean(dim=0, keepdim=True)
    std = train.std(dim=0, keepdim=True).clamp_min(_EPS)
    return (train - mean) / std, (test - mean) / std


def _mlp(d_in: int, d_out: int, hidden: int) -> nn.Module:
    """The non-bijective comparison: 4 linear layers with GELU between them."""
    return nn.Sequential(
        nn.Linear(d_in, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, d_out),
    )


def ridge_lstsq(x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-3):
    """Closed-form affine least squares y ~ x W + b, the rule of ``similarity.linreg_r2``.

    Ordinary least squares when the rows outnumber x's width; otherwise ridge with lambda =
    ``ridge`` x trace(Xc^T Xc) / d_x (dual form), as plain least squares would interpolate.
    Returns ``(W, b)`` with W of shape (d_x, d_y), in float64 for the solve, cast back.
    """
    xd, yd = x.double(), y.double()
    mean_x, mean_y = xd.mean(dim=0), yd.mean(dim=0)
    xc, yc = xd - mean_x, yd - mean_y
    n, d = xc.shape
    if n > d:
        weights = torch.linalg.lstsq(xc.cpu(), yc.cpu(), driver="gelsd").solution.to(x.device)
    else:
        scale = ridge * torch.trace(xc.T @ xc) / d
        gram = xc @ xc.T + scale * torch.eye(n, dtype=xd.dtype, device=x.device)
        weights = xc.T @ torch.linalg.solve(gram, yc)
    bias = mean_y - mean_x @ weights
    return weights.to(x.dtype), bias.to(x.dtype)


class _Residual(nn.Module):
    """Affine map plus a residual MLP whose last layer starts at zero (non-bijective)."""

    def __init__(self, d_in: int, d_out: int, hidden: int):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)
        self.mlp = _mlp(d_in, d_out, hidden)
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.mlp(x)


def invertible_lstsq(x: torch.Tensor, y: torch.Tensor):
    """``ridge_lstsq``, made invertible and well conditioned when x's rows outnumber its width,
    so that the INN can start there.

    Where the rows span fewer than d_x directions (post-LayerNorm states lie in a hyperplane):
    the least-squares solution truncated to x's numerical rank (numpy's ``matrix_rank`` rule at
    x's precision), plus a map of x's k null directions onto the k directions that solution
    leaves out of its image, scaled by its median singular value; nothing x's rows contain
    reaches the added part, so the fit rows' predictions are the truncated solution's. Then, in
    every case, singular values below ``CONDITION`` of the largest are raised to that share (y
    nearly independent of x leaves a solution conditioned worse than 1e4): the fit rows'
    predictions move by at most that share of the largest gain along those directions.
    Returns ``ridge_lstsq``'s answer when x has no more rows than d_x, or the widths differ."""
    n, d = x.shape
    if n <= d or d != y.shape[1]:
        return ridge_lstsq(x, y)
    xd, yd = x.double(), y.double()
    mean_x, mean_y = xd.mean(dim=0), yd.mean(dim=0)
    u, s, vh = torch.linalg.svd(xd - mean_x, full_matrices=False)
    rank = int((s > s[0] * max(n, d) * torch.finfo(x.dtype).eps).sum())
    weights = vh[:rank].T @ ((u[:, :rank].T @ (yd - mean_y)) / s[:rank, None])
    left, values, image_h = torch.linalg.svd(weights)
    if rank < d:
        weights = weights + values[:rank].median() * vh[rank:].T @ image_h[rank:]
        left, values, image_h = torch.linalg.svd(weights)
    if values[-1] < CONDITION * values[0]:
        weights = left @ torch.diag(values.clamp(min=CONDITION * values[0])) @ image_h
    bias = mean_y - mean_x @ weights
    return weights.to(x.dtype), bias.to(x.dtype)


def _linear_start(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Start the map at the closed-form least-squares solution on (x, y): the linear map and
    the MLP's affine part always, the INN where that solution is, or can be made, invertible
    (``invertible_lstsq``)."""
    if hasattr(model, "start_at"):
        model.start_at(*invertible_lstsq(x, y))
        return
    weights, bias = ridge_lstsq(x, y)
    linear = model if isinstance(model, nn.Linear) else model.linear
    with torch.no_grad():
        linear.weight.copy_(weights.T)
        linear.bias.copy_(bias)


def import_freia():
    """FrEIA's framework and modules; a UsageError naming the extra when it is missing."""
    try:
        import FrEIA.framework as ff
        import FrEIA.modules as fm
    except ImportError:
        raise UsageError(
            "the 'inn' alignment map needs FrEIA: pip install 'attrib-bench[similarity]' "
            "(or pip install FrEIA)"
        ) from None
    return ff, fm


def _build(name: str, d_x: int, d_y: int, hidden: int, inn_blocks: int, inn_clamp: float):
    if name == "linear":
        return nn.Linear(d_x, d_y)
    if name == "mlp":
        return _Residual(d_x, d_y, hidden)
    if name in INVERTIBLE_MAPS:
        if d_x != d_y:
            raise UsageError(
                f"the {name!r} alignment map needs equal widths (an invertible map), got "
                f"d_x={d_x} and d_y={d_y}; use the 'linear' or 'mlp' map for this pair"
            )
        if d_x < 2:
            raise UsageError(f"the {name!r} alignment map needs at least 2 features to couple")
    if name == "bert-inn":
        model = BertINN(d_x, hidden)
        released_init(model)
        return model
    if name == "inn":
        import_freia()
        from attrib_bench.analyses.invertible_maps import GlowINN

        return GlowINN(d_x, hidden, inn_blocks, inn_clamp)
    raise UsageError(f"unknown alignment map {name!r}; valid choices: {', '.join(CHOICES)}")


def train_map(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    *,
    generator: torch.Generator,
    lr: float,
    max_epochs: int,
    patience: int,
    batch_size: int,
    lr_schedule: Callable[[int, int, float], float] = cosine_lr,
) -> tuple[nn.Module, int, int]:
    """Adam on MSE with minibatches; early stopping on validation MSE, best weights restored.

    The starting weights are the first mark: the result is never worse on the validation rows
    than the start. Returns the model, the epochs trained and the epoch whose weights it holds
    (0: the start), so a report can say whether the budget or early stopping ended the fit.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.eval()
    with torch.no_grad():
        start_loss = torch.mean((model(x_val) - y_val) ** 2).item()
    best_loss, best_state, stale = start_loss, copy.deepcopy(model.state_dict()), 0
    best_epoch = epochs = 0
    n = x.shape[0]
    for epoch in range(max_epochs):
        epochs = epoch + 1
        for group in optimizer.param_groups:
            group["lr"] = lr_schedule(epoch, max_epochs, lr)
        model.train()
        order = torch.randperm(n, generator=generator).to(x.device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            loss = torch.mean((model(x[idx]) - y[idx]) ** 2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_loss = torch.mean((model(x_val) - y_val) ** 2).item()
        if val_loss < best_loss - 1e-7:
            best_loss, best_state, stale = val_loss, copy.deepcopy(model.state_dict()), 0
            best_epoch = epochs
        else:
            stale += 1
            if stale >= patience:
                break
    model.load_state_dict(best_state)
    model.eval()
    return model, epochs, best_epoch


def _scores(pred: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    residual = torch.sum((pred - target) ** 2)
    total = torch.sum((target - target.mean(dim=0, keepdim=True)) ** 2)
    return {
        "mse": torch.mean((pred - target) ** 2).item(),
        "r2": (1.0 - residual / total.clamp_min(_EPS)).item(),
    }


def _group_sums(
    pred: torch.Tensor, target: torch.Tensor, groups: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group: the squared residuals' sum, the squares around the held-out mean, the cells."""
    residual_R = ((pred - target) ** 2).sum(dim=1).double().cpu().numpy()
    total_R = ((target - target.mean(dim=0, keepdim=True)) ** 2).sum(dim=1).double().cpu().numpy()
    _, inverse = np.unique(groups, return_inverse=True)
    residual_G, total_G = np.bincount(inverse, residual_R), np.bincount(inverse, total_R)
    return residual_G, total_G, np.bincount(inverse) * pred.shape[1]


def _intervals(
    residual_G: np.ndarray, total_G: np.ndarray, cells_G: np.ndarray, seed: int
) -> dict[str, list[float]]:
    """Bootstrap 95% intervals of the held-out MSE and R^2, resampling whole groups."""
    index_G = np.arange(len(cells_G))
    return {
        "mse_ci95": bootstrap_ci(
            index_G, seed, statistic=lambda g: residual_G[g].sum() / cells_G[g].sum()
        ),
        "r2_ci95": bootstrap_ci(
            index_G, seed, statistic=lambda g: 1.0 - residual_G[g].sum() / total_G[g].sum()
        ),
    }


def _fork_rng(device: torch.device):
    """Fork the CPU RNG and, on an accelerator, that device's RNG (the caller's are restored)."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    index = device.index
    if index is None:
        index = torch.get_device_module(device.type).current_device()
    return torch.random.fork_rng(devices=[index], device_type=device.type)


def _check_inputs(x_train, y_train, x_test, y_test, maps: Sequence[str]) -> None:
    for name, t in (("x_train", x_train), ("y_train", y_train), ("x_test", x_test),
                    ("y_test", y_test)):  # fmt: skip
        if not isinstance(t, torch.Tensor) or t.ndim != 2 or not t.is_floating_point():
            raise UsageError(f"{name} must be a 2-D float tensor (rows, features)")
    if x_train.shape[0] != y_train.shape[0] or x_test.shape[0] != y_test.shape[0]:
        raise UsageError("x and y must have the same rows (the same sentences) in each split")
    if x_train.shape[1] != x_test.shape[1] or y_train.shape[1] != y_test.shape[1]:
        raise UsageError("train and test splits must have the same feature widths")
    if x_train.shape[0] < 4 or x_test.shape[0] < 2:
        raise UsageError("alignment needs at least 4 training rows and 2 held-out rows")
    for name in maps:
        if name not in CHOICES:
            raise UsageError(f"unknown alignment map {name!r}; valid choices: {', '.join(CHOICES)}")
    for name in INVERTIBLE_MAPS:
        if name in maps and x_train.shape[1] != y_train.shape[1]:
            _build(name, x_train.shape[1], y_train.shape[1], 1, 1, 1.0)  # the width error


def _split(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation rows and the fitting rows of ``n`` training rows, drawn from ``seed``."""
    n_val = min(max(1, round(val_fraction * n)), n - 1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[:n_val], perm[n_val:]


def fit_released(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    seed: int,
    *,
    val_fraction: float = 0.15,
    hidden: int | None = None,
    steps: int = STEPS,
    on_batch: Callable[[], None] | None = None,
) -> BertINN:
    """One released BERT-INN for every layer pair (x, y) of training rows, trained as the
    official code trains its one map for all layers (``bert_inn.train_released``). Each pair is
    standardised and cut to its fitting rows exactly as ``fit_alignments`` cuts them, so that
    ``fit_alignments(..., fitted={"bert-inn": map})`` scores the map per pair on held-out rows.
    ``on_batch`` is called after every batch of the schedule (a progress bar)."""
    if not pairs:
        raise UsageError("the released BERT-INN needs at least one layer pair")
    x0, y0 = pairs[0]
    for x, y in pairs:
        if x.shape != x0.shape or y.shape != y0.shape:
            raise UsageError("every layer pair of one BERT-INN needs the same rows and widths")
    device = x0.device
    dtype = torch.promote_types(x0.dtype, torch.float32)
    _, fit_idx = (rows.to(device) for rows in _split(x0.shape[0], val_fraction, seed))
    standardised = []
    for x, y in pairs:
        x_std, _ = _standardise(x.to(device, dtype), x[:0].to(device, dtype))
        y_std, _ = _standardise(y.to(device, dtype), y[:0].to(device, dtype))
        standardised.append((x_std[fit_idx], y_std[fit_idx]))
    d_x, d_y = x0.shape[1], y0.shape[1]
    with _fork_rng(device):
        torch.manual_seed(seed)
        model = _build("bert-inn", d_x, d_y, hidden or 4 * max(d_x, d_y), 1, 1.0)
        model = model.to(device, dtype)
        train_released(model, standardised, steps=steps, on_batch=on_batch)
    return model


def fit_alignments(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    seed: int,
    maps: Sequence[str] = MAPS,
    *,
    lr: float = 3e-3,
    max_epochs: int = 300,
    patience: int = 30,
    batch_size: int = 128,
    val_fraction: float = 0.15,
    hidden: int | None = None,
    inn_blocks: int = 2,
    inn_clamp: float = 2.0,
    inn_start: str = "least-squares",
    test_groups: Sequence[int] | None = None,
    fitted: Mapping[str, nn.Module] | None = None,
) -> dict[str, dict]:
    """Fit each map x -> y on the training rows; score it on the held-out rows.

    Returns ``{map: {"mse": float, "r2": float}}`` in the order of ``maps``, the INN's also
    with ``"start"``, the one of ``INN_STARTS`` it took (a refused least-squares start is the
    identity), every early-stopped map's with ``"epochs"`` trained and ``"best_epoch"``, the
    epoch whose weights it kept (0: its start); with
    ``test_groups`` (one group id per held-out row: its sentence) also ``mse_ci95`` and
    ``r2_ci95``, bootstrap intervals over the groups (module docstring), and every map after
    the first ``mse_minus_{first}_ci95``: the interval of its MSE minus the first map's, paired
    (each draw of groups scores both maps). ``hidden`` is the
    MLP's and the INN subnetworks' width (default 4 * max(d_x, d_y), as 768 -> 3072 officially).
    The linear map and the MLP's affine part start at the least-squares solution on the fit rows,
    the INN there too where it is invertible, else at the identity (``inn_start="identity"``:
    always; module docstring). ``inn_blocks``: GLOW blocks of the INN. ``bert-inn`` (named
    only) is the released BERT-INN, with its own start and schedule (``bert_inn``).
    ``fitted``: maps already trained on these training rows (``fit_released``), scored only;
    ``bert-inn`` asked for without one is trained here by ``fit_released`` on this pair alone.
    Runs on the tensors' device; every map gets the same seed, so each is reproducible alone.
    """
    maps = tuple(maps)
    _check_inputs(x_train, y_train, x_test, y_test, maps)
    if inn_start not in INN_STARTS:
        raise UsageError(f"inn_start must be one of {', '.join(INN_STARTS)}, got {inn_start!r}")
    if test_groups is not None and len(test_groups) != x_test.shape[0]:
        raise UsageError("test_groups needs one group per held-out row")
    fitted = dict(fitted or {})
    if "bert-inn" in maps and "bert-inn" not in fitted:  # its released start and schedule
        fitted["bert-inn"] = fit_released(
            [(x_train, y_train)], seed, val_fraction=val_fraction, hidden=hidden
        )
    device = x_train.device
    dtype = torch.promote_types(x_train.dtype, torch.float32)
    x_train, x_test = _standardise(x_train.to(device, dtype), x_test.to(device, dtype))
    y_train, y_test = _standardise(y_train.to(device, dtype), y_test.to(device, dtype))
    d_x, d_y = x_train.shape[1], y_train.shape[1]
    width = hidden or 4 * max(d_x, d_y)

    val_idx, fit_idx = (rows.to(device) for rows in _split(x_train.shape[0], val_fraction, seed))
    results: dict[str, dict] = {}
    residuals: dict[str, np.ndarray] = {}
    with _fork_rng(device):
        for name in maps:
            torch.manual_seed(seed)
            if name in fitted:  # trained by fit_released: scored only
                model = fitted[name].to(device, dtype)
            else:
                model = _build(name, d_x, d_y, width, inn_blocks, inn_clamp).to(device, dtype)
                if name != "inn" or inn_start == "least-squares":
                    _linear_start(model, x_train[fit_idx], y_train[fit_idx])
                _, epochs, best_epoch = train_map(
                    model,
                    x_train[fit_idx],
                    y_train[fit_idx],
                    x_train[val_idx],
                    y_train[val_idx],
                    generator=torch.Generator().manual_seed(seed + 1),
                    lr=lr,
                    max_epochs=max_epochs,
                    patience=patience,
                    batch_size=batch_size,
                )
            with torch.no_grad():
                pred = model(x_test)
            results[name] = _scores(pred, y_test)
            if name not in fitted:
                results[name].update(epochs=epochs, best_epoch=best_epoch)
            if name == "inn":
                results[name]["start"] = model.start
            if test_groups is not None:
                residual_G, total_G, cells_G = _group_sums(pred, y_test, np.asarray(test_groups))
                results[name].update(_intervals(residual_G, total_G, cells_G, seed))
                residuals[name] = residual_G
    for name in maps[1:] if test_groups is not None else ():
        difference_G = residuals[name] - residuals[maps[0]]
        results[name][f"mse_minus_{maps[0]}_ci95"] = bootstrap_ci(
            np.arange(len(cells_G)),
            seed,
            statistic=lambda g: difference_G[g].sum() / cells_G[g].sum(),  # noqa: B023
        )
    return results
