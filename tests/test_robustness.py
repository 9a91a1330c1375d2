"""Robustness (sensitivity, local Lipschitz) and infidelity: equal to Captum's metrics on an
embedding-level fixture, zero for a method that ignores its input, seeded, every kind of method
reached by the noise, token swaps, and runs through the API."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from captum.metrics import infidelity, sensitivity_max
from helpers import ARCHITECTURES, examples, one_batch

import attrib_bench
from attrib_bench import EvalContext, UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.erasure import candidates
from attrib_bench_plugins.attention import RawAttention
from attrib_bench_plugins.baselines import RandomAttributor
from attrib_bench_plugins.gradient import IntegratedGradients, Saliency
from attrib_bench_plugins.perturbation import Occlusion
from attrib_bench_plugins.robustness import (
    Infidelity,
    LocalLipschitz,
    SensitivityAvg,
    SensitivityMax,
    embedding_noise,
    example_batch,
    gate_noise,
    noise_generator,
    swapped_ids,
)

SAMPLES, RADIUS = 4, 0.5


@pytest.fixture(scope="module")
def loaded(tiny_bert):
    return load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)


def traced(loaded, attributor, items=None):
    return trace_batch(loaded, one_batch(loaded, items or examples()), attributor.requires)


def evaluate(evaluator, attributor, trace, **params) -> np.ndarray:
    configured = evaluator.configure({k: str(v) for k, v in params.items()})
    context = EvalContext(trace, None, trace.seed, attributor)
    return configured.score(attributor.attribute(trace), context)["aggregated"][0]


def encoder_logits(model, embeddings_VND: torch.Tensor) -> torch.Tensor:
    """The classifier on given embedding outputs, past Hugging Face's embedding module: an
    embedding-level model written apart from the evaluators' hooks."""
    encoded = model.bert.encoder(embeddings_VND).last_hidden_state
    return model.classifier(model.bert.pooler(encoded))


def example_embeddings(loaded, batch, row) -> tuple[torch.Tensor, np.ndarray, int]:
    """Example ``row`` alone: its embedding output (1, n, D), candidates (n,), class."""
    one = example_batch(batch, row)
    trace = trace_batch(loaded, one, {"hidden_states"})
    return trace.hidden_states[0], candidates(trace)[0], int(trace.predicted_B[0])


def replay(noise: torch.Tensor):
    """A Captum perturb_func that adds these draws (one parameter: Captum then passes no
    radius)."""
    return lambda inputs: inputs + noise


def by_id(trace, scores: np.ndarray) -> dict[str, float]:
    """Scores keyed by example id (a batch is sorted by length)."""
    return {example.id: float(v) for example, v in zip(trace.batch.examples, scores, strict=True)}


def test_sensitivity_max_equals_captum_with_the_same_noise(loaded):
    """Captum's sensitivity_max of gradient x input (L2 per token) on an embedding-level model,
    its perturb_func replaying the evaluator's seeded noise."""
    trace = traced(loaded, Saliency())
    ours = evaluate(SensitivityMax(), Saliency(), trace, samples=SAMPLES, radius=RADIUS)
    model = loaded.model
    for row, example in enumerate(trace.batch.examples):
        embedded, keep_N, label = example_embeddings(loaded, trace.batch, row)

        def explain(embeddings_VND, keep_N=keep_N, label=label):
            if isinstance(embeddings_VND, tuple):  # the unperturbed input: a tuple, as Captum's
                return (explain(*embeddings_VND),)  # attribute methods, which it calls so
            with torch.enable_grad():
                embeddings_VND = embeddings_VND.detach().requires_grad_()
                logits = encoder_logits(model, embeddings_VND)
                (grad,) = torch.autograd.grad(logits[:, label].sum(), embeddings_VND)
            return (grad * embeddings_VND).norm(dim=-1)[:, torch.as_tensor(keep_N)]

        noise = embedding_noise(
            noise_generator(trace.seed, example.id), SAMPLES, keep_N, embedded.shape[-1], RADIUS
        )
        expected = sensitivity_max(
            explain,
            embedded,
            perturb_func=replay(noise),
            n_perturb_samples=SAMPLES,
        )
        assert ours[row] == pytest.approx(float(expected), rel=1e-4), row


def test_infidelity_equals_captum_called_directly_and_the_definition(loaded):
    """Captum's infidelity of an embedding-level gate model, and the float64 mean of
    (I . Phi - (f(1) - f(1 - I)))^2 from the same draws."""
    attributor = RandomAttributor()  # scores unrelated to the model: a large infidelity
    trace = traced(loaded, attributor)
    std = 0.5
    ours = evaluate(Infidelity(), attributor, trace, samples=SAMPLES, std=std)
    rows_BN = attributor.attribute(trace).aggregated_BLN[:, -1].double()
    for row, example in enumerate(trace.batch.examples):
        embedded, keep_N, label = example_embeddings(loaded, trace.batch, row)
        real_N = trace.batch.attention_mask_BN[row].bool()
        phi_1N = (rows_BN[row, real_N] * torch.as_tensor(keep_N))[None]
        draws = gate_noise(noise_generator(trace.seed, example.id), SAMPLES, keep_N, std)

        def probability(gates_VN, label=label, embedded=embedded):
            logits = encoder_logits(loaded.model, embedded * gates_VN[..., None].float())
            return torch.softmax(logits.double(), dim=-1)[:, label]

        expected = infidelity(
            probability,
            lambda gates, draws=draws: (draws, gates - draws),
            torch.ones(1, len(keep_N), dtype=torch.float64),
            phi_1N,
            n_perturb_samples=SAMPLES,
        )
        assert ours[row] == pytest.approx(float(expected), rel=1e-4, abs=1e-9), row
        with torch.no_grad():
            drop_S = probability(torch.ones(1, len(keep_N))) - probability(1 - draws)
        definition = ((draws @ phi_1N[0] - drop_S) ** 2).mean()
        assert ours[row] == pytest.approx(float(definition), rel=1e-4), row
        assert ours[row] > 0


def test_a_method_that_ignores_its_input_scores_zero(loaded):
    trace = traced(loaded, RandomAttributor())
    for evaluator in (SensitivityMax(), SensitivityAvg(), LocalLipschitz()):
        scores = evaluate(evaluator, RandomAttributor(), trace, samples=SAMPLES, radius=RADIUS)
        assert scores.shape == (5,) and (scores == 0.0).all(), evaluator.name


@pytest.mark.parametrize(
    "attributor",
    [RawAttention(), Saliency(), IntegratedGradients().configure({"steps": "4"}), Occlusion()],
    ids=lambda a: a.name,
)
def test_every_kind_of_method_sees_the_noise(loaded, attributor):
    """The attention family through the traced pass, gradients through the trace's graph and
    Captum's own passes, occlusion through its perturbed passes."""
    trace = traced(loaded, attributor)
    average = evaluate(SensitivityAvg(), attributor, trace, samples=2, radius=RADIUS)
    lipschitz = evaluate(LocalLipschitz(), attributor, trace, samples=2, radius=RADIUS)
    assert (average > 1e-4).all() and (lipschitz > 0).all(), (average, lipschitz)


def test_scores_are_seeded_per_example_and_max_bounds_the_mean(loaded):
    trace = traced(loaded, Saliency())
    settings = {"samples": SAMPLES, "radius": RADIUS}
    first = evaluate(SensitivityMax(), Saliency(), trace, **settings)
    again = evaluate(SensitivityMax(), Saliency(), traced(loaded, Saliency()), **settings)
    other_seed = evaluate(SensitivityMax(), Saliency(), trace, seed=1, **settings)
    np.testing.assert_array_equal(first, again)
    assert (first != other_seed).all()
    part = traced(loaded, Saliency(), examples()[1:3])
    alone = by_id(part, evaluate(SensitivityMax(), Saliency(), part, samples=2))
    default = by_id(trace, evaluate(SensitivityMax(), Saliency(), trace, samples=2))
    assert alone == {key: default[key] for key in ("1", "2")}  # never from batch companions
    mean = evaluate(SensitivityAvg(), Saliency(), trace, **settings)
    assert (mean <= first).all() and (mean < first).any()
    unnormalised = evaluate(SensitivityMax(), Saliency(), trace, normalise="false", **settings)
    assert not np.allclose(unnormalised, first)
    repeated = evaluate(Infidelity(), Saliency(), trace)
    np.testing.assert_array_equal(repeated, evaluate(Infidelity(), Saliency(), trace))


def test_local_lipschitz_is_the_change_over_the_noise_norm(loaded):
    """Unnormalised sensitivity over ||delta|| of the same draws: with samples=1 the ratio of
    the two evaluators is the noise's norm."""
    trace = traced(loaded, Saliency())
    change = evaluate(SensitivityMax(), Saliency(), trace, samples=1, normalise="false")
    ratio = evaluate(LocalLipschitz(), Saliency(), trace, samples=1)
    keep_BN = candidates(trace)
    for row, example in enumerate(trace.batch.examples):
        keep_N = keep_BN[row][trace.batch.attention_mask_BN[row].bool().numpy()]
        noise = embedding_noise(noise_generator(trace.seed, example.id), 1, keep_N, 32, 0.02)
        assert ratio[row] == pytest.approx(change[row] / float(noise.double().norm()), rel=1e-9)


@pytest.fixture
def synonyms(tmp_path):
    path = tmp_path / "synonyms.json"
    path.write_text(json.dumps({"good": ["fine", "nice"], "film": ["movie"], "bad": ["poor"]}))
    return path


def test_swaps_replace_the_share_of_tokens_that_have_a_synonym(loaded, synonyms):
    tokenizer = loaded.tokenizer
    ids_N = torch.tensor(tokenizer("the film was not good .")["input_ids"])
    keep_N = np.ones(len(ids_N), dtype=bool)
    keep_N[[0, -1]] = False
    table = json.loads(synonyms.read_text())
    allowed = {tokenizer.convert_tokens_to_ids(w) for w in ("fine", "nice", "movie")}
    for share, count in ((0.1, 1), (1.0, 2)):
        swapped = swapped_ids(tokenizer, ids_N, keep_N, table, share, 6, torch.Generator())
        changed = swapped != ids_N
        assert (changed.sum(dim=1) == count).all()
        assert set(swapped[changed].tolist()) <= allowed
    nothing = torch.tensor(tokenizer("the soup was cold")["input_ids"])
    keep = np.array([False, True, True, True, True, False])
    assert swapped_ids(tokenizer, nothing, keep, table, 0.5, 3, torch.Generator()) is None


def test_swap_sensitivity(loaded, synonyms):
    """Sentences with a synonym get a positive score, the others none; input-blind: 0."""
    trace = traced(loaded, Saliency())
    swap = {"perturbation": "swap", "synonyms": synonyms, "samples": 3, "share": 0.5}
    scores = by_id(trace, evaluate(SensitivityMax(), Saliency(), trace, **swap))
    assert scores["0"] > 0 and scores["2"] > 0  # "the film was not good .", "bad"
    assert np.isnan(scores["4"])  # the soup sentence: nothing to swap
    blind = evaluate(
        SensitivityMax(), RandomAttributor(), traced(loaded, RandomAttributor()), **swap
    )
    assert np.nan_to_num(blind).max() == 0 and np.isfinite(blind).sum() == 2


def test_parameters_are_validated(synonyms, tmp_path):
    bad = {
        SensitivityMax(): [
            ("samples", "0"), ("radius", "0"), ("radius", "inf"), ("layer", "0"),
            ("share", "0"), ("share", "1.5"),
        ],
        LocalLipschitz(): [("samples", "0"), ("radius", "-1"), ("layer", "-2")],
        Infidelity(): [("samples", "0"), ("std", "0"), ("layer", "0"), ("chunk_tokens", "0")],
    }  # fmt: skip
    for evaluator, cases in bad.items():
        for key, value in cases:
            with pytest.raises(UsageError, match=rf"^{evaluator.name}:{key} must be"):
                evaluator.configure({key: value})
    with pytest.raises(UsageError, match="perturbation=swap only"):
        SensitivityAvg().configure({"synonyms": str(synonyms)})
    (tmp_path / "list.json").write_text("[]")
    for path in (tmp_path / "missing.json", tmp_path / "list.json"):
        with pytest.raises(UsageError, match="sensitivity-avg:synonyms="):
            SensitivityAvg().configure({"perturbation": "swap", "synonyms": str(path)})


def test_a_run_scores_them_and_swaps_without_synonyms_fail_alone(tiny_bert):
    swap = "sensitivity-max:perturbation=swap"
    result = attrib_bench.run(
        model=str(tiny_bert),
        limit=3,
        attributors=["saliency", "attention", "rollout"],
        evaluators=[
            "sensitivity-max:samples=2", "sensitivity-avg:samples=2",
            "local-lipschitz:samples=2", "infidelity", swap, "spearman",
        ],
        cache=False,
    )  # fmt: skip
    error = result.evaluators[swap]["error"]
    assert "\n" not in error and "has no masked-LM head: pass synonyms=PATH" in error
    assert error.startswith("sensitivity-max:perturbation=swap")
    for method in ("saliency", "attention"):
        row = result.methods[method]
        for name in ("sensitivity-max:samples=2", "local-lipschitz:samples=2", "infidelity"):
            values = row.example_scores(name)
            assert values.shape == (3,) and np.isfinite(values).all() and (values >= 0).all()
        assert not math.isnan(row.score("spearman").mean)
    info = result.evaluator_info["sensitivity-avg:samples=2"]
    assert info["higher_is_better"] is False


class Counting:
    """Saliency that counts its calls."""

    name = "counting"
    requires = Saliency.requires

    def __init__(self) -> None:
        self.calls = 0

    def attribute(self, trace):
        self.calls += 1
        return Saliency().attribute(trace)


def test_evaluators_drawing_the_same_noise_share_the_re_attributions(loaded):
    counting = Counting()
    trace = traced(loaded, counting)
    context = EvalContext(trace, None, trace.seed, counting)
    attribution = counting.attribute(trace)
    for evaluator in (SensitivityMax(), SensitivityAvg(), LocalLipschitz()):
        evaluator.configure({"samples": "2"}).score(attribution, context)
    assert counting.calls == 1 + 5 * (2 + 1)  # the batch's own, then per example x and 2 draws
    SensitivityMax().configure({"samples": "2", "radius": "0.1"}).score(attribution, context)
    assert counting.calls == 1 + 2 * 5 * 3
