"""Contrastive context attribution: the answer's log-probability minus a foil continuation's.

The reference for every property is the pair of plain scorers, one explaining the answer and
one the foil (each tested against the model's own logits in test_segments.py and
test_seq2seq.py): a contrastive score, its steps, its leave-one-out and its per-step gradients
are theirs, the foil's negated.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace

import numpy as np
import pytest
from conftest import SHARED_DATA
from helpers import ARCHITECTURES, save_tiny_decoder
from test_segments import EXAMPLE, TEMPLATE, write_jsonl

from attrib_bench.core.errors import UsageError
from attrib_bench.model.load import load_model
from attrib_bench.segments.data import SegmentExample, load_segments
from attrib_bench.segments.run import ContextConfig, is_contrastive
from attrib_bench.segments.scorer import SegmentScorer
from attrib_bench.testing.segment_conformance import save_tiny_seq2seq
from attrib_bench_plugins.segments import ContextCite, LeaveOneSegmentOut, TokenGradients

CONTRAST = replace(EXAMPLE, answer=" the cat sat", foil=" a dog")
MASKS = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 1, 1, 1]], dtype=bool)


@pytest.fixture(scope="module", params=["llama", "bart"])
def model64(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save = save_tiny_seq2seq if request.param == "bart" else save_tiny_decoder
    loaded = load_model(str(save(folder, request.param)), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def _plain(loaded, continuation: str) -> SegmentScorer:
    return SegmentScorer(loaded, replace(CONTRAST, answer=continuation, foil=None), TEMPLATE)


def _close(actual, expected) -> None:
    # LLaMA's RMSNorm normalises in float32 even in a float64 model.
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6 * np.abs(expected).max())


def test_steps_are_the_answers_then_the_foils_negated(model64):
    scorer = SegmentScorer(model64, CONTRAST, TEMPLATE)
    answer, foil = _plain(model64, CONTRAST.answer), _plain(model64, CONTRAST.foil)
    assert scorer.step_count == len(answer.answer_ids) + len(foil.answer_ids)
    assert scorer.prefix_count == scorer.step_count - 2
    expected = np.concatenate([answer.steps(MASKS), -foil.steps(MASKS)], axis=1)
    _close(scorer.steps(MASKS), expected)
    _close(scorer.scores(MASKS), answer.scores(MASKS) - foil.scores(MASKS))
    _close(scorer.full_score, answer.full_score - foil.full_score)


def test_leave_one_out_cached_and_naive_agree(model64):
    naive = SegmentScorer(model64, CONTRAST, TEMPLATE).leave_one_out(cached=False)
    cached_scorer = SegmentScorer(model64, CONTRAST, TEMPLATE)
    cached = cached_scorer.leave_one_out(cached=True)
    np.testing.assert_allclose(cached, naive, rtol=0, atol=1e-12)
    assert cached.shape == (4, cached_scorer.step_count)
    # What the cache left in memo is what running the masks whole gives.
    masks = ~np.eye(4, dtype=bool)
    np.testing.assert_allclose(cached_scorer.steps(masks), naive, rtol=0, atol=1e-12)
    drops = LeaveOneSegmentOut().attribute_segments(cached_scorer)
    answer, foil = _plain(model64, CONTRAST.answer), _plain(model64, CONTRAST.foil)
    plain = LeaveOneSegmentOut()
    _close(drops, plain.attribute_segments(answer) - plain.attribute_segments(foil))


def test_per_step_gradients_are_each_continuations_own(model64):
    """Rows: the answer's steps as the plain scorer gives them, then the foil's negated; the
    prefix: each continuation's earlier tokens, a block each (an answer step never reads the
    foil's tokens, nor a foil step the answer's)."""
    method = TokenGradients("input-x-gradient", "InputXGradient")
    steps = method.attribute_steps(SegmentScorer(model64, CONTRAST, TEMPLATE))
    answer = method.attribute_steps(_plain(model64, CONTRAST.answer))
    foil = method.attribute_steps(_plain(model64, CONTRAST.foil))
    Ta, Tf = len(answer.segments_TS), len(foil.segments_TS)
    _close(steps.segments_TS, np.concatenate([answer.segments_TS, -foil.segments_TS]))
    expected = np.zeros((Ta + Tf, Ta - 1 + Tf - 1))
    expected[:Ta, : Ta - 1] = answer.prefix_TP
    expected[Ta:, Ta - 1 :] = -foil.prefix_TP
    _close(steps.prefix_TP, expected)
    summed = method.attribute_segments(SegmentScorer(model64, CONTRAST, TEMPLATE))
    _close(summed, steps.segments_TS.sum(0))


def test_context_cite_fits_the_contrastive_score_as_it_is(model64):
    """A contrastive score is no log-probability: ``logit-prob`` would take log(1 - P) of a
    difference. The fit is then the ``log-prob`` one, on the score itself."""
    scorer = SegmentScorer(model64, CONTRAST, TEMPLATE)
    logit = ContextCite().attribute_segments(scorer)
    log_prob = ContextCite().configure({"output": "log-prob"}).attribute_segments(scorer)
    assert np.isfinite(logit).all()
    np.testing.assert_array_equal(logit, log_prob)


@pytest.mark.parametrize(
    ("foil", "message"),
    [
        (" mat", "the foil equals the answer"),
        ("t", "the foil 't' tokenises differently after the prompt"),
        (" mat" * 60, "prompt plus foil is .* tokens, longer than the model's limit of 64"),
    ],
)
def test_bad_foils_are_one_line(foil, message, tmp_path):
    loaded = load_model(
        str(save_tiny_decoder(tmp_path, "gpt2")), "cpu", architectures=ARCHITECTURES
    )
    example = SegmentExample("bad", ("the cat",), "the ca", " mat", foil=foil)
    with pytest.raises(UsageError, match=f"example 'bad': {message}"):
        SegmentScorer(loaded, example, "{context}\n{query}")


@pytest.mark.parametrize(
    "target",
    [
        "position=last,score=gold",
        "score=predicted",
        "score=contrastive",
        "score=contrastive,class=gold,foil=example",
    ],
)
def test_targets_that_do_not_apply_are_refused(target):
    with pytest.raises(UsageError, match="a context run explains its answer"):
        ContextConfig("data.jsonl", target=target)
    assert is_contrastive("score=contrastive,foil=example")
    assert not is_contrastive("score=gold")


def test_eraser_foils_are_the_other_label():
    examples, _ = load_segments(SHARED_DATA / "eraser_movies", "val", 2)
    assert {(e.answer, e.foil) for e in examples} <= {
        (" negative", " positive"),
        (" positive", " negative"),
    }


def test_records_without_a_foil_keep_their_fingerprint(tmp_path):
    """The fingerprint of data without foils is the one computed before foils existed."""
    record = {"id": "a", "segments": ["x y", "z"], "query": "q", "answer": " a"}
    examples, fingerprint = load_segments(write_jsonl(tmp_path / "d.jsonl", [record]))
    fields = ("id", "segments", "query", "answer", "evidence", "separator")  # the first ones
    before = [{k: asdict(e)[k] for k in fields} for e in examples]
    assert fingerprint == hashlib.sha256(json.dumps(before).encode()).hexdigest()
    foiled = write_jsonl(tmp_path / "f.jsonl", [{**record, "foil": " b"}])
    assert load_segments(foiled)[1] != fingerprint


def test_cli_contrastive_run_reports_both_continuations(run_cli, tmp_path):
    model = save_tiny_decoder(tmp_path / "llama", "llama")
    record = {"id": "a", "segments": list(EXAMPLE.segments), "query": "who sat?"}
    data = write_jsonl(tmp_path / "d.jsonl", [{**record, "answer": " the cat", "foil": " a dog"}])
    report = tmp_path / "report.json"
    code, _, err = run_cli(
        "context", "--dataset", data, "--model", model, "--template", TEMPLATE, "--quiet",
        "--target", "score=contrastive,foil=example", "--per-step", "--output", report,
        "--methods", "leave-one-segment-out,input-x-gradient,context-cite",
        "--token-methods", "saliency",
    )  # fmt: skip
    assert code == 3, err  # the token method cannot explain two continuations; the rest ran
    written = json.loads(report.read_text())
    (example,) = written["examples"]
    assert example["foil"] == " a dog" and example["foil_tokens"]
    T = len(example["answer_tokens"]) + len(example["foil_tokens"])
    assert np.shape(example["steps"]["input-x-gradient"]) == (T, 4)
    assert np.shape(example["prefix_steps"]["input-x-gradient"]) == (T, T - 2)
    statuses = {m: row["status"] for m, row in written["methods"].items()}
    assert "two continuations" in statuses.pop("tokens/saliency")
    assert set(statuses.values()) == {"ok"}
    assert written["config"]["target"] == "score=contrastive,foil=example"
    np.testing.assert_allclose(
        np.sum(example["steps"]["leave-one-segment-out"], 0),
        example["scores"]["leave-one-segment-out"],
    )

    # The report names the foil, and labels the foil's steps (negated) with a "-".
    import attrib_bench

    page = tmp_path / "page.html"
    text = attrib_bench.report(report, html=page)
    assert "answer ' the cat' against the foil ' a dog'" in text
    assert "the answer's log-probability minus the foil's" in text
    html = page.read_text()
    assert all(f"<td><code>-{token}</code></td>" in html for token in example["foil_tokens"])
    assert "against the foil <code> a dog</code>" in html

    # Data without a foil: one line, exit 2, nothing written.
    bare = write_jsonl(tmp_path / "bare.jsonl", [{**record, "answer": " the cat"}])
    code, _, err = run_cli(
        "context", "--dataset", bare, "--model", model, "--output", tmp_path / "none.json",
        "--target", "score=contrastive,foil=example",
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "example 'a' has no foil" in err and not (tmp_path / "none.json").exists()
    code, _, err = run_cli("context", "--dataset", bare, "--model", model, "--target", "score=x")
    assert code == 2 and "target score='x'" in err


def test_gradients_take_one_continuation_per_pass(model64, monkeypatch):
    """Memory: a contrastive example's gradient methods never run the answer's and the foil's
    graphs together (each pass is one continuation's, ``only=c``)."""
    scorer = SegmentScorer(model64, CONTRAST, TEMPLATE)
    seen = []
    original = scorer.steps_from_embeddings

    def recording(*embeddings, only=None):
        seen.append(only)
        return original(*embeddings, only=only)

    monkeypatch.setattr(scorer, "steps_from_embeddings", recording)
    for name, captum in (("ixg", "InputXGradient"), ("ig", "IntegratedGradients")):
        method = TokenGradients(name, captum)
        if captum == "IntegratedGradients":
            method = method.configure({"steps": "4", "internal_batch_size": "2"})
        method.attribute_segments(scorer)
        method.attribute_steps(scorer)
    assert seen and set(seen) == {0, 1}
