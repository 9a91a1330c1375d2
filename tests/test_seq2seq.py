"""Encoder-decoder models (T5, BART, Marian) in context attribution: the prompt is the
encoder's input and the answer the decoder's. Tiny random float64 models (no seq2seq weights
ship offline), against the models' own loss path and against running the encoder alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES
from test_segments import EXAMPLE, TEMPLATE, write_jsonl

from attrib_bench.model.load import load_model
from attrib_bench.segments.scorer import SegmentScorer
from attrib_bench.testing.segment_conformance import SEQ2SEQ_FAMILIES, save_tiny_seq2seq
from attrib_bench_plugins.segments import LeaveOneSegmentOut, TokenGradients


@pytest.fixture(scope="module", params=SEQ2SEQ_FAMILIES)
def seq2seq64(request, tmp_path_factory):
    directory = save_tiny_seq2seq(tmp_path_factory.mktemp(request.param), request.param)
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    assert loaded.is_seq2seq and not loaded.is_language_model
    loaded.model.double()
    return loaded


def _own_log_probs(loaded, prompt_ids, answer_ids, encoder_outputs=None) -> torch.Tensor:
    """The answer's per-step log-probabilities through the model's own ``labels`` path (it
    shifts the labels into the decoder's input itself)."""
    labels = torch.tensor([answer_ids])
    inputs = {"encoder_outputs": encoder_outputs} if encoder_outputs else {}
    if not inputs:
        inputs["input_ids"] = torch.tensor([prompt_ids])
    logits = loaded.model(**inputs, labels=labels).logits[0]
    return torch.log_softmax(logits, -1)[torch.arange(len(answer_ids)), labels[0]]


def _close(loaded, actual, expected) -> None:
    """Float64 agreement; T5's layer norm takes its variance in float32 even in float64."""
    t5 = loaded.model.config.model_type == "t5"
    atol = 1e-6 * np.abs(expected).max() if t5 else 1e-12
    np.testing.assert_allclose(actual, expected, rtol=0 if t5 else 1e-8, atol=atol)


def test_answer_log_probs_are_the_models_own(seq2seq64):
    scorer = SegmentScorer(seq2seq64, EXAMPLE, TEMPLATE)
    assert scorer.ids() == scorer.prompt_ids  # the encoder's input: the answer is not in it
    with torch.no_grad():
        expected = _own_log_probs(seq2seq64, scorer.prompt_ids, scorer.answer_ids).numpy()
    _close(seq2seq64, scorer.steps(np.ones((1, 4), dtype=bool))[0], expected)


def test_leave_one_out_is_the_drop_without_each_segment(seq2seq64):
    scorer = SegmentScorer(seq2seq64, EXAMPLE, TEMPLATE)
    masks = ~np.eye(4, dtype=bool)
    with torch.no_grad():
        full = _own_log_probs(seq2seq64, scorer.prompt_ids, scorer.answer_ids).sum().item()
        without = [
            _own_log_probs(seq2seq64, scorer.ids(m.tolist()), scorer.answer_ids).sum().item()
            for m in masks
        ]
    _close(seq2seq64, LeaveOneSegmentOut().attribute_segments(scorer), full - np.array(without))


def test_source_gradients_equal_running_the_encoder_alone(seq2seq64):
    """Row t of input x gradient: the source embeddings through the encoder run alone, its
    output into the decoder, autograd of log p(a_t); summed per segment."""
    scorer = SegmentScorer(seq2seq64, EXAMPLE, TEMPLATE)
    ids = torch.tensor([scorer.prompt_ids])
    owner = scorer.token_segments
    expected = []
    for t in range(len(scorer.answer_ids)):
        embeddings = seq2seq64.model.get_input_embeddings()(ids).detach().requires_grad_()
        with seq2seq64.fast_attention():
            encoded = seq2seq64.model.get_encoder()(inputs_embeds=embeddings)
            log_p = _own_log_probs(seq2seq64, None, scorer.answer_ids, encoded)[t]
        (grad,) = torch.autograd.grad(log_p, embeddings)
        tokens = (grad * embeddings)[0].sum(-1).detach().numpy()
        expected.append([tokens[owner == s].sum() for s in range(4)])
    method = TokenGradients("input-x-gradient", "InputXGradient")
    steps_TS = method.attribute_steps(scorer)
    _close(seq2seq64, steps_TS, np.array(expected))
    _close(seq2seq64, steps_TS.sum(0), method.attribute_segments(scorer))


def test_context_runs_a_seq2seq_model_and_run_refuses_it(run_cli, tmp_path):
    model = save_tiny_seq2seq(tmp_path / "t5", "t5")
    record = {"id": "a", "segments": list(EXAMPLE.segments), "query": "who sat?"}
    data = write_jsonl(tmp_path / "ok.jsonl", [record])
    report = tmp_path / "report.json"
    code, _, err = run_cli(
        "context", "--dataset", data, "--model", model, "--template", TEMPLATE, "--quiet",
        "--generate", "2", "--per-step", "--output", report,
        "--methods", "leave-one-segment-out,input-x-gradient,context-cite",
    )  # fmt: skip
    assert code == 0, err
    written = json.loads(report.read_text())
    (example,) = written["examples"]
    assert len(example["answer_tokens"]) == 2
    assert all(row["status"] == "ok" for row in written["methods"].values())
    assert np.shape(example["steps"]["input-x-gradient"]) == (2, 4)

    code, _, err = run_cli("run", "--model", model, "--dataset", "default", "--limit", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "is an encoder-decoder language model" in err and "attrib-bench context" in err
