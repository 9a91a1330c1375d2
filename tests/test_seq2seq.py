"""Encoder-decoder models (T5, BART, Marian) in context attribution: the prompt is the
encoder's input and the answer the decoder's. Tiny random float64 models (no seq2seq weights
ship offline), against the models' own loss path and against running the encoder alone."""

from __future__ import annotations

import json
from dataclasses import replace

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


def test_embedded_inputs_are_what_the_model_embeds_itself(seq2seq64):
    """Marian scales its embeddings inside each stack (``embed_scale``), which
    ``inputs_embeds`` skips: the gradient methods' inputs must carry the scale."""
    scorer = SegmentScorer(seq2seq64, EXAMPLE, TEMPLATE)
    source, target = scorer.embedded()
    labels = torch.tensor([scorer.answer_ids])
    with torch.no_grad():
        own = seq2seq64.model(input_ids=torch.tensor([scorer.prompt_ids]), labels=labels).logits
        ours = seq2seq64.model(inputs_embeds=source, decoder_inputs_embeds=target).logits
    np.testing.assert_allclose(ours.numpy(), own.numpy(), rtol=0, atol=1e-12)


def test_gradients_equal_running_the_encoder_alone(seq2seq64):
    """Row t of input x gradient: the source embeddings through the encoder run alone, its
    output and the decoder's input embeddings into the decoder, autograd of log p(a_t); summed
    per segment, and over the decoder's input tokens a_0..a_{T-2} (the prefix, kept apart)."""
    example = replace(EXAMPLE, answer=" the cat sat")
    scorer = SegmentScorer(seq2seq64, example, TEMPLATE)
    T = len(scorer.answer_ids)
    owner = scorer.token_segments
    expected, prefix = [], []
    for t in range(T):
        source, target = (x.clone().requires_grad_() for x in scorer.embedded())
        with seq2seq64.fast_attention():
            encoded = seq2seq64.model.get_encoder()(inputs_embeds=source)
            logits = seq2seq64.model(encoder_outputs=encoded, decoder_inputs_embeds=target).logits
        log_p = torch.log_softmax(logits[0, t], -1)[scorer.answer_ids[t]]
        grads = torch.autograd.grad(log_p, (source, target))
        tokens = [
            (g * x)[0].sum(-1).detach().numpy()
            for g, x in zip(grads, (source, target), strict=True)
        ]
        expected.append([tokens[0][owner == s].sum() for s in range(4)])
        prefix.append(tokens[1][1:T])
    method = TokenGradients("input-x-gradient", "InputXGradient")
    steps = method.attribute_steps(scorer)
    _close(seq2seq64, steps.segments_TS, np.array(expected))
    _close(seq2seq64, steps.prefix_TP, np.array(prefix))
    assert (steps.prefix_TP[np.triu_indices(T, 0, T - 1)] == 0).all()  # never a later token
    _close(seq2seq64, steps.segments_TS.sum(0), method.attribute_segments(scorer))


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
    assert np.shape(example["prefix_steps"]["input-x-gradient"]) == (2, 1)

    code, _, err = run_cli("run", "--model", model, "--dataset", "default", "--limit", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "is an encoder-decoder language model" in err and "attrib-bench context" in err


def test_hub_configs_of_seq2seq_models_are_recognised():
    """Hub configs name older classes (t5-small: ``T5WithLMHeadModel``); a classifier head
    on an encoder-decoder model stays a classifier, and an encoder is none."""
    from transformers import BartConfig, BertConfig, MarianConfig, T5Config

    from attrib_bench.model.load import is_seq2seq_lm

    assert is_seq2seq_lm(T5Config(architectures=["T5WithLMHeadModel"]))
    assert is_seq2seq_lm(BartConfig(architectures=["BartModel"]))
    assert is_seq2seq_lm(MarianConfig(architectures=["MarianMTModel"]))
    assert not is_seq2seq_lm(BartConfig(architectures=["BartForSequenceClassification"]))
    assert not is_seq2seq_lm(BertConfig(architectures=["BertForMaskedLM"]))
