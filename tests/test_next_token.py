"""Next-token data (BLiMP and IOI minimal pairs with evidence words) and the ``mrr`` evaluator.

The real files are read where they are (``../shared/data/blimp_targets``), never copied here.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA
from scipy import stats

from attrib_bench.core.errors import UsageError
from attrib_bench.core.interfaces import Attribution, Batch, EvalContext, Example
from attrib_bench.core.trace import Trace
from attrib_bench.data.load import load_examples
from attrib_bench.data.next_token import (
    NextTokens,
    NextWords,
    evidence_index,
    next_token_ids,
    token_pairs,
)
from attrib_bench.testing import check_evaluator
from attrib_bench_plugins.next_token import Mrr

BLIMP = SHARED_DATA / "blimp_targets" / "blimp"
IOI = SHARED_DATA / "blimp_targets" / "ioi" / "ioi_dataset.csv"
#: Rows per BLiMP file whose evidence word is missing from the prefix (written NA).
UNMATCHED = {
    "anaphor_gender_agreement": 21,
    "anaphor_number_agreement": 9,
    "distractor_agreement_relational_noun": 30,
    "irregular_plural_subject_verb_agreement_1": 15,
    "regular_plural_subject_verb_agreement_1": 18,
}
needs_data = pytest.mark.skipif(not BLIMP.is_dir(), reason="../shared/data/blimp_targets absent")


def _write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _row(prefix: str, target: str, good: str = "x", bad: str = "y") -> dict[str, str]:
    return {
        "one_prefix_prefix": prefix,
        "one_prefix_word_good": good,
        "one_prefix_word_bad": bad,
        "target": target,
    }


@needs_data
def test_the_blimp_folder_loads_every_paradigm_with_one_evidence_word_each(capsys):
    data = load_examples(str(BLIMP))
    files = sorted(p.stem for p in BLIMP.glob("*.csv"))
    assert len(files) == 11 and data.split == "all"
    assert data.next_tokens.unmatched == sum(UNMATCHED.values()) == 93
    assert len(data.examples) == 11 * 1000 - 93
    per_paradigm = {f: 0 for f in files}
    for example in data.examples:
        words = data.next_tokens.words[example.id]
        per_paradigm[words.paradigm] += 1
        assert example.id.startswith(f"{words.paradigm}-")
        assert example.label is None and example.text == example.text.strip()
        assert len(example.rationale) == len(example.text.split())
        assert sum(example.rationale) == 1
        assert words.good and words.bad and words.good != words.bad
    assert per_paradigm == {f: 1000 - UNMATCHED.get(f, 0) for f in files}
    warnings = capsys.readouterr().err
    for name, count in UNMATCHED.items():
        assert f"{name}.csv: {count} of 1000 rows dropped" in warnings


@needs_data
def test_the_marked_word_is_the_files_target():
    data = load_examples(str(BLIMP / "determiner_noun_agreement_1.csv"))
    with (BLIMP / "determiner_noun_agreement_1.csv").open(newline="") as handle:
        rows = {f"determiner_noun_agreement_1-{r['pairID']}": r for r in csv.DictReader(handle)}
    for example in data.examples:
        marked = example.text.split()[example.rationale.index(1)]
        assert marked.strip(".,") == rows[example.id]["target"]
        assert data.next_tokens.words[example.id].good == rows[example.id]["one_prefix_word_good"]


@needs_data
def test_a_split_is_one_paradigm_of_the_folder():
    data = load_examples(str(BLIMP), split="anaphor_gender_agreement", limit=5)
    assert [e.id for e in data.examples] == [f"anaphor_gender_agreement-{i}" for i in range(5)]
    assert set(data.next_tokens.words) == {e.id for e in data.examples}
    with pytest.raises(UsageError, match="valid choices: all, anaphor_gender_agreement, "):
        load_examples(str(BLIMP), split="no-such-paradigm")


@needs_data
def test_the_ioi_file_loads_with_the_indirect_object_as_evidence():
    data = load_examples(str(IOI))
    assert len(data.examples) == 1000 and data.next_tokens.unmatched == 0
    assert data.text_column == "one_prefix_prefix" and data.label_column is None
    first = data.examples[0]
    assert first.id == "ioi_dataset-0"
    assert first.text == "Friends Juana and Kristi found a mango at the bar. Kristi gave it to"
    assert data.next_tokens.words[first.id] == NextWords("Juana", "Kristi", "ioi_dataset")
    for example in data.examples:  # the evidence is the indirect object, the correct next word
        marked = example.text.split()[example.rationale.index(1)]
        assert marked.strip(",.") == data.next_tokens.words[example.id].good


@needs_data
@pytest.mark.parametrize("column", ["target", "one_prefix_word_bad"])
def test_a_missing_column_names_it_and_the_file(column, tmp_path):
    with (BLIMP / "npi_present_1.csv").open(newline="") as handle:
        rows = [{k: v for k, v in r.items() if k != column} for r in csv.DictReader(handle)][:3]
    path = _write_csv(tmp_path / "npi.csv", rows)
    with pytest.raises(UsageError) as error:
        load_examples(str(path))
    message = str(error.value)
    assert f"{str(path)!r} lacks the column {column};" in message and "\n" not in message


def test_a_folder_with_a_csv_that_is_not_next_token_data_names_that_file(tmp_path):
    _write_csv(tmp_path / "a.csv", [_row("the dog", "dog")])
    _write_csv(tmp_path / "b.csv", [{"sentence": "hello", "label": "1"}])
    with pytest.raises(UsageError, match=r"'.*b\.csv' lacks the columns one_prefix_prefix, "):
        load_examples(str(tmp_path))


def test_a_next_token_csv_that_is_not_utf8_is_refused(tmp_path):
    _write_csv(tmp_path / "a.csv", [_row("the dog", "dog")])
    (tmp_path / "b.csv").write_bytes(b"one_prefix_prefix,target\n\xff\xfe,\xff\n")
    with pytest.raises(UsageError, match=r"b\.csv' is not a readable CSV"):
        load_examples(str(tmp_path))


def test_an_empty_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="holds no data file"):
        load_examples(str(tmp_path))


def test_a_file_whose_every_evidence_word_is_missing_has_no_examples(tmp_path):
    path = _write_csv(tmp_path / "p.csv", [_row("the dog", "NA"), _row("a cat", "")])
    with pytest.raises(UsageError, match="has no examples"):
        load_examples(str(path))


def test_a_limit_reads_and_warns_about_only_the_files_it_needs(tmp_path, capsys):
    _write_csv(tmp_path / "a.csv", [_row("a dog", "NA"), _row("the dog", "dog"), _row("x", "x")])
    _write_csv(tmp_path / "b.csv", [_row("a cat", "NA"), _row("the cat", "cat")])
    data = load_examples(str(tmp_path), limit=1)
    warnings = capsys.readouterr().err
    assert [e.id for e in data.examples] == ["a-1"] and data.next_tokens.unmatched == 1
    assert "a.csv: 1 of the 2 rows read (--limit) dropped" in warnings
    assert "b.csv" not in warnings
    data = load_examples(str(tmp_path))
    warnings = capsys.readouterr().err
    assert len(data.examples) == 3 and data.next_tokens.unmatched == 2
    assert "a.csv: 1 of 3 rows dropped" in warnings and "b.csv: 1 of 2 rows dropped" in warnings


def test_evidence_matching_strips_punctuation_prefers_case_and_takes_the_last():
    words = ["The", "dog,", "said", "the", "Dog."]
    assert evidence_index(words, "dog") == 1  # "dog," stripped; "Dog." only matches by case
    assert evidence_index(words, "the") == 3  # exact case beats "The"
    assert evidence_index(words, "THE") == 3  # no exact match: the last case-insensitive one
    assert evidence_index(words, "Dog") == 4
    assert evidence_index(words, "cat") is None
    assert evidence_index(words, "NA") is None
    assert evidence_index(words, ",") is None  # nothing left after stripping


def test_ids_use_the_pair_id_and_the_paradigm_when_given(tmp_path):
    rows = [
        {**_row("the dog", "dog"), "UID": "agreement", "pairID": "7"},
        {**_row("a cat", "cat"), "UID": "", "pairID": ""},
    ]
    data = load_examples(str(_write_csv(tmp_path / "mine.csv", rows)))
    assert [e.id for e in data.examples] == ["agreement-7", "mine-1"]
    assert [w.paradigm for w in data.next_tokens.words.values()] == ["agreement", "mine"]


def test_the_fingerprint_follows_the_content_not_the_path(tmp_path):
    rows = [_row("the dog", "dog"), _row("a cat", "cat")]
    first = load_examples(str(_write_csv(tmp_path / "a.csv", rows)))
    (tmp_path / "elsewhere").mkdir()
    moved = load_examples(str(_write_csv(tmp_path / "elsewhere" / "a.csv", rows)))
    changed = load_examples(str(_write_csv(tmp_path / "c.csv", [rows[0], _row("a cat", "a")])))
    assert first.fingerprint == moved.fingerprint != changed.fingerprint
    assert load_examples(str(tmp_path / "a.csv"), limit=1).fingerprint != first.fingerprint


@pytest.fixture(scope="module")
def minilm_tokenizer(minilm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm)


def test_next_token_ids_are_the_first_piece_without_special_tokens(minilm_tokenizer):
    good, bad = next_token_ids(minilm_tokenizer, "herself", "himself")
    assert minilm_tokenizer.convert_ids_to_tokens([good, bad]) == ["herself", "himself"]
    multi = next_token_ids(minilm_tokenizer, "unbelievably", "grocery stores")
    assert minilm_tokenizer.convert_ids_to_tokens(list(multi)) == ["un", "grocery"]  # first pieces
    assert next_token_ids(minilm_tokenizer, "grocery store", "grocery stores") is None


def test_token_pairs_drop_the_words_that_share_their_first_token(minilm_tokenizer):
    words = {
        "a": NextWords("herself", "himself", "p"),
        "b": NextWords("grocery store", "grocery stores", "p"),
    }
    pairs, shared = token_pairs(minilm_tokenizer, NextTokens(words, 0))
    assert set(pairs) == {"a"} and shared == ["b"]
    assert pairs["a"] == next_token_ids(minilm_tokenizer, "herself", "himself")


def _context(examples: list[Example], word_ids: list[list[int]]) -> EvalContext:
    """A hand-made batch: the evaluator reads only the examples, the mask and the word ids."""
    word_ids_BN = torch.tensor(word_ids)
    mask_BN = (word_ids_BN >= 0).long()
    batch = Batch(
        examples=examples,
        input_ids_BN=torch.zeros_like(word_ids_BN),
        attention_mask_BN=mask_BN,
        token_type_ids_BN=None,
        special_tokens_mask_BN=torch.zeros_like(mask_BN),
        tokens=[[] for _ in examples],
        word_ids_BN=word_ids_BN,
    )
    trace = Trace(batch=batch, loaded=None, logits_BC=torch.zeros(len(examples), 2))
    return EvalContext(trace=trace, reference=None, seed=0)


def test_mrr_by_hand():
    examples = [
        # words a b c d; b has two pieces: its sum 0.6 beats the evidence c (0.5), its max not
        Example("sum", "a b c d", rationale=(0, 0, 1, 0)),
        # one word ties the evidence: ranked pessimistically, 2nd (the average would say 1.5)
        Example("tie", "x y z", rationale=(1, 0, 0)),
        Example("none", "p q"),  # no rationale: undefined
        # two evidence words: the better ranked one counts (3rd)
        Example("two", "e f g h", rationale=(1, 0, 0, 1)),
    ]
    word_ids = [[0, 1, 1, 2, 3], [0, 1, 2, -1, -1], [0, 1, -1, -1, -1], [0, 1, 2, 3, -1]]
    aggregated_BLN = torch.tensor(
        [
            [[0.1, 0.3, 0.3, 0.5, 0.2], [0.1, 0.3, 0.3, 0.9, 0.2]],
            [[0.4, 0.4, 0.1, 0.0, 0.0], [0.4, 0.5, 0.6, 0.0, 0.0]],
            [[0.4, 0.4, 0.0, 0.0, 0.0], [0.4, 0.5, 0.0, 0.0, 0.0]],
            [[0.1, 0.9, 0.8, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]],
        ]
    )
    local_BLN = aggregated_BLN[:, :1].flip(-1) * (torch.tensor(word_ids)[:, None] >= 0)
    attribution = Attribution(aggregated_BLN=aggregated_BLN, local_BLN=local_BLN)
    scores = Mrr().score(attribution, _context(examples, word_ids))
    expected = np.array([[1 / 2, 1 / 2, math.nan, 1 / 3], [1, 1 / 3, math.nan, 1 / 3]])
    np.testing.assert_allclose(scores["aggregated"], expected)
    # local (layer 1 reversed): sum: b = 0.8 > c = 0.3; tie: x = y = 0 < z; two: h = 0.9 first
    np.testing.assert_allclose(scores["local"], [[1 / 2, 1 / 3, math.nan, 1]])


def notebook_mrr(scores_N: np.ndarray, evidence_N: np.ndarray) -> float:
    """Ferrando et al.'s rule as their notebook writes it: ranks n - rankdata(dense) + 1 over
    the prefix tokens, the best-ranked evidence token's reciprocal."""
    ranks = len(scores_N) - stats.rankdata(scores_N, "dense") + 1
    return 1 / min(ranks[i] for i in np.flatnonzero(evidence_N))


def test_token_dense_mrr_is_the_published_notebooks():
    """Tokens ranked alone (the evidence word's best piece counts) with the notebook's dense
    rule, whose ties lift the top rank above 1: checked against it, and against numbers."""
    examples = [
        Example("pieces", "a b c d", rationale=(0, 1, 0, 0)),  # b has two pieces
        Example("ties", "x y z", rationale=(0, 0, 1)),
        Example("special", "p q", rationale=(1, 0)),  # -1: a special token, never ranked
    ]
    word_ids = [[0, 1, 1, 2, 3], [0, 1, 2, -1, -1], [-1, 0, 1, -1, -1]]
    rows_BLN = torch.tensor(
        [
            [[0.1, 0.2, 0.7, 0.5, 0.3]],
            [[0.4, 0.4, 0.1, 0.0, 0.0]],
            [[9.0, 0.3, 0.5, 0.0, 0.0]],
        ]
    )
    mrr = Mrr().configure({"unit": "token", "rank": "dense"})
    got = mrr.score(Attribution(aggregated_BLN=rows_BLN), _context(examples, word_ids))
    # pieces: b's second piece (0.7) is the top token; ties: 0.4, 0.4, 0.1 have dense ranks
    # 2, 2, 1 of n = 3, so z ranks 3 - 1 + 1 = 3; special: p (0.3) is below q (0.5), rank 2
    np.testing.assert_allclose(got["aggregated"], [[1.0, 1 / 3, 1 / 2]])
    for b, example in enumerate(examples):
        ids = np.array(word_ids[b])
        inside = ids >= 0
        evidence = np.array(example.rationale, dtype=bool)[ids[inside]]
        expected = notebook_mrr(rows_BLN[b, 0].numpy()[inside], evidence)
        assert got["aggregated"][0, b] == pytest.approx(expected)
    # The word-level default on the same rows: b = 0.2 + 0.7 ranks first too, z last of three.
    words = Mrr().score(Attribution(aggregated_BLN=rows_BLN), _context(examples, word_ids))
    np.testing.assert_allclose(words["aggregated"], [[1.0, 1 / 3, 1 / 2]])
    # Where the rules part: ties. Pessimistic ranks the evidence second (one other at 0.5);
    # dense gives 0.5 the dense rank 2 of n = 4 tokens, so rank 4 - 2 + 1 = 3.
    tied = Attribution(aggregated_BLN=torch.tensor([[[0.5, 0.5, 0.1, 0.1]]]))
    context = _context([Example("t", "u v w x", rationale=(1, 0, 0, 0))], [[0, 1, 2, 3]])
    assert Mrr().score(tied, context)["aggregated"][0, 0] == pytest.approx(1 / 2)
    assert mrr.score(tied, context)["aggregated"][0, 0] == pytest.approx(1 / 3)


def test_mrr_without_a_local_row_scores_the_aggregated_ones_only():
    examples = [Example("only", "a b", rationale=(0, 1))]
    attribution = Attribution(aggregated_BLN=torch.tensor([[[0.2, 0.1]]]))
    scores = Mrr().score(attribution, _context(examples, [[0, 1]]))
    assert set(scores) == {"aggregated"}
    np.testing.assert_allclose(scores["aggregated"], [[1 / 2]])


def test_mrr_of_a_constant_row_is_the_worst_rank():
    examples = [Example("flat", "a b c d", rationale=(0, 1, 0, 0))]
    attribution = Attribution(aggregated_BLN=torch.zeros(1, 1, 4))
    scores = Mrr().score(attribution, _context(examples, [[0, 1, 2, 3]]))
    np.testing.assert_allclose(scores["aggregated"], [[1 / 4]])


def test_mrr_without_rationales_fails_for_every_method():
    attribution = Attribution(aggregated_BLN=torch.ones(1, 1, 2))
    with pytest.raises(UsageError, match="needs an evidence word"):
        Mrr().score(attribution, _context([Example("x", "a b")], [[0, 1]]))


def test_mrr_conforms():
    report = check_evaluator(Mrr())
    assert report.shapes["bert"]["aggregated"][0] == 3  # every layer of the kit's method


def test_mrr_is_registered():
    from attrib_bench.core.registry import load_registry

    registry = load_registry()
    assert "mrr" in registry.evaluators
    assert "mrr" not in registry.defaults("evaluators")  # opt-in, like plausibility
