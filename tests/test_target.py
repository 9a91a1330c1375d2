"""The attribution target: positions for rollout and HTA, scores for gradients and faithfulness."""

from __future__ import annotations

import json
import math

import pytest
import torch
from captum.attr import InputXGradient, IntegratedGradients
from helpers import examples, one_batch
from test_faithfulness import toy_trace
from test_gradient import from_embedding_output, pad_baseline

from attrib_bench import UsageError
from attrib_bench.core.target import DEFAULT_TARGET, Target, target_score
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import TRACE_FIELDS, trace_batch
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
    return load_model(str(tiny_bert), "cpu")


def traced(loaded, target: Target, requires=frozenset()):
    return trace_batch(loaded, one_batch(loaded, examples()), requires, target=target)


# ------------------------------------------------------------------------------------ the spec


def test_spec_round_trips_and_defaults_keep_the_first_token_and_the_predicted_class():
    assert Target.parse("") == DEFAULT_TARGET == Target("first", "predicted")
    assert str(DEFAULT_TARGET) == "position=first,score=predicted"
    target = Target.parse(" position=last , score=contrastive, foil=1")
    assert target == Target("last", "contrastive", 1)
    assert Target.parse(str(target)) == target
    assert target.to_dict() == {
        "spec": "position=last,score=contrastive,foil=1",
        "position": "last",
        "score": "contrastive",
        "foil": 1,
    }


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("position=middle", "position='middle'"),
        ("score=loss", "score='loss'"),
        ("where=last", "bad target item"),
        ("last", "bad target item"),
        ("score=gold,foil=1", "needs score=contrastive"),
        ("score=contrastive,foil=x", "class index"),
        ("score=contrastive,foil=-1", "class index"),
    ],
)
def test_bad_specs_are_usage_errors(spec, needle):
    with pytest.raises(UsageError, match=needle):
        Target.parse(spec)


def test_positions_classes_and_foils():
    mask_BN = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert DEFAULT_TARGET.positions(mask_BN).tolist() == [0, 0, 0]
    assert LAST.positions(mask_BN).tolist() == [2, 3, 0]
    logits_BC = torch.tensor([[0.0, 2.0, 1.0], [3.0, 1.0, 2.0], [0.0, 1.0, 5.0]])
    labels_B = torch.tensor([0, 0, 1])
    assert Target(score="predicted").classes(logits_BC, labels_B).tolist() == [1, 0, 2]
    assert Target(score="gold").classes(logits_BC, labels_B).tolist() == [0, 0, 1]
    with pytest.raises(UsageError, match="score=gold needs a label"):
        Target(score="gold").classes(logits_BC, None)
    assert Target(score="predicted").foils(logits_BC) is None
    runner_up = Target(score="contrastive").foils(logits_BC)
    assert runner_up.tolist() == [2, 2, 1]
    assert Target(score="contrastive", foil=1).foils(logits_BC).tolist() == [1, 1, 1]
    with pytest.raises(UsageError, match="3 classes"):
        Target(score="contrastive", foil=3).foils(logits_BC)
    classes_B = logits_BC.argmax(dim=-1)
    torch.testing.assert_close(
        target_score(logits_BC, classes_B, runner_up), torch.tensor([1.0, 1.0, 4.0])
    )


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
    trace = traced(bert, Target(score=score))
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
    plain = Saliency().configure({"target": other}).attribute(traced(bert, DEFAULT_TARGET))
    torch.testing.assert_close(overridden, plain.aggregated_BLN[:, 0])


@pytest.mark.parametrize("foil", [None, 0])
def test_contrastive_gradient_is_the_gradient_of_the_logit_difference(bert, foil):
    trace = traced(bert, Target(score="contrastive", foil=foil))
    classes_B, foils_B = trace.target_classes_B, trace.target_foils_B
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
    params = {"steps": "4", "internal_batch_size": str(2 * len(batch.examples))}
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
        "foil": None,
    }
    assert document["config"]["target"] == "position=last,score=gold"
    default = tmp_path / "default.json"
    assert run_cli("run", *args, "--evaluators", "spearman", "--output", default)[0] == 0
    first = json.loads(default.read_text())
    assert first["target"]["spec"] == "position=first,score=predicted"
    rows = {
        doc["target"]["position"]: doc["methods"]["rollout"]["per_example"]
        for doc in (document, first)
    }
    assert rows["last"] != rows["first"]  # the cache keys the target


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("position=middle", "position='middle'"), ("score=contrastive,foil=x", "foil")],
)
def test_a_bad_target_exits_2_with_one_line(run_cli, tiny_bert, spec, needle):
    code, out, err = run_cli("run", "--model", tiny_bert, "--quiet", "--target", spec)
    assert code == 2
    assert out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
