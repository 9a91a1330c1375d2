"""Aggregation across layers (rollout) and the residual mixing shared by attention-family methods.

Conventions follow ../shared/specs/attention-family.md: R^1 = M^1, R^l = M^l @ R^(l-1) (the later
layer multiplies on the left); the attribution of the classification token at layer l is row 0 of
R^l. Padded rows and columns are zeroed so that padding never leaks into real rows.
"""

from __future__ import annotations

import torch

from attrib_bench.interfaces import Attribution


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


def rollout(matrices: list[torch.Tensor], mask_BN: torch.Tensor) -> torch.Tensor:
    """Row 0 of R^l for every layer: (B, L, N), from per-layer matrices M^l of shape (B, N, N)."""
    keep = pair_mask(mask_BN).bool()
    rows = []
    product = None
    for matrix in matrices:
        matrix = torch.where(keep, matrix, 0.0)
        product = matrix if product is None else matrix @ product
        rows.append(product[:, 0, :])
    return torch.stack(rows, dim=1)


def layerwise_attribution(
    matrices: list[torch.Tensor], mask_BN: torch.Tensor, normalize: bool = False
) -> Attribution:
    """Local rows (row 0 of each M^l) and aggregated rows (row 0 of each R^l) of one method.

    ``normalize`` rescales each M^l's rows to sum to 1 before rolling out.
    """
    keep = pair_mask(mask_BN).bool()
    matrices = [torch.where(keep, m, 0.0) for m in matrices]  # padded rows may hold NaN
    if normalize:
        matrices = [normalize_rows(m) for m in matrices]
    local = torch.stack([m[:, 0, :] for m in matrices], dim=1)
    return Attribution(aggregated_BLN=rollout(matrices, mask_BN), local_BLN=local)
