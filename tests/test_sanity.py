"""The model-randomisation sanity check: cascade order, determinism, and its two extremes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import examples, one_batch

from attrib_bench import EvalContext, UsageError
from attrib_bench.model.load import load_model, weights_hash
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.baselines import RandomAttributor
from attrib_bench_plugins.gradient import Saliency
from attrib_bench_plugins.sanity import ModelRandomization, cascade, reinitialize


@pytest.fixture(scope="module")
def loaded(tiny_bert):
    return load_model(str(tiny_bert), "cpu")


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


def test_random_attributor_is_fully_insensitive_and_saliency_is_not(loaded):
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    before = weights_hash(loaded.model)
    sanity = ModelRandomization()
    for attributor, check in (
        (RandomAttributor(), lambda s: np.allclose(s, 1.0)),
        (Saliency(), lambda s: np.nanmean(s[-1]) < 0.9),
    ):
        context = EvalContext(trace, None, 0, attributor)
        scores = sanity.score(attributor.attribute(trace), context)["aggregated"]
        assert scores.shape == (1 + loaded.model.config.num_hidden_layers, 5)
        assert check(scores), scores
    assert weights_hash(loaded.model) == before  # the trained model is never touched
    again = sanity.score(Saliency().attribute(trace), EvalContext(trace, None, 0, Saliency()))
    np.testing.assert_allclose(again["aggregated"], scores)  # seeded: same random models
    two = ModelRandomization().configure({"steps": "2"})
    assert two.score(Saliency().attribute(trace), context)["aggregated"].shape == (2, 5)


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
