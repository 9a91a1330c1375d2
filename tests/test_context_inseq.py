"""``attrib-bench context --dataset`` on continuations Inseq attributed: the files in
tests/inseq_files were written by Inseq 0.7.1 itself (``make_steps.py`` there) on the tiny random
Llama and T5 of the segment kit, and ``expected_steps.json`` holds what Inseq's own loader reads
back from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from attrib_bench.api import context
from attrib_bench.core.errors import UsageError
from attrib_bench.segments.inseq import read_inseq_continuations
from attrib_bench.testing.segment_conformance import save_tiny_decoder, save_tiny_seq2seq

FILES = Path(__file__).parent / "inseq_files"
EXPECTED = json.loads((FILES / "expected_steps.json").read_text())
#: Per file, the tiny model Inseq attributed with.
KINDS = {"llama_steps.json": "llama", "t5_steps.json.gz": "t5"}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inseq-models")
    return {
        "llama": save_tiny_decoder(root / "llama", "llama"),
        "t5": save_tiny_seq2seq(root / "t5", "t5"),
    }


@pytest.mark.parametrize("name", list(KINDS))
def test_an_inseq_continuation_file_reads_as_inseq_reads_it(name, models):
    """Each sequence's prompt tokens, its steps over them and over the continuation's earlier
    tokens, as Inseq's loader returns them (summed over the hidden size: ``reduce="sum"``)."""
    tokenizer = AutoTokenizer.from_pretrained(models[KINDS[name]])
    examples, method = read_inseq_continuations(
        FILES / name, tokenizer, KINDS[name] == "t5", "tokens", None, reduce="sum"
    )
    assert method.name == name.split(".")[0]
    assert [e.id for e in examples] == ["0", "1"]
    for example, row in zip(examples, EXPECTED[name], strict=True):
        assert len(example.segments) == len(row["tokens"])
        prompt_TN, prefix_TP = method.steps[example.id]
        np.testing.assert_allclose(prompt_TN, row["steps"], rtol=1e-6, atol=1e-9)
        # Inseq's NaN where step t cannot read a_p (p >= t) reads as 0: row t zero from t on.
        inseq_TP = np.array(row["prefix_steps"], dtype=float)
        assert np.isnan(inseq_TP[np.triu_indices_from(inseq_TP)]).all()
        np.testing.assert_allclose(prefix_TP, np.nan_to_num(inseq_TP), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", list(KINDS))
def test_inseq_input_x_gradient_equals_ours_step_by_step(name, models):
    """Inseq attributed each step's log-probability with input x gradient: under the same
    definition (summed over the hidden size, each prompt token a segment) its imported rows
    equal the run's own ``input-x-gradient`` per step, over the prompt and the prefix, and the
    evaluators score both."""
    report = context(
        FILES / name,
        model=str(models[KINDS[name]]),
        split_by="tokens",
        methods=["input-x-gradient"],
        evaluators=["topk-drop"],
        per_step=True,
        reduce="sum",
        device="cpu",
    )
    imported = name.split(".")[0]
    assert report["methods"][imported]["status"] == "ok"
    assert report["methods"][imported]["per_step"]
    for record in report["examples"]:
        ours, theirs = record["steps"]["input-x-gradient"], record["steps"][imported]
        assert np.shape(theirs) == (len(record["answer_tokens"]), len(record["segments"]))
        np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(
            record["prefix_steps"][imported],
            record["prefix_steps"]["input-x-gradient"],
            rtol=1e-4,
            atol=1e-6,
        )
        np.testing.assert_allclose(record["scores"][imported], np.sum(theirs, axis=0))
        assert set(record["values"][imported]) == set(record["values"]["input-x-gradient"])


def test_a_file_of_the_other_model_kind_is_refused_in_one_line(models, run_cli):
    code, out, err = run_cli(
        "context", "--dataset", FILES / "llama_steps.json", "--model", models["t5"],
        "--split-by", "tokens", "--reduce", "sum", "--quiet",
    )  # fmt: skip
    assert code == 2 and not out
    (line,) = err.strip().splitlines()
    assert "llama_steps.json: sequence 0 ('the cat sat on the')" in line
    assert "a decoder-only model, but the model is an encoder-decoder one" in line


def test_a_file_of_another_tokenizer_is_refused_naming_the_tokens(models, tmp_path):
    """One prompt token's id changed: the file's tokens are not the tokenizer's."""
    saved = json.loads((FILES / "llama_steps.json").read_text())
    token = saved["attributes"]["sequence_attributions"][0]["attributes"]["target"][1]
    token["attributes"]["id"] += 1
    path = tmp_path / "other.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(UsageError, match=r"other.json: sequence 0 .*prompt tokens"):
        context(path, model=str(models["llama"]), split_by="tokens")


def test_an_inseq_file_brings_its_own_answers(models):
    with pytest.raises(UsageError, match="drop --generate"):
        context(FILES / "llama_steps.json", model=str(models["llama"]), generate=2)
