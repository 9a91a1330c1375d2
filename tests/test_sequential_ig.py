"""Sequential Integrated Gradients (``sequential-integrated-gradients``): each token's signed
sum is the drop of f when that token alone becomes the baseline (its path's completeness), the
row equals a float64 reference of one plain-torch path per token, special tokens get nothing,
and the kit accepts it."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench import UsageError
from attrib_bench.core.target import DEFAULT_TARGET
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing import check_attributor
from attrib_bench_plugins.gradient import SequentialIntegratedGradients


@pytest.fixture(scope="module")
def loaded64(tiny_bert):
    """The tiny model in float64 with its weight matrices scaled by 5, far from linear, so a
    short path misses its completeness by a visible amount."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    with torch.no_grad():
        for parameter in loaded.model.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(5.0)
    return loaded


@pytest.fixture(scope="module")
def plain64(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def logit(loaded, ids_N: torch.Tensor, label: int) -> float:
    with torch.no_grad():
        return float(loaded.model(input_ids=ids_N[None]).logits[0, label])


def sig(steps: int, **params):
    settings = {"reduce": "sum", "steps": str(steps), **{k: str(v) for k, v in params.items()}}
    return SequentialIntegratedGradients().configure(settings)


def test_each_tokens_sum_is_the_drop_when_it_alone_is_masked(loaded64):
    trace = trace_batch(loaded64, one_batch(loaded64, examples()), frozenset())
    rows_BN = sig(64).attribute(trace).aggregated_BLN[:, 0]
    coarse_BN = sig(2).attribute(trace).aggregated_BLN[:, 0]
    mask = loaded64.tokenizer.mask_token_id
    fine_gaps, coarse_gaps = [], []  # relative to the example's largest change
    for row in range(len(trace.batch.examples)):
        real_N = trace.batch.attention_mask_BN[row].bool()
        ids_N = trace.batch.input_ids_BN[row][real_N]
        special_N = trace.batch.special_tokens_mask_BN[row][real_N].bool()
        label = int(trace.target_classes_B[row])
        full = logit(loaded64, ids_N, label)
        changes = {}
        for token in torch.nonzero(~special_N).flatten().tolist():
            masked = ids_N.clone()
            masked[token] = mask
            changes[token] = full - logit(loaded64, masked, label)
        scale = max(abs(c) for c in changes.values())
        for token in range(len(ids_N)):
            got = float(rows_BN[row][real_N][token])
            if special_N[token]:
                assert got == 0.0
                continue
            change = changes[token]
            fine_gaps.append(abs(got - change) / scale)
            coarse_gaps.append(abs(float(coarse_BN[row][real_N][token]) - change) / scale)
    assert max(fine_gaps) < 0.01  # the path integral's error at 64 steps
    assert max(coarse_gaps) > 10 * max(fine_gaps)  # at 2 steps far more: the property has teeth


def test_the_row_equals_one_plain_torch_path_per_token(plain64):
    """Riemann sums written from the definition with Captum's Gauss-Legendre points would need
    its nodes; instead the reference integrates with the same number of Gauss-Legendre nodes
    from numpy, over embedding outputs interpolated for one token at a time."""
    import numpy as np

    steps = 8
    trace = trace_batch(plain64, one_batch(plain64, examples()[:2]), frozenset())
    rows_BN = sig(steps, layer="embeddings").attribute(trace).aggregated_BLN[:, 0]
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    alphas, weights = (nodes + 1) / 2, weights / 2
    embeddings = plain64.embeddings
    mask = plain64.tokenizer.mask_token_id
    for row in range(2):
        real_N = trace.batch.attention_mask_BN[row].bool()
        ids_N = trace.batch.input_ids_BN[row][real_N]
        label = int(trace.target_classes_B[row])
        with torch.no_grad():
            x_ND = embeddings(input_ids=ids_N[None])[0]
        expected = torch.zeros(len(ids_N), dtype=torch.float64)
        for token in range(1, len(ids_N) - 1):
            start = ids_N.clone()
            start[token] = mask
            with torch.no_grad():
                b_ND = embeddings(input_ids=start[None])[0]
            total = torch.zeros_like(x_ND[token])
            for alpha, weight in zip(alphas, weights, strict=True):
                point = (b_ND + float(alpha) * (x_ND - b_ND)).detach().requires_grad_()
                handle = embeddings.register_forward_hook(lambda *_, p=point: p[None])
                try:
                    out = plain64.model(input_ids=ids_N[None]).logits[0, label]
                finally:
                    handle.remove()
                (gradient,) = torch.autograd.grad(out, point)
                total += float(weight) * gradient[token]
            expected[token] = ((x_ND[token] - b_ND[token]) * total).sum()
        torch.testing.assert_close(rows_BN[row][real_N].double(), expected, rtol=1e-9, atol=1e-12)


def test_a_missing_baseline_token_is_one_line(loaded64):
    trace = trace_batch(loaded64, one_batch(loaded64, examples()[:1]), frozenset())
    method = sig(2, baseline="mask")
    tokenizer = loaded64.tokenizer
    saved = tokenizer.mask_token
    tokenizer.mask_token = None
    try:
        with pytest.raises(UsageError, match="needs a tokenizer with a mask token") as raised:
            method.attribute(trace)
    finally:
        tokenizer.mask_token = saved
    assert "\n" not in str(raised.value)


def test_the_kit_accepts_it():
    """The l2 reduction through the kit; every target is checked on the default reduction by
    tests/test_conformance.py."""
    report = check_attributor(sig(2, reduce="l2"), families=("bert",), targets=(DEFAULT_TARGET,))
    assert not report.skipped, report.skipped
