"""Effective attention against the spec computed the slow way: per example and head, numpy's SVD
of the explicit T_h = V_h W_O^h and its matrix_rank rule, in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, SENTENCES, examples, full_trace

from attrib_bench.core.trace import Trace
from attrib_bench.model.load import load_model
from attrib_bench_plugins.effective import cholesky_qr, column_space_basis, effective_attention

#: Lengths 3, 3 (one length group of two), under and over the tiny models' head dim 8.
TEXTS = ["good", "bad", "not bad at all", SENTENCES[1], SENTENCES[3]]


def spec_effective(trace: Trace, layer: int) -> list[np.ndarray]:
    """Per example, (H, n, n) A_h U_r U_r^T from the SVD of the n x d matrix T_h, float64, with
    the rank rule sigma_max * max(n, d) * eps of the values' dtype."""
    weight_HED = trace.adapter.layer_params(layer).output_weight_HED.double().numpy()
    values_BNHE = trace.adapter.query_head_values(trace.values[layer])
    eps = float(np.finfo(torch.empty(0, dtype=values_BNHE.dtype).numpy().dtype).eps)
    out = []
    for row, n in enumerate(trace.batch.lengths):
        heads = []
        for h in range(weight_HED.shape[0]):
            t = values_BNHE[row, :n, h].double().numpy() @ weight_HED[h]
            u, singular, _ = np.linalg.svd(t)
            rank = np.linalg.matrix_rank(t, tol=singular.max() * max(t.shape) * eps)
            a = trace.attentions[layer][row, h, :n, :n].double().numpy()
            heads.append(a @ u[:, :rank] @ u[:, :rank].T)
        out.append(np.stack(heads))
    return out


def repeat_tokens(trace: Trace, layer: int, row: int, distinct: int) -> None:
    """Make example ``row``'s value vectors at ``layer`` repeat its first ``distinct`` ones, so
    every T_h has rank at most ``distinct``."""
    n = trace.batch.lengths[row]
    values = list(trace.values)
    changed = values[layer].clone()
    changed[row, :n] = changed[row, torch.arange(n) % distinct]
    values[layer] = changed
    trace.values = tuple(values)


def assert_matches_spec(trace: Trace, atol: float) -> None:
    for layer in range(trace.num_layers):
        effective_BHNK = effective_attention(trace, layer)
        assert effective_BHNK.dtype == trace.attentions[layer].dtype
        for row, (n, expected) in enumerate(
            zip(trace.batch.lengths, spec_effective(trace, layer), strict=True)
        ):
            actual = effective_BHNK[row, :, :n, :n].double()
            torch.testing.assert_close(actual, torch.from_numpy(expected), atol=atol, rtol=0)
            assert effective_BHNK[row, :, n:].abs().sum() == 0
            assert effective_BHNK[row, :, :, n:].abs().sum() == 0


def load_tiny(path, dtype: torch.dtype):
    loaded = load_model(str(path), "cpu", architectures=ARCHITECTURES)
    loaded.model.to(dtype)
    return loaded


def test_float64_padded_batch_matches_the_spec(tiny_model):
    trace = full_trace(load_tiny(tiny_model, torch.float64), examples(TEXTS))
    assert trace.values[0].dtype == torch.float64
    lengths = trace.batch.lengths
    assert min(lengths) < 8 < max(lengths) and len(set(lengths)) < len(lengths)
    assert_matches_spec(trace, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_repeated_tokens_lose_rank_as_the_spec_says(tiny_model, dtype):
    """Rank-deficient V over (n > d_v) and under (n < d_v, where A_eff is then not A) the head
    dim, in a padded batch, in float64 and float32."""
    trace = full_trace(load_tiny(tiny_model, dtype), examples(TEXTS))
    long_row = trace.batch.lengths.index(max(trace.batch.lengths))
    short_row = next(i for i, n in enumerate(trace.batch.lengths) if 4 < n < 8)
    for layer in range(trace.num_layers):
        repeat_tokens(trace, layer, long_row, distinct=3)
        repeat_tokens(trace, layer, short_row, distinct=2)
    short = trace.batch.lengths[short_row]
    effective = effective_attention(trace, 0)[short_row, :, :short, :short]
    attention = trace.attentions[0][short_row, :, :short, :short]
    assert (effective - attention).abs().max() > 1e-3  # the projector is not the identity
    assert_matches_spec(trace, atol=1e-10 if dtype == torch.float64 else 1e-6)


def test_float32_padded_batch_matches_the_spec(tiny_model):
    trace = full_trace(load_tiny(tiny_model, torch.float32), examples(TEXTS))
    assert_matches_spec(trace, atol=1e-6)


FLOAT32_EPS = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize(
    ("smallest", "cholesky"),
    [(1e-2, True), (4e-5, True), (1e-7, False), (0.0, False)],
)
def test_basis_matches_the_svd_on_both_qr_paths(smallest, cholesky):
    """n = 128 > e = 32, MiniLM's d = 384 and float32's eps (threshold ~4.6e-5 sigma_max): a
    spectrum down to ``smallest``. 4e-5 is dropped but within CholeskyQR2's safe range; 1e-7 and
    exact zeros take the Householder path. The kept space is the SVD's to 1e-10."""
    generator = torch.Generator().manual_seed(0)
    n, e, width = 128, 32, 384
    u = torch.linalg.qr(torch.randn(n, e, generator=generator, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(e, e, generator=generator, dtype=torch.float64)).Q
    singular = torch.logspace(0, -3, e, dtype=torch.float64)
    singular[-1] = smallest
    matrix = (u * singular) @ v.T
    assert bool(cholesky_qr(matrix[None])[3][0]) is not cholesky
    expected_rank = int((singular > singular.max() * width * FLOAT32_EPS).sum())
    assert expected_rank == e - (smallest < 1e-4)
    basis = column_space_basis(matrix[None], width, FLOAT32_EPS)[0]
    kept = u[:, :expected_rank]
    torch.testing.assert_close(basis @ basis.T, kept @ kept.T, atol=1e-10, rtol=0)


def test_short_full_rank_matrices_span_everything():
    """n <= e and full rank: no basis (A_eff = A, bit for bit)."""
    matrices = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(0))
    assert column_space_basis(matrices, 32, FLOAT32_EPS) is None
