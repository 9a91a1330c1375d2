"""Effective attention (Brunner et al., ICLR 2020, "On Identifiability in Transformers").

Per layer and head, the attention rows are projected onto the column space of the
value-transformed matrix T_h = V_h W_O^h (docs/math/identifiability.md, eqs. (1)-(3)): A_h's part in
the left null space of T_h changes nothing in the layer's output, so it cannot explain it.
A_eff_h = A_h U_r U_r^T with U_r the left singular vectors of T_h above the spec's rank threshold
sigma_max * max(n, d) * eps (numpy's ``matrix_rank`` rule for the n x d matrix T_h, eps of the
dtype the values were computed in).

T_h is never formed: with the QR factorisation W_O^h^T = Q R (Q orthonormal columns, R d_v x d_v),
T_h = (V_h R^T) Q^T, so the n x d_v matrix M = V_h R^T has T_h's singular values and left singular
vectors. Nor is M's SVD taken in full: with n > d_v, M = Q_M R_M (CholeskyQR2 where it is
accurate, Householder QR elsewhere, see ``cholesky_qr``), and the d_v x d_v R_M has M's singular
values to float64's eps times sigma_max, as an SVD of M has them, so the rank rule runs on R_M's
(on M's own when n <= d_v). Only a matrix with a value at or below the threshold gets R_M's SVD
(a few heads of MiniLM's first layers do), and its kept left singular vectors, mapped by Q_M,
span the column space; elsewhere Q_M spans it, or, with n <= d_v, all of R^n: A_eff = A exactly.
A_eff = (A_h B) B^T for that basis B, so no n x n projector is formed. Not U_r = M V_r S_r^-1
from the eigenvectors of M^T M: that squares the condition number (MiniLM's M reach
sigma_min / sigma_max ~ 1e-5), so with float64 values the rule's threshold (max(n, d) * 2.2e-16
relative) is below what the eigenvalues resolve, and a kept direction near the float32 threshold
(~4.6e-5 relative) would lose about 8 of float64's 16 digits (CholeskyQR2's second pass restores
them, within its range). The decompositions in float64 (a float32 one's rounding is of the
order of the float32 threshold itself), the products A_h B B^T in the attention's dtype (a
float32 result then differs from float64 products by a few of its ulps). Per example on its
real tokens only, batched over the heads of each run of same-length examples in the batch (the
runner sorts its batches by length, so that is one run per length).

Rolled out like raw attention (``attrib_bench.toolkit.attention_family``), with
(1 - r) A_eff + r I for ``residual=r`` > 0: the rows of A_eff do not sum to 1 (they may be
near 0 or negative), so they are not renormalised first.

V_h is whatever the value projection produced, so pre-LN blocks and fused projections are
served as they are; with grouped-query attention V_h is the values of head h's key/value head.
Causal masks are not: the projector onto T_h's column space spreads row i over tokens after i,
which row i never saw (the causal analogue would project row i onto the rows up to i only).
"""

from __future__ import annotations

import itertools

import torch

import attrib_bench
from attrib_bench import Trace
from attrib_bench.toolkit.aggregation import mix_identity
from attrib_bench.toolkit.attention_family import AttentionFamily


def cholesky_qr(
    matrices_XNE: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, R and R's singular values of tall float64 matrices by CholeskyQR2 (Q = M R^-1, R from
    the Cholesky factor of M^T M, twice), and which matrices it failed on or may be inaccurate
    for.

    Matrix products and e x e factorisations only: torch's batched Householder QR of small tall
    matrices runs many times slower with more than one thread on a busy CPU. CholeskyQR2's Q is
    orthonormal and its Q R = M to float64's eps (Yamamoto et al. 2015) while
    sigma_min / sigma_max >= sqrt(8 eps (n e + e (e + 1))), about 3e-6 for n = 128, e = 32;
    a matrix whose R has a smaller ratio, with a safety factor of 10, is flagged.
    """
    n, e = matrices_XNE.shape[-2:]
    q_XNE, r_XEE, failed_X = matrices_XNE, None, None
    for _ in range(2):
        lower_XEE, info_X = torch.linalg.cholesky_ex(q_XNE.transpose(-1, -2) @ q_XNE)
        upper_XEE = lower_XEE.transpose(-1, -2)
        q_XNE = torch.linalg.solve_triangular(upper_XEE, q_XNE, upper=True, left=False)
        r_XEE = upper_XEE if r_XEE is None else upper_XEE @ r_XEE
        failed_X = info_X > 0 if failed_X is None else failed_X | (info_X > 0)
    eye_EE = torch.eye(e, dtype=r_XEE.dtype, device=r_XEE.device)
    r_XEE = torch.where(failed_X[..., None, None], eye_EE, r_XEE)  # no NaN into an SVD
    singular_XE = torch.linalg.svdvals(r_XEE)
    safe_ratio = 10 * (8 * torch.finfo(torch.float64).eps * (n * e + e * (e + 1))) ** 0.5
    unsafe_X = failed_X | (singular_XE.amin(dim=-1) < safe_ratio * singular_XE.amax(dim=-1))
    return q_XNE, r_XEE, singular_XE, unsafe_X


def column_space_basis(matrices_XNE: torch.Tensor, width: int, eps: float) -> torch.Tensor | None:
    """Orthonormal columns spanning each (n, e) matrix's column space, (X, n, min(n, e)), float64;
    None when that is all of R^n for every matrix (n <= e, full rank).

    The rank counts singular values above sigma_max * max(n, width) * eps: ``width`` is the
    width of the matrix whose rank is meant (T_h's d, not d_v) and ``eps`` the machine epsilon
    of the dtype its entries were computed in. A dropped direction is a zero column.
    """
    matrices_XNE = matrices_XNE.double()
    n, e = matrices_XNE.shape[-2:]
    if n > e:
        basis_XNK, small_XKE, singular_XK, unsafe_X = cholesky_qr(matrices_XNE)
        if unsafe_X.any():
            basis_XNK[unsafe_X], small_XKE[unsafe_X] = torch.linalg.qr(matrices_XNE[unsafe_X])
            singular_XK[unsafe_X] = torch.linalg.svdvals(small_XKE[unsafe_X])
    else:
        eye_NN = torch.eye(n, dtype=torch.float64, device=matrices_XNE.device)
        basis_XNK, small_XKE = eye_NN.expand(*matrices_XNE.shape[:-1], n), matrices_XNE
        singular_XK = torch.linalg.svdvals(small_XKE)
    tolerance_X1 = singular_XK.amax(dim=-1, keepdim=True) * max(n, width) * eps
    deficient_X = (singular_XK <= tolerance_X1).any(dim=-1)
    if not deficient_X.any():
        return basis_XNK if n > e else None
    u_YKK, s_YK, _ = torch.linalg.svd(small_XKE[deficient_X], full_matrices=False)
    kept_YKK = u_YKK * (s_YK > tolerance_X1[deficient_X])[..., None, :]
    basis_XNK = basis_XNK.clone()
    basis_XNK[deficient_X] = basis_XNK[deficient_X] @ kept_YKK
    return basis_XNK


def column_space_projector(matrices_XNE: torch.Tensor, width: int, eps: float) -> torch.Tensor:
    """U_r U_r^T for each (n, e) matrix of a stack, in float64 (``column_space_basis``'s rule)."""
    basis_XNK = column_space_basis(matrices_XNE, width, eps)
    if basis_XNK is None:
        n = matrices_XNE.shape[-2]
        eye_NN = torch.eye(n, dtype=torch.float64, device=matrices_XNE.device)
        return eye_NN.expand(*matrices_XNE.shape[:-1], n)
    return basis_XNK @ basis_XNK.transpose(-1, -2)


def effective_attention(trace: Trace, layer: int) -> torch.Tensor:
    """A_eff for every head of one layer, (B, H, N, N), zero outside each example's real block."""
    attention_BHNK = trace.attentions[layer]
    values_BNHE = trace.adapter.query_head_values(trace.values[layer])
    output_weight_HED = trace.adapter.layer_params(layer).output_weight_HED.double()
    factor_HEE = torch.linalg.qr(output_weight_HED.transpose(-1, -2), mode="r").R
    width = output_weight_HED.shape[-1]
    eps = torch.finfo(values_BNHE.dtype).eps
    result = torch.zeros_like(attention_BHNK)
    stop = 0
    for n, run in itertools.groupby(trace.batch.lengths):
        start, stop = stop, stop + len(list(run))
        rows = slice(start, stop)  # a run of same-length examples: views, not copies
        values_XHNE = values_BNHE[rows, :n].transpose(1, 2).double()
        same_gram_XHNE = values_XHNE @ factor_HEE.transpose(-1, -2)  # V R^T: T T^T = V R^T R V^T
        basis_XHNK = column_space_basis(same_gram_XHNE, width, eps)
        attention_XHNN = attention_BHNK[rows, :, :n, :n]
        if basis_XHNK is not None:
            basis_XHNK = basis_XHNK.to(result.dtype)
            attention_XHNN = (attention_XHNN @ basis_XHNK) @ basis_XHNK.transpose(-1, -2)
        result[rows, :, :n, :n] = attention_XHNN
    return result


class EffectiveAttention(AttentionFamily):
    """Head mean of effective attention, rolled out like ``attention``, rows not renormalised.

    Reference: Brunner et al. 2020, "On Identifiability in Transformers", ICLR.
    """

    name = "effective-attention"
    description = "Effective attention (Brunner et al. 2020): attention minus its null-space part"
    requires = frozenset({"attentions", "values"})
    family = "attention"
    parameter_docs = {
        "residual": "share r of the identity, (1 - r) A_eff + r I per layer before the rollout "
        "(rows not renormalised; 0: A_eff as is); in [0, 1)",
    }
    #: The left null space of T_h is taken over all tokens, as a bidirectional layer reads them.
    needs = {"mask": "bidirectional"}

    def layer_matrices(self, trace: Trace) -> list[torch.Tensor]:
        return trace.memo(
            "effective.head_mean",
            lambda: [
                effective_attention(trace, layer).mean(dim=1) for layer in range(trace.num_layers)
            ],
        )

    def with_residual(
        self, matrix_BNK: torch.Tensor, mask_BN: torch.Tensor, ratio: float
    ) -> torch.Tensor:
        """(1 - r) A_eff + r I: A_eff's rows do not sum to 1, and rescaling them would blow up."""
        return mix_identity(matrix_BNK, mask_BN, ratio)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [EffectiveAttention()]
