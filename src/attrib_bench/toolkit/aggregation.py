"""Aggregation across layers (rollout) and the residual mixing shared by attention-family methods.

Conventions follow docs/math/attention-family.md, eq. (3): R^1 = M^1, R^l = M^l @ R^(l-1) (the later
layer multiplies on the left); the attribution of the target token at layer l is its row of R^l
(row 0, the classification token, unless the run's target says otherwise: attrib_bench.core.target).
Padded rows and columns are zeroed so that padding never leaks into real rows.
"""

from __future__ import annotations

import torch

from attrib_bench.core.interfaces import Attribution


def pair_mask(mask_BN: torch.Tensor) -> torch.Tensor:
    """(B, N, N) mask that is 1 where both the query and the key are real tokens."""
    mask = mask_BN.to(torch.float32)
    return mask[:, :, None] * mask[:, None, :]


def normalize_rows(matrix_BNK: torch.Tensor) -> torch.Tensor:
    """Rows scaled to sum to 1 (all-zero rows, i.e. padding, stay zero)."""
    sums = matrix_BNK.sum(dim=-1, keepdim=True)
    return matrix_BNK / torch.where(sums == 0, torch.ones_like(sums), sums)


def mix_identity(matrix_BNK: torch.Tensor, mask_BN: torch.Tensor, ratio: float) -> torch.Tensor:
    """(1 - r) * M + r * I on the real tokens, M taken as it is."""
    eye = torch.diag_embed(mask_BN.to(matrix_BNK.dtype))
    return (1.0 - ratio) * matrix_BNK + ratio * eye


def fixed_residual(matrix_BNK: torch.Tensor, mask_BN: torch.Tensor, ratio: float) -> torch.Tensor:
    """(1 - r) * normalise_rows(M) + r * I on the real tokens (Abnar & Zuidema with r = 0.5)."""
    return mix_identity(normalize_rows(matrix_BNK), mask_BN, ratio)


def target_rows(matrix_BNK: torch.Tensor, positions_B: torch.Tensor | None) -> torch.Tensor:
    """Each example's row at its target position, (B, K); row 0 when ``positions_B`` is None."""
    if positions_B is None:
        return matrix_BNK[:, 0, :]
    examples = torch.arange(matrix_BNK.shape[0], device=matrix_BNK.device)
    return matrix_BNK[examples, positions_B.to(matrix_BNK.device), :]


#: Largest magnitude an unnormalised rollout keeps as it is. Official GlobEnc rolls the norm
#: family out without row normalisation: over 6 to 12 layers values reach 1e5 to 1e6, but a
#: 30-layer decoder's N-Res product reaches about 1e69, past float32's 3e38.
ROLLOUT_LIMIT = 2.0**60


def _rescaled(product_BNK: torch.Tensor) -> torch.Tensor:
    """``product_BNK`` with each example whose largest entry passed ROLLOUT_LIMIT divided by a
    power of two: exact in floating point, so every ratio and rank is unchanged."""
    largest_B = product_BNK.abs().flatten(1).amax(dim=1)
    if not bool((largest_B > ROLLOUT_LIMIT).any()):
        return product_BNK
    exponent_B = torch.where(largest_B > ROLLOUT_LIMIT, torch.log2(largest_B).floor(), 0.0)
    return torch.ldexp(product_BNK, -exponent_B.to(torch.int32)[:, None, None])


def rollout(
    matrices: list[torch.Tensor], mask_BN: torch.Tensor, positions_B: torch.Tensor | None = None
) -> torch.Tensor:
    """The target rows of R^l for every layer: (B, L, N), from per-layer M^l of shape (B, N, N).

    ``positions_B``: each example's target token (``Trace.target_positions_B``); None reads row 0.
    Once an example's product passes ROLLOUT_LIMIT it is carried divided by a power of two, so
    its rows from that layer on are R^l's up to a positive factor (ranks and ratios exact).
    """
    keep = pair_mask(mask_BN).bool()
    rows = []
    product = None
    for matrix in matrices:
        matrix = torch.where(keep, matrix, 0.0)
        product = matrix if product is None else _rescaled(matrix @ product)
        rows.append(target_rows(product, positions_B))
    return torch.stack(rows, dim=1)


def layerwise_attribution(
    matrices: list[torch.Tensor],
    mask_BN: torch.Tensor,
    normalize: bool = False,
    positions_B: torch.Tensor | None = None,
) -> Attribution:
    """Local rows (the target row of each M^l) and aggregated rows (of each R^l) of one method.

    ``normalize`` rescales each M^l's rows to sum to 1 before rolling out; ``positions_B`` is
    each example's target token (``Trace.target_positions_B``; None reads row 0).
    """
    keep = pair_mask(mask_BN).bool()
    matrices = [torch.where(keep, m, 0.0) for m in matrices]  # padded rows may hold NaN
    if normalize:
        matrices = [normalize_rows(m) for m in matrices]
    local = torch.stack([target_rows(m, positions_B) for m in matrices], dim=1)
    return Attribution(aggregated_BLN=rollout(matrices, mask_BN, positions_B), local_BLN=local)
