"""The attribution target: positions for rollout and HTA, scores for gradients and faithfulness."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from captum.attr import InputXGradient, IntegratedGradients
from helpers import ARCHITECTURES, examples, one_batch
from test_faithfulness import toy_trace
from test_gradient import from_embedding_output, pad_baseline

from attrib_bench import UsageError
from attrib_bench.core.interfaces import Batch, Example
from attrib_bench.core.target import DEFAULT_TARGET, Target, target_score
from attrib_bench.core.trace import default_target_position
from attrib_bench.core.trace_fields import TRACE_FIELDS
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.norm_decomposition import norm_family
from attrib_bench.toolkit.token_contributions import contributions
from attrib_bench_plugins.attention import Rollout
from attrib_bench_plugins.faithfulness import Comprehensiveness, LogOdds
from attrib_bench_plugins.gradient import Gradient, Saliency
from attrib_bench_plugins.gradient import IntegratedGradients as OurIG
from attrib_bench_plugins.hta import HiddenTokenAttribution
from attrib_bench_plugins.norm import NormVariant

LAST = Target(position="last")


@pytest.fixture(scope="module")
def bert(tiny_bert):
    return load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)


def traced(loaded, target: Target, requires=frozenset(), items=None):
    items = examples() if items is None else items
    return trace_batch(loaded, one_batch(loaded, items), requires, target=target)


#: Each example's own foil: the class other than its label (two classes).
WITH_FOILS = [dataclasses.replace(e, foil=1 - e.label) for e in examples()]


# ------------------------------------------------------------------------------------ the spec


def test_spec_round_trips_and_the_resolved_default_is_the_first_token_and_predicted_class():
    assert Target("auto", "predicted") == DEFAULT_TARGET
    assert str(DEFAULT_TARGET) == "position=auto,score=predicted"
    # What a default run on an encoder records and keys its cache by, as before `auto`.
    assert str(DEFAULT_TARGET.resolved("first")) == "position=first,score=predicted"
    assert DEFAULT_TARGET.resolved("last").position == "last"
    assert LAST.resolved("first") is LAST
    target = Target.parse(" position=last , score=contrastive, foil=1")
    assert target == Target("last", "contrastive", 1)
    assert Target.parse(str(target)) == target
    assert target.to_dict() == {
        "spec": "position=last,score=contrastive,foil=1",
        "position": "last",
        "score": "contrastive",
        "class": "predicted",
        "foil": 1,
    }
    lm = Target.parse("position=last,score=contrastive,class=gold,foil=example")
    assert lm == Target("last", "contrastive", "example", "gold")
    assert str(lm) == "position=last,score=contrastive,class=gold,foil=example"
    assert Target.parse(str(lm)) == lm
    assert lm.to_dict()["class"] == "gold" and lm.to_dict()["foil"] == "example"
    # runner-up is the default foil, predicted the default class: both left out of the spec
    assert Target.parse("score=contrastive,class=predicted,foil=runner-up") == Target(
        score="contrastive"
    )
    assert str(Target(score="contrastive")) == "position=auto,score=contrastive"
    assert Target(score="gold").to_dict()["class"] == "gold"  # the class the score reads
    assert Target().to_dict()["class"] == "predicted"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("position=middle", "position='middle'"),
        ("score=loss", "score='loss'"),
        ("where=last", "bad target item"),
        ("last", "bad target item"),
        ("score=gold,foil=1", "foil= needs score=contrastive"),
        ("class=gold", "class= needs score=contrastive"),
        ("score=predicted,class=gold,foil=example", "class=, foil= needs score=contrastive"),
        ("score=contrastive,class=foil", "class='foil'"),
        ("score=contrastive,foil=x", "class index, runner-up or example"),
        ("score=contrastive,foil=-1", "class index"),
        ("position=first,position=last", "position= given twice"),
        ("score=contrastive,foil=1,foil=2", "foil= given twice"),
        ("", "empty target"),
        (" , ", "empty target"),
    ],
)
def test_bad_specs_are_usage_errors(spec, needle):
    with pytest.raises(UsageError, match=needle):
        Target.parse(spec)


def test_auto_has_no_positions_until_resolved():
    with pytest.raises(ValueError, match="resolve"):
        DEFAULT_TARGET.positions(torch.ones(1, 3))
    with pytest.raises(UsageError, match="target_position='middle'"):
        DEFAULT_TARGET.resolved("middle")


def test_positions_classes_and_foils():
    mask_BN = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert Target("first").positions(mask_BN).tolist() == [0, 0, 0]
    assert LAST.positions(mask_BN).tolist() == [2, 3, 0]
    logits_BC = torch.tensor([[0.0, 2.0, 1.0], [3.0, 1.0, 2.0], [0.0, 1.0, 5.0]])
    labels_B = torch.tensor([0, 0, 1])
    predicted_B = Target(score="predicted").classes(logits_BC, labels_B)
    assert predicted_B.tolist() == [1, 0, 2]
    assert Target(score="gold").classes(logits_BC, labels_B).tolist() == [0, 0, 1]
    with pytest.raises(UsageError, match="score=gold needs a label"):
        Target(score="gold").classes(logits_BC, None)
    assert Target(score="predicted").foils(logits_BC, predicted_B) is None
    runner_up = Target(score="contrastive").foils(logits_BC, predicted_B)
    assert runner_up.tolist() == [2, 2, 1]
    classes_B = logits_BC.argmax(dim=-1)
    torch.testing.assert_close(
        target_score(logits_BC, classes_B, runner_up), torch.tensor([1.0, 1.0, 4.0])
    )
    gold = Target(score="contrastive", class_="gold")
    gold_B = gold.classes(logits_BC, labels_B)
    assert gold_B.tolist() == [0, 0, 1]
    # the runner-up of a gold class: the highest-scoring class other than the gold one
    assert gold.foils(logits_BC, gold_B).tolist() == [1, 2, 2]
    with pytest.raises(UsageError, match="class=gold needs a label"):
        gold.classes(logits_BC, None)
    fixed = Target(score="contrastive", class_="gold", foil=2)
    assert fixed.foils(logits_BC, gold_B).tolist() == [2, 2, 2]
    with pytest.raises(UsageError, match="3 classes"):
        Target(score="contrastive", foil=3).foils(logits_BC, predicted_B)
    own = Target(score="contrastive", foil="example")
    assert own.foils(logits_BC, predicted_B, torch.tensor([0, 1, 0])).tolist() == [0, 1, 0]
    with pytest.raises(UsageError, match="foil=example needs a foil"):
        own.foils(logits_BC, predicted_B, None)
    with pytest.raises(UsageError, match="foil 7 is no class index"):
        own.foils(logits_BC, predicted_B, torch.tensor([0, 7, 0]))


def test_a_foil_equal_to_the_gold_class_is_a_usage_error_saying_how_often():
    logits_BC = torch.tensor([[0.0, 2.0, 1.0], [3.0, 1.0, 2.0], [0.0, 1.0, 5.0]])
    target = Target(score="contrastive", class_="gold", foil=0)
    classes_B = target.classes(logits_BC, torch.tensor([0, 0, 1]))
    with pytest.raises(UsageError, match="the gold class for 2 of 3"):
        target.foils(logits_BC, classes_B)


@pytest.mark.parametrize(
    ("target", "foils", "zero"),
    [
        # predicted classes 1, 0, 2: foil 1 is example 0's; foils 1, 0 those of examples 0, 1
        (Target(score="contrastive", foil=1), None, [True, False, False]),
        (Target(score="contrastive", foil="example"), [1, 0, 1], [True, True, False]),
    ],
)
def test_a_foil_that_is_the_predicted_class_scores_zero_there(target, foils, zero):
    """The model chose the foil: that example's score is 0, as it always was, not an error."""
    logits_BC = torch.tensor([[0.0, 2.0, 1.0], [3.0, 1.0, 2.0], [0.0, 1.0, 5.0]])
    classes_B = target.classes(logits_BC, None)
    foils_B = target.foils(logits_BC, classes_B, None if foils is None else torch.tensor(foils))
    scores_B = target_score(logits_BC, classes_B, foils_B)
    assert scores_B.eq(0).tolist() == zero


def test_the_data_checks_count_over_every_example():
    labelled = [Example(str(i), "a", label=i % 2, foil=1 - i % 2) for i in range(4)]
    unlabelled = [Example(str(i), "a", label=None if i else 0, foil=1) for i in range(4)]
    Target(score="contrastive", class_="gold", foil="example").check_examples(labelled)
    Target(score="contrastive").check_examples(unlabelled)  # the predicted class: no label
    with pytest.raises(UsageError, match="class=gold needs a label for every example; 3 of 4"):
        Target(score="contrastive", class_="gold").check_examples(unlabelled)
    with pytest.raises(UsageError, match="score=gold needs a label for every example; 3 of 4"):
        Target(score="gold").check_examples(unlabelled)
    without = [Example("0", "a", label=0, foil=1), Example("1", "a", label=1)]
    with pytest.raises(UsageError, match=r"foil=example needs a foil .* 1 of 2 have none"):
        Target(score="contrastive", foil="example").check_examples(without)
    with pytest.raises(UsageError, match="equals the gold class for 2 of 4 examples"):
        Target(score="contrastive", class_="gold", foil=1).check_examples(labelled)
    same = [Example(str(i), "a", label=0, foil=i % 2) for i in range(3)]
    with pytest.raises(UsageError, match="for 2 of 3 examples"):
        Target(score="contrastive", class_="gold", foil="example").check_examples(same)


def test_batch_foils_are_the_examples_own_or_none():
    items = [Example("a", "x", foil=1), Example("b", "y", foil=0)]
    batch = Batch(
        items,
        torch.zeros(2, 3, dtype=torch.long),
        torch.ones(2, 3),
        None,
        torch.zeros(2, 3),
        [],
    )
    assert batch.foils.tolist() == [1, 0] and batch.foils.dtype == torch.long
    batch.examples = [Example("a", "x", foil=1), Example("b", "y")]
    assert batch.foils is None


# --------------------------------------------------------------- auto: the family's position


def test_auto_resolves_to_the_family_position_in_every_trace(bert):
    trace = traced(bert, DEFAULT_TARGET, {"attentions"})
    assert trace.target == Target("first")
    assert trace.target_positions_B.tolist() == [0] * len(trace.batch.examples)
    assert default_target_position(bert) == "first"
    spec = bert.architectures["bert"]
    assert spec.target_position == "first"  # the built-in encoders read [CLS]
    decoder_like = dataclasses.replace(
        bert,
        architectures={
            **bert.architectures,
            "bert": dataclasses.replace(spec, target_position="last"),
        },
    )
    assert default_target_position(decoder_like) == "last"
    trace = traced(decoder_like, DEFAULT_TARGET, {"attentions"})
    assert trace.target == LAST
    assert trace.target_positions_B.tolist() == [n - 1 for n in trace.batch.lengths]
    rows = Rollout().attribute(trace).aggregated_BLN
    expected = Rollout().attribute(traced(bert, LAST, {"attentions"})).aggregated_BLN
    torch.testing.assert_close(rows, expected)
    # A model family without a spec (and a stand-in model without one) reads the first token.
    unknown = dataclasses.replace(bert, architectures={})
    assert default_target_position(unknown) == "first"
    assert default_target_position(None) == "first"
    # Assigned after construction, an unresolved target still resolves where positions are read.
    trace.target = DEFAULT_TARGET
    assert trace.target_positions_B.tolist() == [n - 1 for n in trace.batch.lengths]


def test_a_spec_with_a_bad_target_position_is_refused():
    from attrib_bench.core.architecture_spec import ArchitectureSpec

    assert ArchitectureSpec(model_types=("x",)).problem() is None
    problem = ArchitectureSpec(model_types=("x",), target_position="middle").problem()
    assert problem == "target_position='middle' is not one of first, last"


# ----------------------------------------------------------------- positions: rollout, norm, HTA


def rolled_out_rows(matrices, lengths, positions):
    """Float64 loop reference: per example, row ``positions[b]`` of each M^l and each R^l."""
    out = []
    for b, (n, j) in enumerate(zip(lengths, positions, strict=True)):
        product = None
        local, aggregated = [], []
        for matrix in matrices:
            m = matrix[b, :n, :n].double()
            product = m if product is None else m @ product
            local.append(m[j])
            aggregated.append(product[j])
        out.append((torch.stack(local), torch.stack(aggregated)))
    return out


def test_rollout_rows_are_the_last_real_tokens_rows_in_a_padded_batch(bert):
    trace = traced(bert, LAST, {"attentions"})
    lengths = trace.batch.lengths
    assert len(set(lengths)) > 1  # padded
    assert trace.target_positions_B.tolist() == [n - 1 for n in lengths]
    eye = torch.eye(trace.batch.input_ids_BN.shape[1])
    matrices = []
    for attention_BHNK in trace.attentions:
        mean_BNK = attention_BHNK.double().mean(dim=1) * trace.mask_BN[:, None, :]
        matrices.append(0.5 * mean_BNK / mean_BNK.sum(dim=-1, keepdim=True) + 0.5 * eye)
    ours = Rollout().attribute(trace)
    expected = rolled_out_rows(matrices, lengths, [n - 1 for n in lengths])
    for b, (n, (local, aggregated)) in enumerate(zip(lengths, expected, strict=True)):
        torch.testing.assert_close(ours.local_BLN[b, :, :n].double(), local, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            ours.aggregated_BLN[b, :, :n].double(), aggregated, rtol=1e-5, atol=1e-6
        )
        assert ours.aggregated_BLN[b, :, n:].abs().max() == 0 if n < eye.shape[0] else True
    first = Rollout().attribute(traced(bert, DEFAULT_TARGET, {"attentions"}))
    assert not torch.allclose(first.aggregated_BLN, ours.aggregated_BLN)


def test_norm_family_rows_follow_the_target_position(bert):
    trace = traced(bert, LAST, TRACE_FIELDS)
    lengths = trace.batch.lengths
    matrices = [layer["globenc"] for layer in norm_family(trace)]
    ours = NormVariant("globenc", "").attribute(trace)
    expected = rolled_out_rows(matrices, lengths, [n - 1 for n in lengths])
    for b, (n, (local, aggregated)) in enumerate(zip(lengths, expected, strict=True)):
        torch.testing.assert_close(ours.local_BLN[b, :, :n].double(), local, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            ours.aggregated_BLN[b, :, :n].double(), aggregated, rtol=1e-4, atol=1e-6
        )


def test_hta_reports_the_target_tokens_row(bert):
    trace = traced(bert, LAST, {"hidden_states"})
    ours = HiddenTokenAttribution().configure({"norm": "sum"}).attribute(trace)
    for b, n in enumerate(trace.batch.lengths):
        every = contributions(bert, trace.hidden_states[0][b, :n], "sum", targets=range(n))
        torch.testing.assert_close(ours.aggregated_BLN[b, :, :n], every[:, n - 1])


# ------------------------------------------------------------------------- scores: gradients


@pytest.mark.parametrize("score", ["predicted", "gold"])
def test_gradient_rows_equal_captum_with_the_run_target_class(bert, score):
    trace = traced(bert, Target(score=score), Saliency.requires)
    labels = trace.batch.labels
    assert (labels != trace.predicted_B).any()  # the two targets differ on this batch
    forward, start = from_embedding_output(bert, trace.batch)
    target = labels if score == "gold" else trace.predicted_B
    direct = InputXGradient(forward).attribute(start, target=target).norm(dim=-1)
    ours = Saliency().attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours[mask], direct[mask], rtol=1e-5, atol=1e-7)
    # The method's own target= still overrides the run's score.
    other = "predicted" if score == "gold" else "gold"
    overridden = Saliency().configure({"target": other}).attribute(trace).aggregated_BLN[:, 0]
    assert not torch.allclose(overridden[mask], ours[mask])
    plain_trace = traced(bert, DEFAULT_TARGET, Saliency.requires)
    plain = Saliency().configure({"target": other}).attribute(plain_trace)
    torch.testing.assert_close(overridden, plain.aggregated_BLN[:, 0])


@pytest.mark.parametrize(
    "target",
    [
        Target(score="contrastive"),
        Target(score="contrastive", foil=0),
        Target(score="contrastive", class_="gold"),
        Target(score="contrastive", class_="gold", foil="example"),
    ],
    ids=str,
)
def test_contrastive_gradient_is_the_gradient_of_the_logit_difference(bert, target):
    trace = traced(bert, target, Saliency.requires, items=WITH_FOILS)
    classes_B, foils_B = trace.target_classes_B, trace.target_foils_B
    labels_B = trace.batch.labels
    if target.class_ == "gold":
        assert classes_B.tolist() == labels_B.tolist()
        assert (classes_B != trace.predicted_B).any()  # not the predicted class
        assert foils_B.tolist() == (1 - labels_B).tolist()  # own foil = gold's runner-up here
    forward, start = from_embedding_output(bert, trace.batch)
    start = start.clone().requires_grad_(True)
    target_score(forward(start), classes_B, foils_B).sum().backward()
    method = Gradient()
    ours_BND = method.per_dimension(trace, classes_B, foils_B)
    torch.testing.assert_close(ours_BND, start.grad, rtol=1e-5, atol=1e-7)
    # linearity: the gradient of a difference is the difference of the two gradients
    difference = method.per_dimension(trace, classes_B, None) - method.per_dimension(
        trace, foils_B, None
    )
    torch.testing.assert_close(ours_BND, difference, rtol=1e-5, atol=1e-6)
    rows = method.attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(rows[mask], start.grad.norm(dim=-1)[mask], rtol=1e-5, atol=1e-7)


def test_contrastive_integrated_gradients_equal_captum_on_the_wrapped_forward(bert):
    trace = traced(bert, Target(score="contrastive"))
    batch = trace.batch
    classes_B, foils_B = trace.target_classes_B, trace.target_foils_B
    forward, start = from_embedding_output(bert, batch)

    def contrast(embedding_output):
        repeats = embedding_output.shape[0] // classes_B.shape[0]
        return target_score(
            forward(embedding_output), classes_B.repeat(repeats), foils_B.repeat(repeats)
        )

    with torch.no_grad():
        baseline = bert.model.base_model.embeddings(
            input_ids=pad_baseline(bert, batch),
            token_type_ids=batch.token_type_ids_BN,
            position_ids=bert.adapter.position_ids(batch.input_ids_BN),
        )
    direct = IntegratedGradients(contrast).attribute(start, baselines=baseline, n_steps=4)
    # internal batches of two steps: the classes and foils must follow each step's rows
    params = {"steps": "4", "chunk_tokens": str(2 * batch.input_ids_BN.shape[1])}
    ours = OurIG().configure(params).attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours[mask], direct.norm(dim=-1)[mask], rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------- scores: faithfulness


def test_faithfulness_with_the_gold_score_reads_the_gold_class():
    # The toy predicts class 1 on [CLS] A B C [SEP]; the gold label is 0. ratios=0.3 removes A
    # (z: 3 -> 1), so p(1) falls from sigmoid(2.5) to sigmoid(0.5) and p(0) rises as much.
    scores = [5.0, 0.9, 0.5, 0.1, 4.0]
    drop = 1 / (1 + math.exp(-2.5)) - 1 / (1 + math.exp(-0.5))
    for score, expected in (("predicted", drop), ("gold", -drop)):
        trace, attribution, context = toy_trace(scores, label=0)
        trace.target = Target(score=score)
        evaluator = Comprehensiveness().configure({"ratios": "0.3"})
        value = evaluator.score(attribution, context)["aggregated"][0, 0]
        assert value == pytest.approx(expected)
    trace, attribution, context = toy_trace(scores, label=0)
    predicted = LogOdds().score(attribution, context)["aggregated"][0, 0]
    trace.target = Target(score="gold")
    gold = LogOdds().score(attribution, context)["aggregated"][0, 0]
    assert predicted == pytest.approx(2.0)  # removing the top 20% (A) drops z by 2
    assert gold == pytest.approx(-predicted)  # two classes: the log-odds of 0 are minus 1's


# ----------------------------------------------------------------------------- the command line


def test_target_is_chosen_per_run_and_recorded_in_the_result(
    run_cli, tiny_bert, tmp_path, monkeypatch
):
    from attrib_bench.results.typed import validate

    monkeypatch.delenv("ATTRIB_BENCH_NO_CACHE")  # the second run must not reuse the first's rows

    output = tmp_path / "result.json"
    args = ("--model", tiny_bert, "--limit", "3", "--quiet", "--attributors", "rollout")
    code, _, err = run_cli(
        "run",
        *args,
        "--evaluators",
        "spearman",
        "--target",
        "position=last,score=gold",
        "--output",
        output,
    )
    assert code == 0, err
    document = json.loads(output.read_text())
    validate(document, "results")
    assert document["target"] == {
        "spec": "position=last,score=gold",
        "position": "last",
        "score": "gold",
        "class": "gold",
        "foil": None,
    }
    assert document["config"]["target"] == "position=last,score=gold"
    default = tmp_path / "default.json"
    assert run_cli("run", *args, "--evaluators", "spearman", "--output", default)[0] == 0
    first = json.loads(default.read_text())
    # The default, position=auto, is recorded resolved (in the config too, so results stay
    # comparable with runs that named it): BERT's [CLS], as before auto existed.
    assert first["config"]["target"] == "position=first,score=predicted"
    assert first["target"] == {
        "spec": "position=first,score=predicted",
        "position": "first",
        "score": "predicted",
        "class": "predicted",
        "foil": None,
    }
    rows = {
        doc["target"]["position"]: doc["methods"]["rollout"]["per_example"]
        for doc in (document, first)
    }
    assert rows["last"] != rows["first"]  # the cache keys the target


def test_the_default_runs_cache_key_holds_the_resolved_target(tiny_bert, tiny_roberta):
    from attrib_bench.runner.cache import run_identity
    from attrib_bench.runner.engine import prepare
    from attrib_bench.runner.state import RunConfig

    for model in (tiny_bert, tiny_roberta):
        prepared = prepare(RunConfig(model=str(model), limit=2), quiet=True)
        assert prepared.target == Target("first")
        assert run_identity(prepared, 0)["target"] == "position=first,score=predicted"
        explicit = prepare(RunConfig(model=str(model), limit=2, target="position=first"), True)
        assert run_identity(explicit, 0) == run_identity(prepared, 0)


def test_gold_minus_runner_up_is_recorded_and_valid_under_the_schema(run_cli, tiny_bert, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from attrib_bench.results.document import SCHEMA_PATH
    from attrib_bench.results.typed import validate

    output = tmp_path / "result.json"
    spec = "position=last,score=contrastive,class=gold"
    code, _, err = run_cli(
        "run",
        "--model",
        tiny_bert,
        "--limit",
        "3",
        "--quiet",
        "--attributors",
        "saliency",
        "--evaluators",
        "spearman,comprehensiveness",
        "--target",
        spec,
        "--output",
        output,
    )
    assert code == 0, err
    document = json.loads(output.read_text())
    validate(document, "results")
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(document)
    assert document["target"] == {
        "spec": spec,
        "position": "last",
        "score": "contrastive",
        "class": "gold",
        "foil": None,
    }
    with_example_foil = {**document, "target": {**document["target"], "foil": "example"}}
    validate(with_example_foil, "results")
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(with_example_foil)


def with_foils(monkeypatch, foil_of):
    """Give every example the runner loads ``foil_of(example)`` as its own foil."""
    from attrib_bench.runner import engine

    real = engine.load_examples

    def load_with_foils(*args, **kwargs):
        data = real(*args, **kwargs)
        data.examples = [dataclasses.replace(e, foil=foil_of(e)) for e in data.examples]
        return data

    monkeypatch.setattr(engine, "load_examples", load_with_foils)


def test_each_examples_own_foil_end_to_end(tiny_bert, monkeypatch):
    # Two classes: the class other than the gold one is both its runner-up and its own foil,
    # so foil=example and the runner-up give the same rows and faithfulness scores.
    import attrib_bench

    settings = dict(
        model=str(tiny_bert),
        limit=6,
        attributors=["saliency", "integrated-gradients:steps=4"],
        evaluators=["comprehensiveness:ratios=0.5"],
        reference="saliency",
    )
    runner_up = attrib_bench.run(**settings, target="position=last,score=contrastive,class=gold")
    with_foils(monkeypatch, lambda e: 1 - e.label)
    own = attrib_bench.run(
        **settings, target="position=last,score=contrastive,class=gold,foil=example"
    )
    assert own.extra["target"]["foil"] == "example"
    for spec in ("saliency", "integrated-gradients:steps=4"):
        ours, theirs = own.methods[spec], runner_up.methods[spec]
        assert ours.status == "ok"
        assert ours.per_example == theirs.per_example
    # Foils equal to the gold class on every example: one line, exit 2, saying how many.
    with_foils(monkeypatch, lambda e: e.label)
    with pytest.raises(UsageError, match="equals the gold class for 6 of 6 examples"):
        attrib_bench.run(
            **settings, target="position=last,score=contrastive,class=gold,foil=example"
        )


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("position=middle", "position='middle'"),
        ("score=contrastive,foil=x", "foil"),
        ("score=gold,class=gold", "class= needs score=contrastive"),
        ("score=contrastive,foil=example", "foil=example needs a foil for every example"),
        ("score=contrastive,class=gold,foil=1", "foil equals the gold class for"),
        ("position=first,position=last", "position= given twice"),
        ("", "empty target ''; leave it out for the default"),
    ],
)
def test_a_bad_target_exits_2_with_one_line(run_cli, tiny_bert, spec, needle):
    code, out, err = run_cli(
        "run", "--model", tiny_bert, "--limit", "4", "--quiet", "--target", spec
    )
    assert code == 2
    assert out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


def test_gold_without_labels_exits_2_with_one_line(run_cli, tiny_bert, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.tsv").write_text("sentence\nfine\nawful\n")
    for spec in ("score=gold", "score=contrastive,class=gold"):
        code, _, err = run_cli(
            "run", "--model", tiny_bert, "--dataset", data, "--quiet", "--target", spec
        )
        assert code == 2, err
        assert err.strip().splitlines() == [
            f"error: target {spec.split(',')[-1]} needs a label for every example; 2 of 2 have none"
        ]


def test_a_fixed_foil_equal_to_the_predicted_class_does_not_stop_the_run(run_cli, tiny_bert):
    # A fixed foil that is an example's predicted class gives it a score of 0 (every example's,
    # where the tiny model predicts one class: Spearman is then undefined, exit 3), not an error.
    for foil in (0, 1):
        code, _, err = run_cli(
            "run",
            "--model",
            tiny_bert,
            "--limit",
            "8",
            "--quiet",
            "--attributors",
            "rollout",
            "--evaluators",
            "spearman",
            "--target",
            f"score=contrastive,foil={foil}",
        )
        assert code in (0, 3) and "error" not in err, err
