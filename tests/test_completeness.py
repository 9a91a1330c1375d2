"""Completeness (``completeness``): the gap between a method's summed scores and what it claims
they sum to, against a float64 reference from the model itself; the claims of the built-ins,
and a false claim caught by the conformance kit and the registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench import Attribution, EvalContext, UsageError
from attrib_bench.core.plugin_info import attributor_info
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing import ConformanceError, check_attributor
from attrib_bench_plugins.completeness import Completeness
from attrib_bench_plugins.decompx import FIELDS, DecompX
from attrib_bench_plugins.gradient import DeepLift, IntegratedGradients, Saliency
from attrib_bench_plugins.gradient import _pad_baseline as pad_baseline


@pytest.fixture(scope="module")
def loaded64(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def traced(loaded, attributor):
    fields = {field.name: field for field in FIELDS}
    return trace_batch(loaded, one_batch(loaded, examples()), attributor.requires, 0, fields)


def evaluate(attributor, trace, **params) -> np.ndarray:
    evaluator = Completeness().configure({k: str(v) for k, v in params.items()})
    context = EvalContext(trace, None, 0, attributor)
    return evaluator.score(attributor.attribute(trace), context)["aggregated"][0]


def logit(loaded, ids_N: torch.Tensor, label: int) -> float:
    """The class's logit of one unpadded input, float64."""
    with torch.no_grad():
        return float(loaded.model(input_ids=ids_N[None]).logits[0, label])


def reference_gaps(
    loaded, trace, rows_BN: torch.Tensor, baseline: bool
) -> tuple[np.ndarray, np.ndarray]:
    """|sum of an example's row - (f(x) - f(x'))|, x' its [PAD] baseline (special tokens kept),
    or f(x') = 0; f the predicted class's logit, each example alone over its real tokens; and
    f(x) - f(x') itself."""
    batch, gaps, changes = trace.batch, [], []
    pad = loaded.tokenizer.pad_token_id
    for row in range(len(batch.examples)):
        length = int(batch.lengths[row])
        ids_N = batch.input_ids_BN[row, :length]
        label = int(trace.logits_BC[row].argmax())
        expected = logit(loaded, ids_N, label)
        if baseline:
            special_N = batch.special_tokens_mask_BN[row, :length].bool()
            expected -= logit(loaded, torch.where(special_N, ids_N, pad), label)
        gaps.append(abs(float(rows_BN[row, :length].double().sum()) - expected))
        changes.append(expected)
    return np.array(gaps), np.array(changes)


@pytest.fixture(scope="module")
def sharp64(tiny_bert):
    """The tiny model with its weight matrices scaled by 20: far from linear, so a short path
    integral misses f(x) - f(x') by a visible amount (the plain tiny model is so close to
    linear that two steps already sum to within 1e-13)."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    with torch.no_grad():
        for parameter in loaded.model.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(20.0)
    return loaded


@pytest.mark.parametrize("steps", [4, 64])
def test_integrated_gradients_gap_is_the_reference(sharp64, steps):
    method = IntegratedGradients().configure({"reduce": "sum", "steps": str(steps)})
    trace = traced(sharp64, method)
    rows_BN = method.attribute(trace).aggregated_BLN[:, -1]
    got = evaluate(method, trace)
    expected, change = reference_gaps(sharp64, trace, rows_BN, True)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    assert np.max(expected) > 1e-3  # the gap is there to be measured
    relative = evaluate(method, trace, relative="true")
    # atol: a gap of ~5e-9 (64 steps) is the difference of two float64 sums of order 1, so its
    # last digits are rounding; 1e-12 is far below every gap measured and above that rounding.
    np.testing.assert_allclose(relative, expected / np.abs(change), rtol=1e-9, atol=1e-12)


def test_the_ig_gap_falls_as_its_steps_rise(sharp64):
    gaps = []
    for steps in (2, 16, 128):
        method = IntegratedGradients().configure({"reduce": "sum", "steps": str(steps)})
        gaps.append(np.mean(evaluate(method, traced(sharp64, method))))
    assert gaps[0] > 5 * gaps[1] > 500 * gaps[2]  # 3.4, 0.56, 0.00064


def test_decompx_with_its_head_sums_to_the_logit(loaded64):
    method = DecompX()
    trace = traced(loaded64, method)
    rows_BN = method.attribute(trace).aggregated_BLN[:, -1]
    got = evaluate(method, trace)
    expected, _ = reference_gaps(loaded64, trace, rows_BN, False)
    np.testing.assert_allclose(got, expected, atol=1e-9)
    assert np.max(got) < 1e-8  # biases split, nonlinearities linearised at the input: exact


def test_a_method_that_claims_nothing_is_nan_with_one_warning(loaded64, capsys):
    evaluator = Completeness()
    for method in (Saliency(), IntegratedGradients(), DecompX().configure({"head": "false"})):
        assert attributor_info(method).completeness is None
    method = Saliency()
    trace = traced(loaded64, method)
    context = EvalContext(trace, None, 0, method)
    for _ in range(2):
        assert np.isnan(evaluator.score(method.attribute(trace), context)["aggregated"]).all()
    assert capsys.readouterr().err.count("completeness: saliency claims no completeness") == 1


class ClaimedDeepLift(DeepLift):
    """Captum's DeepLift made to claim summation-to-delta, to measure how far it misses."""

    completeness = "score-change"

    def completeness_baseline(self, trace):
        return pad_baseline(trace)


def test_deeplift_claims_nothing_since_its_sums_miss_the_change(sharp64):
    """Captum's rescale rule skips GELU, the attention softmax and LayerNorm, so on a
    transformer DeepLift's sums miss f(x) - f(x') as gradient x (input - baseline) does; the
    built-in declares no completeness."""
    assert attributor_info(DeepLift()).completeness is None
    method = ClaimedDeepLift().configure({"reduce": "sum"})
    relative = evaluate(method, traced(sharp64, method), relative="true")
    assert np.nanmax(relative) > 0.1


class FalseClaim:
    """Random scores that claim to sum to the logit."""

    name = "false-claim"
    description = "random scores claiming completeness"
    requires = frozenset()
    completeness = "score"

    def attribute(self, trace):
        generator = torch.Generator().manual_seed(0)
        rows_BN = torch.rand(trace.batch.input_ids_BN.shape, generator=generator)
        return Attribution(aggregated_BLN=(rows_BN * trace.mask_BN)[:, None])


def test_the_kit_catches_a_false_claim_and_accepts_a_true_one():
    with pytest.raises(ConformanceError, match="completeness='score' fails for"):
        check_attributor(FalseClaim(), families=("bert",))
    check_attributor(DecompX(), families=("bert",))


@pytest.mark.parametrize(
    ("claim", "needle"),
    [("all", "`completeness` must be None or one of"), ("score-change", "completeness_baseline")],
)
def test_a_wrong_claim_is_one_line(claim, needle):
    plugin = FalseClaim()
    plugin.completeness = claim
    with pytest.raises(UsageError, match=needle) as raised:
        attributor_info(plugin)
    assert "\n" not in str(raised.value)
