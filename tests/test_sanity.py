"""The model-randomisation sanity check: what each step randomises, its target, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench import EvalContext, UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.attention import RawAttention
from attrib_bench_plugins.baselines import RandomAttributor
from attrib_bench_plugins.gradient import Saliency
from attrib_bench_plugins.sanity import ModelRandomization, cascade, reinitialize


@pytest.fixture(scope="module")
def loaded(tiny_bert):
    return load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)


def test_cascade_is_head_then_layers_from_the_top(loaded):
    model = loaded.model
    steps = cascade(model, loaded.adapter.layers)
    assert len(steps) == 1 + model.config.num_hidden_layers
    assert model.classifier in steps[0] and model.bert.pooler in steps[0]
    assert model.bert not in steps[0]
    assert [step[0] for step in steps[1:]] == list(reversed(loaded.adapter.layers))


def test_reinitialize_is_seeded_and_draws_like_bert(loaded):
    first, second = (
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)) for _ in range(2)
    )
    for module in (first, second):
        reinitialize(module, 0.02, torch.Generator().manual_seed(7))
    torch.testing.assert_close(first[0].weight, second[0].weight)
    assert first[0].weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert first[0].bias.abs().max() == 0 and (first[1].weight == 1).all()


class Recorder:
    """An attributor that records, per call, the model it saw and the class it was asked about."""

    name = "recorder"
    requires = frozenset()

    def __init__(self):
        self.models: list[dict[str, torch.Tensor]] = []
        self.predicted: list[torch.Tensor] = []

    def attribute(self, trace):
        self.models.append({k: v.clone() for k, v in trace.model.state_dict().items()})
        self.predicted.append(trace.predicted_B.clone())
        return RandomAttributor().attribute(trace)


def sanity_scores(sanity, attributor, trace) -> np.ndarray:
    context = EvalContext(trace, None, 0, attributor)
    return sanity.score(attributor.attribute(trace), context)["aggregated"]


def test_a_model_independent_method_scores_exactly_one_at_every_step(loaded):
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    scores = sanity_scores(ModelRandomization(), RandomAttributor(), trace)
    assert scores.shape == (1 + loaded.model.config.num_hidden_layers, 5)
    np.testing.assert_allclose(scores, 1.0, rtol=0, atol=1e-12)


def test_step_one_leaves_attention_unchanged_and_changes_gradients(loaded):
    """Step 1 re-initialises the head only: attention cannot see it, gradients must."""
    trace = trace_batch(loaded, one_batch(loaded, examples()), {"attentions", *Saliency.requires})
    step_one = ModelRandomization().configure({"steps": "1"})
    attention = sanity_scores(step_one, RawAttention(), trace)
    np.testing.assert_allclose(attention, 1.0, rtol=0, atol=1e-12)
    saliency = sanity_scores(step_one, Saliency(), trace)
    assert saliency.shape == (1, 5) and (saliency < 0.95).sum() >= 3, saliency


def test_cascade_randomises_the_head_then_layers_top_down_and_spares_the_trained_model(
    tiny_model,
):
    loaded = load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)
    trained = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    recorder = Recorder()
    sanity_scores(ModelRandomization(), recorder, trace)
    base = loaded.model.base_model_prefix
    head = ("classifier.", f"{base}.pooler.")
    layers = loaded.model.config.num_hidden_layers
    assert len(recorder.models) == 2 + layers  # the trained attribution, then every step
    for step, state in enumerate(recorder.models[1:], start=1):
        random_layers = [f"{base}.encoder.layer.{i}." for i in range(layers - step + 1, layers)]
        for name, value in state.items():
            changed = not torch.equal(value, trained[name])
            expected = name.startswith(head + tuple(random_layers))
            assert changed == expected, (step, name)
    for name, value in loaded.model.state_dict().items():  # the trained model is never touched
        assert torch.equal(value, trained[name]), name


def test_target_chooses_whose_predicted_class_is_explained(loaded):
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    trained_B = trace.predicted_B
    own, kept = Recorder(), Recorder()
    sanity_scores(ModelRandomization(), own, trace)
    sanity_scores(ModelRandomization().configure({"target": "trained"}), kept, trace)
    randomised = torch.stack(own.predicted[1:])
    assert (randomised != trained_B).any()  # the default explains the random model's classes
    for predicted in kept.predicted[1:]:
        assert torch.equal(predicted, trained_B)
    with pytest.raises(UsageError):
        ModelRandomization().configure({"target": "gold"})


def test_randomisation_is_seeded(loaded):
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)
    first = sanity_scores(ModelRandomization(), Saliency(), trace)
    np.testing.assert_array_equal(sanity_scores(ModelRandomization(), Saliency(), trace), first)
    two = sanity_scores(ModelRandomization().configure({"steps": "2"}), Saliency(), trace)
    np.testing.assert_array_equal(two, first[:2])


def test_bad_steps_are_usage_errors():
    with pytest.raises(UsageError):
        ModelRandomization().configure({"steps": "0"})


def test_sanity_in_a_run_reports_steps_as_layers(tiny_bert, run_cli, tmp_path):
    output = tmp_path / "result.json"
    code, out, err = run_cli(
        "run",
        "--model",
        tiny_bert,
        "--limit",
        "4",
        "--attributors",
        "attention",
        "--evaluators",
        "sanity",
        "--quiet",
        "--output",
        output,
    )
    assert code == 0, err
    assert "sanity (aggregated, lower is better)" in out
    document = json.loads(output.read_text())
    steps = document["methods"]["attention"]["scores"]["sanity"]["aggregated"]
    assert [s["layer"] for s in steps] == [1, 2, 3, 4]  # head, then layers 3, 2, 1
    assert document["evaluator_info"]["sanity"]["higher_is_better"] is False
    floor = document["methods"]["random"]["scores"]["sanity"]["aggregated"]
    assert all(s["mean"] == pytest.approx(1.0) for s in floor)
