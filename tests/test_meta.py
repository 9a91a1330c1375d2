"""The meta-evaluation (attrib_bench.runner.meta) and its synthetic model (model.synthetic):
the model's logits are its weight sums, erasing by its exact attribution is optimal, the
degradations are seeded and nested around the base, the taus are scipy's, and on the synthetic
model every evaluator orders the degradations and ranks the exact attribution first."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import minilm_path
from helpers import ARCHITECTURES, examples, one_batch
from scipy.stats import kendalltau

from attrib_bench.core import clock
from attrib_bench.core.interfaces import EvalContext
from attrib_bench.core.registry import load_registry
from attrib_bench.model.synthetic import ExactAttributor, synthetic_model, token_weights
from attrib_bench.model.trace import trace_batch
from attrib_bench.results.stats import bootstrap_ci
from attrib_bench.runner import meta
from attrib_bench.runner.state import MethodState
from attrib_bench.toolkit.erasure import candidates

SHORT = ["the film was not good .", "bad", "a truly moving story", "cold soup , rude waiter"]


@pytest.fixture(scope="module")
def linear():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    return synthetic_model(tokenizer, 3, dtype=torch.float64, architectures=ARCHITECTURES)


def test_logit_difference_is_the_weight_sum_of_real_tokens(linear):
    batch = one_batch(linear, examples(SHORT))
    weights = token_weights(linear.model.config).numpy()  # float64, from the seed
    ids = batch.input_ids_BN.numpy()
    counted = batch.attention_mask_BN.bool().numpy() & ~batch.special_tokens_mask_BN.bool().numpy()
    masked = np.where(counted, linear.tokenizer.mask_token_id, ids)  # every real token [MASK]ed
    expected = np.array([weights[row[keep]].sum() for row, keep in zip(ids, counted, strict=True)])
    with torch.no_grad():
        logits = linear.model(**batch.model_inputs()).logits
        embedded = linear.model(
            inputs_embeds=linear.embeddings(batch.input_ids_BN),
            attention_mask=batch.attention_mask_BN,
        ).logits
        erased = linear.model(
            input_ids=torch.as_tensor(masked), attention_mask=batch.attention_mask_BN
        ).logits
    assert logits.dtype == torch.float64
    np.testing.assert_allclose((logits[:, 1] - logits[:, 0]).numpy(), expected, atol=1e-12)
    np.testing.assert_allclose((embedded[:, 1] - embedded[:, 0]).numpy(), expected, atol=1e-12)
    np.testing.assert_allclose(erased.numpy(), 0.0, atol=1e-12)  # [MASK] and specials weigh 0


def test_erasing_by_the_exact_attribution_is_optimal_at_every_k(linear):
    """Comprehensiveness of the exact attribution at k of n tokens equals the largest drop of
    p(y) over every k-token erasure (exhaustively: each example has at most 6 candidates)."""
    registry = load_registry()
    for example in examples(SHORT):
        batch = one_batch(linear, [example])
        trace = trace_batch(linear, batch, set())
        attribution = ExactAttributor().attribute(trace)
        positions = np.flatnonzero(candidates(trace)[0])
        n = len(positions)
        assert 1 <= n <= 6
        y = int(trace.logits_BC.argmax(dim=-1))
        before = float(torch.softmax(trace.logits_BC[0], dim=-1)[y])
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(positions, k))
            ids = batch.input_ids_BN.repeat(len(subsets), 1)
            for row, subset in enumerate(subsets):
                ids[row, list(subset)] = linear.tokenizer.mask_token_id
            with torch.no_grad():
                logits = linear.model(
                    input_ids=ids, attention_mask=batch.attention_mask_BN.expand_as(ids)
                ).logits
            best = before - float(torch.softmax(logits, dim=-1)[:, y].min())
            evaluator = registry.evaluator(f"comprehensiveness:ratios={k / n}")
            scored = evaluator.score(attribution, EvalContext(trace, None, 0))["aggregated"]
            assert float(scored[0, 0]) == pytest.approx(best, abs=1e-12), (example.text, k)


def test_degradations_are_seeded_nested_around_the_base_and_reversed():
    rng = np.random.default_rng(0)
    scores_BN = rng.normal(size=(3, 9))
    candidates_BN = np.ones((3, 9), dtype=bool)
    candidates_BN[:, [0, 8]] = False  # [CLS] and [SEP]
    candidates_BN[2, 5:] = False  # a shorter example
    ids = ["a", "b", "c"]
    assert np.array_equal(meta.degrade(scores_BN, candidates_BN, 0.0, 7, ids), scores_BN)
    assert np.array_equal(meta.degrade(scores_BN, candidates_BN, None, 7, ids), -scores_BN)
    for level in meta.LEVELS[1:]:
        once = meta.degrade(scores_BN, candidates_BN, level, 7, ids)
        assert np.array_equal(once, meta.degrade(scores_BN, candidates_BN, level, 7, ids))
        alone = meta.degrade(scores_BN[1:2], candidates_BN[1:2], level, 7, ids[1:2])
        assert np.array_equal(once[1:2], alone)  # a row never depends on its batch
        assert np.array_equal(once[~candidates_BN], scores_BN[~candidates_BN])
        for b in range(3):
            n = candidates_BN[b].sum()
            changed = (once[b] != scores_BN[b]).sum()
            assert changed <= math.floor(level * n + 0.5)
            drawn = set(once[b, candidates_BN[b]])  # drawn from the row's own scores
            assert drawn <= set(scores_BN[b, candidates_BN[b]])
            if level == 1.0:  # a permutation of the row
                assert sorted(once[b, candidates_BN[b]]) == sorted(scores_BN[b, candidates_BN[b]])
    other = meta.degrade(scores_BN, candidates_BN, 1.0, 8, ids)
    assert not np.array_equal(other, meta.degrade(scores_BN, candidates_BN, 1.0, 7, ids))


class _Lower:
    name = "lower"
    description = "a lower-is-better stand-in"
    needs_reference = False
    higher_is_better = False

    def score(self, attribution, context):
        raise NotImplementedError


def test_taus_are_scipys_against_the_known_order_oriented_by_the_evaluator():
    rng = np.random.default_rng(1)
    scores_EM = rng.normal(size=(12, 6)) + np.arange(6)  # lower is better: the order is right
    scores_EM[3, 2] = np.nan  # an example one explainer could not score
    methods = [MethodState(f"m{m}", None) for m in range(6)]
    ids = [str(e) for e in range(12)]
    for m, method in enumerate(methods):
        column = method.column("lower", "aggregated")
        for e, example_id in enumerate(ids):
            column[example_id] = np.array([scores_EM[e, m]])
    row = meta._agreement("lower", _Lower(), methods, ids, 0, None)
    known = np.arange(6)[::-1]
    taus = []
    for values in -scores_EM:
        defined = ~np.isnan(values)
        taus.append(kendalltau(known[defined], values[defined]).statistic)
    complete = -scores_EM[~np.isnan(scores_EM).any(axis=1)]
    corpus = kendalltau(known, complete.mean(axis=0)).statistic
    assert row.tau_example["mean"] == pytest.approx(np.mean(taus), abs=1e-12)
    assert row.tau_example["ci95"] == bootstrap_ci(np.array(taus), 0)
    assert row.tau_corpus["value"] == pytest.approx(corpus, abs=1e-12)
    assert row.tau_corpus["n"] == 11
    assert row.means == pytest.approx(list(-complete.mean(axis=0)))  # reported unoriented
    assert row.tau_corpus["value"] > 0.8 and not row.flagged and row.base_best
    noise = rng.normal(size=(12, 6))  # no order at all: flagged
    for m, method in enumerate(methods):
        for e, example_id in enumerate(ids):
            method.column("lower", "aggregated")[example_id] = np.array([noise[e, m]])
    assert meta._agreement("lower", _Lower(), methods, ids, 0, None).flagged


def test_the_base_is_best_unless_a_degradation_beats_it_significantly():
    rng = np.random.default_rng(2)
    ordered = rng.normal(scale=0.1, size=(20, 6)) + np.arange(6)[::-1]
    assert meta.base_best(ordered, 0)
    saturated = ordered.copy()  # base and mildest degradation both clipped: a tie up to
    saturated[:, :2] = 5.0 + rng.normal(scale=1e-12, size=(20, 2))  # float noise
    assert meta.base_best(saturated, 0)
    beaten = ordered.copy()
    beaten[:, 2] += 3.0  # 50% noise well above the base on every example
    assert not meta.base_best(beaten, 0)


def test_on_the_synthetic_model_every_evaluator_orders_the_degradations(monkeypatch):
    """Done when: the known-order agreement reported for every faithfulness evaluator, and the
    exact attribution best under every one the meta-evaluation does not flag. The property
    that holds on these 12 sentences: every corpus tau is 1 (above 0.8), and every
    per-example mean tau above 0.6 (a share of 25% of 3-token sentences replaces 1 token,
    which may not change its rank)."""
    from attrib_bench.api import meta as meta_evaluation

    monkeypatch.setattr(clock, "now", lambda: 0.0)  # seconds come from the injected clock
    result = meta_evaluation(only="synthetic", limit=12, batch_size=6)
    (run,) = result.runs
    assert run.base == "exact" and run.examples == 12
    assert set(run.evaluators) == {
        "comprehensiveness",
        "sufficiency",
        "deletion",
        "insertion",
        "abpc",
        "log-odds",
        "masked-accuracy",
        "loo-tau",
        "soft-comprehensiveness",
        "soft-sufficiency",
        "ffidelity",
    }
    for name, row in run.evaluators.items():
        assert row.status == "ok", (name, row.error)
        assert row.tau_corpus["value"] > 0.8, name
        assert row.tau_example["mean"] > 0.6, name
        assert not row.flagged, name
        assert row.base_best, name
        assert row.cost.seconds == 0.0
    assert run.cost.distinct > 0 and run.cost.inputs <= 1.2 * run.cost.distinct
    document = result.to_document()
    meta.validate_meta(document, "test")
    again = meta.MetaResult.from_document(document)
    assert again.to_document() == document


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--meta-base", "nosuch"], "unknown base method"),
        (["--evaluators", "seed-invariance"], "seed-invariance compares one method across"),
        (["--evaluators", "spearman"], "spearman scores against a reference"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_cli, flags, said):
    code, _, err = run_cli("meta", "--limit", "2", *flags)
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0]  # (a broken plugin may add its warning)


def test_run_meta_adds_the_section_and_the_leaderboard_marks_flagged_evaluators(tiny_bert):
    from attrib_bench.api import run
    from attrib_bench.reports.leaderboard import heading

    result = run(
        model=str(tiny_bert),
        limit=4,
        attributors=["attention"],
        evaluators=["comprehensiveness"],
        meta=True,
    )
    section = result.extra["meta"]
    meta.validate_meta(section, "test")
    synthetic, own = section["runs"]
    assert synthetic["synthetic"] and not own["synthetic"]
    assert own["base"] == "saliency" and list(own["evaluators"]) == ["comprehensiveness"]
    for flagged, marked in ((False, False), (True, True)):
        own["evaluators"]["comprehensiveness"]["flagged"] = flagged
        assert ("UNRELIABLE" in heading(result, "comprehensiveness")) is marked
    own["evaluators"]["comprehensiveness"]["flagged"] = False
    synthetic["evaluators"]["comprehensiveness"]["flagged"] = True  # not the run's model
    assert "UNRELIABLE" not in heading(result, "comprehensiveness")


def test_run_meta_with_no_evaluator_to_meta_evaluate_is_one_line(run_cli, tiny_bert):
    code, _, err = run_cli("run", "--model", tiny_bert, "--limit", "2", "--meta", "--quiet")
    assert code == 2
    assert "none of the evaluators (spearman)" in err and "Traceback" not in err


class _Broken:
    name = "broken"
    description = "raises a usage error"
    needs_reference = False

    def score(self, attribution, context):
        from attrib_bench import UsageError

        raise UsageError("broken: cannot score this model; use another evaluator")


def test_a_failing_evaluator_is_reported_and_the_others_go_on():
    from attrib_bench.data.load import load_examples
    from attrib_bench.model.synthetic import ExactAttributor
    from attrib_bench.runner.state import RunConfig

    config = RunConfig(limit=4)
    registry = load_registry()
    prepared = meta.synthetic_prepared(registry, load_examples(limit=4), None, config)
    evaluators = {"broken": _Broken(), "log-odds": registry.evaluator("log-odds")}
    run = meta.meta_run(prepared, "exact", ExactAttributor(), evaluators, 0, synthetic=True)
    assert run.evaluators["broken"].status == "failed"
    assert "cannot score this model" in run.evaluators["broken"].error
    assert run.evaluators["log-odds"].status == "ok"
    assert run.evaluators["log-odds"].tau_corpus["n"] == 4


def test_evaluators_with_a_scorer_are_left_out_on_the_synthetic_model(tiny_bert, monkeypatch):
    """A scorer is a fine-tune of the run's model: on the synthetic model it would judge
    another model's inputs, so the synthetic run leaves its evaluators out."""
    from attrib_bench.api import meta as meta_evaluation

    monkeypatch.setattr(clock, "now", lambda: 0.0)
    scored = f"deletion:scorer={tiny_bert}"
    result = meta_evaluation(
        only="synthetic", limit=4, batch_size=4, evaluators=["deletion", scored]
    )
    (run,) = result.runs
    assert set(run.evaluators) == {"deletion"}


def test_a_scorers_passes_are_counted_as_the_models_are(tiny_bert, tmp_path, monkeypatch):
    """``deletion:scorer=`` a copy of the model erases what ``deletion`` erases, on the
    scorer and in its own cache: its cost counts those passes and that cache, the same."""
    import shutil

    from attrib_bench.api import meta as meta_evaluation

    monkeypatch.setattr(clock, "now", lambda: 0.0)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_bert, copy)
    scored = f"deletion:scorer={copy}"
    result = meta_evaluation(
        model=str(tiny_bert), only="model", limit=4, batch_size=4, evaluators=["deletion", scored]
    )
    (run,) = result.runs
    plain, copied = run.evaluators["deletion"].cost, run.evaluators[scored].cost
    assert plain.inputs > 0 and plain.distinct > 0
    assert (copied.passes, copied.inputs, copied.distinct) == (
        plain.passes,
        plain.inputs,
        plain.distinct,
    )
