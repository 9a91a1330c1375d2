"""eMPRT and sMPRT (Hedström et al. 2023): equal to float64 references written from Quantus's
definitions, the fully randomised model is the cascade's last step, and a method that ignores
the model scores the non-faithful extreme."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import scipy.stats
import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench import Attribution, EvalContext, UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing import check_evaluator
from attrib_bench.toolkit.erasure import candidates, example_generator
from attrib_bench_plugins.baselines import RandomAttributor
from attrib_bench_plugins.sanity import (
    EfficientMPRT,
    ModelRandomization,
    SmoothMPRT,
    histogram_entropy,
    randomised,
)

SEED = 3


class Readout:
    """Each token's final hidden state read by the classifier's row of the explained class:
    signed, cheap, and changed by randomising either the layers or the head."""

    name = "readout"
    description = "final hidden state . classifier row of the target class"
    requires = frozenset({"hidden_states"})

    def attribute(self, trace):
        weight_BD = trace.model.classifier.weight[trace.target_classes_B]
        rows_BN = torch.einsum("bnd,bd->bn", trace.hidden_states[-1], weight_BD)
        return Attribution(aggregated_BLN=(rows_BN * trace.mask_BN)[:, None, :])


class StateRecorder:
    """Records the model each call sees; its rows are ``random``'s."""

    name = "state-recorder"
    description = "records the model"
    requires = frozenset()

    def __init__(self):
        self.states = []

    def attribute(self, trace):
        self.states.append({k: v.clone() for k, v in trace.model.state_dict().items()})
        return RandomAttributor().attribute(trace)


@pytest.fixture(scope="module")
def loaded64(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def traced(loaded, attributor, seed=SEED):
    return trace_batch(loaded, one_batch(loaded, examples()), attributor.requires, seed)


def evaluate(evaluator, attributor, trace, **params) -> np.ndarray:
    configured = evaluator.configure({k: str(v) for k, v in params.items()})
    context = EvalContext(trace, None, trace.seed, attributor)
    return configured.score(attributor.attribute(trace), context)["aggregated"][0]


def readout_rows(model, embedded_ND: torch.Tensor, mask_N: torch.Tensor, label: int):
    """The Readout row of one example from its embedding output, by Hugging Face's modules:
    the encoder on the real tokens alone (padding is on the right), 0 at the padding."""
    length = int(mask_N.sum())
    hidden_ND = model.bert.encoder(embedded_ND[None, :length]).last_hidden_state[0]
    rows_N = np.zeros(len(mask_N))
    rows_N[:length] = (hidden_ND @ model.classifier.weight[label]).detach().numpy()
    return rows_N


def entropy_of_histogram(values: np.ndarray, bins: int) -> float:
    """-sum p log p of the counts in ``bins`` equal bins from min to max, the max in the last."""
    low, high = values.min(), values.max()
    if high == low:
        return 0.0
    index = np.minimum(((values - low) / (high - low) * bins).astype(int), bins - 1)
    p = np.bincount(index, minlength=bins) / len(values)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_the_randomised_model_is_the_cascades_last_step(loaded64):
    recorder = StateRecorder()
    trace = traced(loaded64, recorder)
    ModelRandomization().score(recorder.attribute(trace), EvalContext(trace, None, SEED, recorder))
    last = recorder.states[-1]
    state = randomised(trace, SEED).model.state_dict()
    assert state.keys() == last.keys()
    for key, value in last.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)
    trained = loaded64.model.state_dict()
    assert not torch.equal(state["classifier.weight"], trained["classifier.weight"])
    assert torch.equal(  # the embeddings stay trained, as in every step of the cascade
        state["bert.embeddings.word_embeddings.weight"],
        trained["bert.embeddings.word_embeddings.weight"],
    )


def test_emprt_equals_a_float64_reference(loaded64):
    trace = traced(loaded64, Readout())
    bins = 7  # few bins, so the histograms of the short rows have ties
    scores = evaluate(EfficientMPRT(), Readout(), trace, bins=bins)
    random_model = randomised(trace, SEED).model
    keep_BN = candidates(trace)
    expected = []
    for row in range(len(trace.batch.examples)):
        mask_N = trace.batch.attention_mask_BN[row]
        label = int(trace.logits_BC[row].argmax())
        embedded_ND = trace.hidden_states[0][row]
        h = [
            entropy_of_histogram(
                readout_rows(model, embedded_ND, mask_N, label)[keep_BN[row]], bins
            )
            for model in (loaded64.model, random_model)
        ]
        expected.append((h[1] - h[0]) / h[0] if h[0] > 0 else np.nan)
    assert np.isnan(expected).sum() == 1  # "bad": one candidate, one bin
    np.testing.assert_allclose(scores, expected, rtol=1e-10, atol=1e-12)
    assert np.nanmax(np.abs(scores)) > 0.05  # the reference is not vacuous


def test_histogram_entropy_is_quantus_discrete_entropy():
    values = np.array([0.0, 0.1, 0.11, 0.5, 1.0, 1.0])
    counts = np.array([3, 0, 1, 0, 2])  # np.histogram's 5 bins over [0, 1], the max in the last
    p = counts[counts > 0] / 6
    assert histogram_entropy(values, 5) == pytest.approx(-(p * np.log(p)).sum(), abs=1e-15)
    assert histogram_entropy(np.full(4, 0.3), 100) == 0.0
    assert np.isnan(histogram_entropy(np.array([]), 100))


def test_smprt_equals_a_float64_reference(loaded64):
    samples, noise = 4, 0.2
    trace = traced(loaded64, Readout())
    scores = evaluate(SmoothMPRT(), Readout(), trace, samples=samples, noise=noise)
    random_model = randomised(trace, SEED).model
    keep_BN = candidates(trace)
    expected = []
    for row, example in enumerate(trace.batch.examples):
        length = trace.batch.lengths[row]
        keep_N = keep_BN[row][:length]
        mask_N = trace.batch.attention_mask_BN[row, :length]
        label = int(trace.logits_BC[row].argmax())
        embedded_ND = trace.hidden_states[0][row, :length]
        if keep_N.sum() < 2:
            expected.append(np.nan)
            continue
        std = noise * float(embedded_ND[keep_N].max() - embedded_ND[keep_N].min())
        generator = example_generator(SEED, f"{example.id}/smprt")
        draws = torch.randn(
            samples - 1, *embedded_ND.shape, generator=generator, dtype=torch.float64
        )
        copies = [embedded_ND] + [
            embedded_ND + d * std * torch.as_tensor(keep_N, dtype=torch.float64)[:, None]
            for d in draws
        ]
        smoothed = [
            np.mean([readout_rows(model, x, mask_N, label) for x in copies], axis=0)[keep_N]
            for model in (loaded64.model, random_model)
        ]
        expected.append(scipy.stats.spearmanr(np.abs(smoothed[0]), np.abs(smoothed[1]))[0])
    np.testing.assert_allclose(scores, expected, rtol=1e-10, atol=1e-12)
    assert np.nanmax(scores) < 0.99  # the noise and the randomisation change the ranking


def test_smprt_with_one_sample_is_the_spearman_of_the_plain_explanations(loaded64):
    trace = traced(loaded64, Readout())
    scores = evaluate(SmoothMPRT(), Readout(), trace, samples=1, noise=5.0)
    random_trace = trace_batch(randomised(trace, SEED), trace.batch, Readout.requires, SEED)
    random_trace.logits_BC = trace.logits_BC
    trained, random = (Readout().attribute(t).aggregated_BLN[:, 0] for t in (trace, random_trace))
    for row, keep_N in enumerate(candidates(trace)):
        if keep_N.sum() > 1:
            expected = scipy.stats.spearmanr(
                trained[row][keep_N].abs().numpy(), random[row][keep_N].abs().numpy()
            )[0]
            assert scores[row] == pytest.approx(expected, abs=1e-12)


def test_a_method_that_ignores_the_model_is_the_non_faithful_extreme(loaded64):
    trace = traced(loaded64, RandomAttributor())
    emprt = evaluate(EfficientMPRT(), RandomAttributor(), trace)
    smprt = evaluate(SmoothMPRT(), RandomAttributor(), trace, samples=3)
    defined = candidates(trace).sum(axis=1) > 1
    np.testing.assert_array_equal(emprt[defined], 0.0)  # no rise in complexity
    np.testing.assert_allclose(smprt[defined], 1.0, rtol=0, atol=1e-12)  # unchanged ranking
    assert np.isnan(emprt[~defined]).all() and np.isnan(smprt[~defined]).all()


def test_a_reading_method_beats_the_model_ignoring_one(loaded64):
    trace = traced(loaded64, Readout())
    smprt = evaluate(SmoothMPRT(), Readout(), trace, samples=3)
    assert np.nanmean(smprt) < 0.9


@pytest.mark.parametrize(
    ("evaluator", "key", "value"),
    [
        (EfficientMPRT(), "bins", "0"),
        (EfficientMPRT(), "layer", "0"),
        (SmoothMPRT(), "samples", "0"),
        (SmoothMPRT(), "noise", "-0.1"),
        (SmoothMPRT(), "noise", "inf"),
    ],
)
def test_out_of_range_parameters_are_usage_errors(evaluator, key, value):
    with pytest.raises(UsageError, match=f"{evaluator.name}:{key}"):
        evaluator.configure({key: value})


def test_the_kit_accepts_both():
    check_evaluator(EfficientMPRT(), families=("bert",))
    check_evaluator(SmoothMPRT().configure({"samples": "2"}), families=("bert",))


def test_the_model_is_left_as_it_was(loaded64):
    before = copy.deepcopy(loaded64.model.state_dict())
    trace = traced(loaded64, Readout(), seed=SEED + 1)
    evaluate(SmoothMPRT(), Readout(), trace, samples=2)
    evaluate(EfficientMPRT(), Readout(), trace)
    for key, value in loaded64.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not loaded64.embeddings._forward_hooks  # no noise hook left behind
