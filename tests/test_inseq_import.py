"""``attrib-bench evaluate`` on attributions Inseq saved: the files in tests/inseq_files were
written by Inseq 0.7.1 itself (``make.py`` there) on the tiny random Llama of helpers.py, and
``expected.json`` holds what Inseq's own loader reads back from them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import save_tiny_decoder
from test_next_token_runs import ROWS, write_blimp_csv

from attrib_bench.core.errors import UsageError
from attrib_bench.runner.outside import detect_format, read_file

FILES = Path(__file__).parent / "inseq_files"
EXPECTED = json.loads((FILES / "expected.json").read_text())


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_tiny_decoder(tmp_path_factory.mktemp("llama") / "llama", "llama")


@pytest.fixture(scope="module")
def toy_rows(tmp_path_factory) -> Path:
    """The toy next-token rows whose first three prefixes the Inseq files explain."""
    return write_blimp_csv(tmp_path_factory.mktemp("rows") / "rows.csv")


def _evaluate(run_cli, model: Path, data: Path, path: Path, *extra: str) -> tuple[int, str]:
    code, _, err = run_cli(
        "evaluate", "--model", model, "--dataset", data, "--limit", "3", "--quiet",
        "--attributions", path, *extra,
    )  # fmt: skip
    return code, err


@pytest.mark.parametrize("name", ["granular.json", "aggregated.json.gz"])
def test_an_inseq_file_reads_as_inseq_reads_it(name):
    """The first generated token's scores over each prompt: the granular file's (T, D) rows by
    their L2 norm (``--reduce l2``), the aggregated file's as saved (gzip-compressed)."""
    path = FILES / name
    assert detect_format(path) == "inseq"
    (method,) = read_file(path, "inseq", [], None, "l2").values()
    assert method.by_text
    assert list(method.rows) == [row["text"] for row in EXPECTED[name]]
    for row in EXPECTED[name]:
        read = method.rows[row["text"]]
        assert read.tokens == row["tokens"]
        np.testing.assert_allclose(read.aggregated_LN[0], row["scores"], rtol=1e-6)
        assert read.aggregated_LN.shape == (1, len(row["tokens"]))


def test_evaluate_scores_an_inseq_file_as_the_same_scores_given_plainly(
    llama, toy_rows, run_cli, tmp_path
):
    """The same numbers as a generic JSONL holding the scores Inseq's loader reads."""
    generic = tmp_path / "generic.jsonl"
    generic.write_text(
        "".join(json.dumps(row) + "\n" for row in EXPECTED["granular.json"])
    )  # fmt: skip
    documents = {}
    for path in (FILES / "granular.json", generic):
        output = tmp_path / f"{path.stem}.json"
        code, err = _evaluate(run_cli, llama, toy_rows, path, "--output", output)
        assert code == 0, err
        documents[path.stem] = json.loads(output.read_text())
    inseq = documents["granular"]
    assert inseq["provenance"]["attributions"]["format"] == "inseq"
    assert inseq["provenance"]["attributions"]["reduce"] == "l2"
    assert set(inseq["evaluators"]) == {"comprehensiveness", "sufficiency"}
    assert (
        inseq["methods"]["granular"]["per_example"]
        == documents["generic"]["methods"]["generic"]["per_example"]
    )


def test_bad_inseq_files_fail_with_one_line(llama, toy_rows, tiny_bert, run_cli, tmp_path):
    def one_line(model: Path, data: Path, path: Path) -> str:
        code, err = _evaluate(run_cli, model, data, path)
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1, err
        return err

    err = one_line(llama, toy_rows, FILES / "attention.json")
    assert "scores of shape (6, 1, 2, 4) (layers and heads?)" in err and "out.aggregate()" in err

    other_word = [("the cat sat on the", "dog", "mat", "cat"), *ROWS[1:]]
    dog = write_blimp_csv(tmp_path / "dog.csv", other_word)
    err = one_line(llama, dog, FILES / "granular.json")
    assert "explains the token 'Ġmat' after it, but the data's next token is 'Ġdog'" in err

    code, _, err = run_cli(
        "evaluate", "--model", tiny_bert, "--dataset", "default", "--limit", "3", "--quiet",
        "--attributions", FILES / "granular.json",
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "score it on a causal language model" in err

    saved = json.loads((FILES / "granular.json").read_text())
    del saved["attributes"]["sequence_attributions"][0]
    del saved["attributes"]["info"]["input_texts"][0]
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps(saved, indent=4, sort_keys=True))
    err = one_line(llama, toy_rows, fewer)
    assert "example 'toy_agreement-0': no attributions (by text)" in err

    not_inseq = tmp_path / "other.json.gz"
    not_inseq.write_bytes(gzip.compress(b'{"a": 1}'))
    assert "a gzip file, but not one Inseq saved" in one_line(llama, toy_rows, not_inseq)


def test_inseq_default_aggregation_is_the_l2_rows_normalised():
    """Inseq aggregates a granular step by the L2 norm over the hidden size, then divides by the
    step's sum: so the aggregated file's rows, read, are the granular file's divided by theirs,
    and ``--reduce l2`` ranks tokens as Inseq's own aggregation does."""
    (granular,) = read_file(FILES / "granular.json", "inseq", [], None, "l2").values()
    (aggregated,) = read_file(FILES / "aggregated.json.gz", "inseq", [], None, "l2").values()
    for text, rows in granular.rows.items():
        l2 = rows.aggregated_LN[0]
        np.testing.assert_allclose(aggregated.rows[text].aggregated_LN[0], l2 / l2.sum(), rtol=1e-5)


def test_an_encoder_decoder_file_is_pointed_to_context():
    """Inseq's T5 file (tests/inseq_files/make_steps.py) has source attributions: next-token
    evaluation cannot score them, and the refusal names the command that does."""
    refusal = r"prompt 'the cat sat on the': .*score them with attrib-bench context"
    with pytest.raises(UsageError, match=refusal):
        read_file(FILES / "t5_steps.json.gz", "inseq", [], None, "l2")
