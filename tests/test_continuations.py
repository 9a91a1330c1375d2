"""Prompt/continuation data in ``attrib-bench context``: a next-token dataset generalised to a
continuation, explained token by token (``--split-by tokens``): each prompt token is a
segment, so every method's step x segment matrix is its step x prompt-token matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import save_tiny_decoder
from test_segments import _close, decoder64, write_jsonl

from attrib_bench.core.errors import UsageError
from attrib_bench.segments.data import RAW_TEMPLATE, load_segments, split_tokens
from attrib_bench.segments.scorer import SegmentScorer
from attrib_bench_plugins.segments import TokenGradients

PROMPT = "when mary and john went to the store, john gave a drink to"
RECORD = {"id": "ioi", "prompt": PROMPT, "continuation": " mary"}
__all__ = ["decoder64"]  # the fixture, shared with test_segments


@pytest.mark.parametrize("text", [PROMPT, "  two  spaces\n\nand lines \n", "x", "tail space "])
def test_token_pieces_join_back_and_own_a_token_each(decoder64, text):
    pieces = split_tokens(text, decoder64.tokenizer)
    assert "".join(pieces) == text
    assert all(piece.strip() for piece in pieces)
    tokens = decoder64.tokenizer(text, add_special_tokens=False)["input_ids"]
    blank = sum(not decoder64.tokenizer.decode([t]).strip() for t in tokens)
    assert len(pieces) == len(tokens) - blank  # white space joins a neighbour's piece


def test_a_prompt_record_is_its_prompt_cut_into_tokens(decoder64, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [RECORD])
    (example,), _ = load_segments(data, split_by="tokens", tokenizer=decoder64.tokenizer)
    assert example.raw and example.answer == " mary" and example.query == ""
    assert example.template("Context: {context}\n\nQuery: {query}") == RAW_TEMPLATE
    scorer = SegmentScorer(decoder64, example, example.template("ignored {context} {query}"))
    prompt_ids = decoder64.tokenizer(PROMPT)["input_ids"]
    assert scorer.prompt_ids == prompt_ids  # the prompt as it is: no template around it
    assert scorer.token_segments.tolist() == list(range(len(prompt_ids)))  # one token each


def test_per_step_input_x_gradient_is_the_step_x_token_autograd_matrix(decoder64, tmp_path):
    """With one segment per token, row t is x times the gradient of log p(c_t | prompt, c_<t)
    at each prompt token's embedding, from its own forward pass (float64)."""
    data = write_jsonl(tmp_path / "d.jsonl", [{**RECORD, "continuation": " mary gave"}])
    (example,), _ = load_segments(data, split_by="tokens", tokenizer=decoder64.tokenizer)
    scorer = SegmentScorer(decoder64, example, RAW_TEMPLATE)
    P, T = len(scorer.prompt_ids), len(scorer.answer_ids)
    ids = torch.tensor([scorer.ids()])
    expected = []
    for t in range(T):
        x = decoder64.model.get_input_embeddings()(ids).detach().requires_grad_()
        with decoder64.fast_attention():
            logits = decoder64.model(inputs_embeds=x).logits[0, P - 1 + t]
        log_p = torch.log_softmax(logits, -1)[scorer.answer_ids[t]]
        (grad,) = torch.autograd.grad(log_p, x)
        expected.append((grad * x)[0, :P].sum(-1).detach().numpy())
    steps = TokenGradients("input-x-gradient", "InputXGradient").attribute_steps(scorer)
    assert steps.segments_TS.shape == (T, P)
    _close(decoder64, steps.segments_TS, np.array(expected))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({**RECORD, "query": "q"}, "a 'prompt' record takes its prompt as it is"),
        ({"id": "x", "context": "a b"}, "a record needs a 'query' \\(or a 'prompt'\\)"),
        ({"id": "x", "query": "q"}, "a record needs 'segments' \\(a list\\), 'context' or"),
    ],
)
def test_bad_records_are_one_line(record, message, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [record])
    with pytest.raises(UsageError, match=f"d.jsonl line 1: {message}"):
        load_segments(data)


def test_cli_explains_a_continuation_token_by_token(run_cli, tmp_path):
    model = save_tiny_decoder(tmp_path / "gpt2", "gpt2")
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": "ioi", "prompt": PROMPT}])
    report, page = tmp_path / "report.json", tmp_path / "page.html"
    code, _, err = run_cli(
        "context", "--dataset", data, "--model", model, "--split-by", "tokens", "--quiet",
        "--generate", "2", "--per-step", "--output", report,
        "--methods", "leave-one-segment-out,input-x-gradient", "--token-methods", "saliency",
    )  # fmt: skip
    assert code == 0, err
    written = json.loads(report.read_text())
    (example,) = written["examples"]
    assert "".join(example["segments"]) == PROMPT
    S = len(example["segments"])
    assert all(np.shape(m) == (2, S) for m in example["steps"].values())
    code, _, err = run_cli("report", report, "--html", page)
    assert code == 0, err
    html = page.read_text()
    assert "<th> john</th>" in html and "<th>when</th>" in html  # token columns by name


def test_run_points_prompt_data_to_context(run_cli, tmp_path):
    model = save_tiny_decoder(tmp_path / "gpt2", "gpt2")
    data = write_jsonl(tmp_path / "d.jsonl", [RECORD])
    code, _, err = run_cli("run", "--model", model, "--dataset", data, "--limit", "1")
    assert code == 2  # the one line after the tiny model's save progress
    line = err.strip().splitlines()[-1]
    assert "holds prompts" in line and line.endswith("attrib-bench context --split-by tokens")
