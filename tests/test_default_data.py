"""Tests for the embedded synthetic sentiment dataset (attrib_bench.data.default)."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attrib_bench.data.default import (
    _ADJECTIVES,
    _COLORS,
    _CONTEXT_PHRASES,
    _DOMAINS,
    _INTENSIFIERS,
    _NEGATORS,
    _NOUNS,
    _TEMPLATES,
    _TIME_PHRASES,
    _VERBS,
    DEFAULT_SEED,
    DEFAULT_SIZE,
    dataset_fingerprint,
    generate_default_dataset,
)

MODULE_FILE = Path(__file__).resolve().parents[1] / "src" / "attrib_bench" / "data" / "default.py"

POSITIVE_WORDS = set(_ADJECTIVES[1]) | set(_NOUNS[1]) | {w for pair in _VERBS[1] for w in pair}
NEGATIVE_WORDS = set(_ADJECTIVES[0]) | set(_NOUNS[0]) | {w for pair in _VERBS[0] for w in pair}
DISTRACTOR_WORDS = (
    {w for phrase in _TIME_PHRASES + _CONTEXT_PHRASES for w in phrase.split()}
    | {w for domain in _DOMAINS for phrase in domain.postmodifiers for w in phrase.split()}
    | {w for domain in _DOMAINS for w in domain.subjects}
    | set(_COLORS)
)


@pytest.fixture(scope="module")
def dataset() -> dict[str, list[dict]]:
    return generate_default_dataset()


@pytest.fixture(scope="module")
def records(dataset: dict[str, list[dict]]) -> list[dict]:
    return dataset["train"] + dataset["test"]


def deciding_clause_start(words: list[str]) -> int:
    """Index of the first word of the clause that decides the label."""
    return len(words) - words[::-1].index("but") if "but" in words else 0


def single_clause(records: list[dict]) -> list[dict]:
    return [r for r in records if "but" not in r["sentence"].split()]


def test_defaults() -> None:
    assert DEFAULT_SEED == 0
    assert DEFAULT_SIZE == 3000
    assert len(_TEMPLATES) >= 15


def test_default_split_sizes(dataset: dict[str, list[dict]]) -> None:
    assert set(dataset) == {"train", "test"}
    assert len(dataset["train"]) == 2400
    assert len(dataset["test"]) == 600


@pytest.mark.parametrize(
    ("size", "test_fraction", "n_train", "n_test"),
    [(100, 0.3, 70, 30), (50, 0.0, 50, 0), (10, 0.2, 8, 2)],
)
def test_custom_sizes(size: int, test_fraction: float, n_train: int, n_test: int) -> None:
    data = generate_default_dataset(seed=3, size=size, test_fraction=test_fraction)
    assert len(data["train"]) == n_train
    assert len(data["test"]) == n_test


@pytest.mark.parametrize(("size", "test_fraction"), [(0, 0.2), (10, 1.0), (10, -0.1)])
def test_invalid_arguments(size: int, test_fraction: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        generate_default_dataset(size=size, test_fraction=test_fraction)


def test_record_schema_and_ids(dataset: dict[str, list[dict]]) -> None:
    for split, split_records in dataset.items():
        for k, record in enumerate(split_records):
            assert set(record) == {"id", "sentence", "label", "rationale"}
            assert record["id"] == f"default-{split}-{k}"
            assert isinstance(record["sentence"], str)
            assert type(record["label"]) is int
            assert record["label"] in (0, 1)
            assert all(type(flag) is int and flag in (0, 1) for flag in record["rationale"])


def test_deterministic_within_process(dataset: dict[str, list[dict]]) -> None:
    assert generate_default_dataset() == dataset
    assert generate_default_dataset(seed=7, size=200) == generate_default_dataset(seed=7, size=200)


def test_deterministic_across_processes() -> None:
    # Load the module file alone: the fresh process then skips the package's heavy imports.
    code = (
        "import importlib.util, sys; "
        "spec = importlib.util.spec_from_file_location('default_data', sys.argv[1]); "
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
        "print(module.dataset_fingerprint())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    result = subprocess.run(
        [sys.executable, "-c", code, str(MODULE_FILE)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == dataset_fingerprint()


def test_different_seeds_differ(dataset: dict[str, list[dict]]) -> None:
    other = generate_default_dataset(seed=1)
    sentences = {r["sentence"] for r in dataset["train"]}
    other_sentences = {r["sentence"] for r in other["train"]}
    assert len(sentences & other_sentences) < len(sentences) // 2
    assert dataset_fingerprint(seed=1) != dataset_fingerprint()


def test_fingerprint_is_sha256_of_sorted_json(dataset: dict[str, list[dict]]) -> None:
    expected = hashlib.sha256(json.dumps(dataset, sort_keys=True).encode("utf-8")).hexdigest()
    assert dataset_fingerprint() == expected
    assert re.fullmatch(r"[0-9a-f]{64}", expected)
    assert dataset_fingerprint(size=100) != expected


def test_sentences_unique_and_no_overlap(dataset: dict[str, list[dict]]) -> None:
    train = [r["sentence"] for r in dataset["train"]]
    test = [r["sentence"] for r in dataset["test"]]
    assert len(set(train)) == len(train)
    assert len(set(test)) == len(test)
    assert not set(train) & set(test)


def test_labels_balanced(dataset: dict[str, list[dict]], records: list[dict]) -> None:
    assert sum(r["label"] for r in records) == len(records) // 2
    for split_records in dataset.values():
        share = sum(r["label"] for r in split_records) / len(split_records)
        assert 0.4 <= share <= 0.6


def test_sentence_format(records: list[dict]) -> None:
    for record in records:
        sentence = record["sentence"]
        words = sentence.split()
        assert sentence == " ".join(words)
        assert sentence == sentence.lower()
        assert 5 <= len(words) <= 25
        assert words[-1] == "."
        assert all(w in {",", "."} or re.fullmatch(r"[a-z]+", w) for w in words)


def test_rationale_aligned_and_non_empty(records: list[dict]) -> None:
    for record in records:
        assert len(record["rationale"]) == len(record["sentence"].split())
        assert sum(record["rationale"]) >= 1


def test_vocabularies_disjoint() -> None:
    sentiment = POSITIVE_WORDS | NEGATIVE_WORDS
    assert not POSITIVE_WORDS & NEGATIVE_WORDS
    assert not sentiment & DISTRACTOR_WORDS
    assert not sentiment & set(_INTENSIFIERS)
    assert not (sentiment | DISTRACTOR_WORDS | set(_INTENSIFIERS)) & (set(_NEGATORS) | {"but"})


def test_label_and_rationale_follow_the_deciding_clause(records: list[dict]) -> None:
    """Recompute label and rationale from the words: last clause's polarity XOR negation."""
    for record in records:
        words = record["sentence"].split()
        start = deciding_clause_start(words)
        clause = words[start:]
        polarities = {w in POSITIVE_WORDS for w in clause if w in POSITIVE_WORDS | NEGATIVE_WORDS}
        assert len(polarities) == 1, record
        negated = sum(w in _NEGATORS for w in clause)
        assert negated <= 1, record
        assert record["label"] == int(polarities.pop() != bool(negated)), record
        expected = [
            int(i >= start and (w in POSITIVE_WORDS | NEGATIVE_WORDS or w in _NEGATORS))
            for i, w in enumerate(words)
        ]
        assert record["rationale"] == expected, record


def test_negated_sentences_mark_their_negator(records: list[dict]) -> None:
    negated = 0
    for record in records:
        words = record["sentence"].split()
        start = deciding_clause_start(words)
        for i, word in enumerate(words[start:], start):
            if word in _NEGATORS:
                negated += 1
                assert record["rationale"][i] == 1, record
    assert 0.15 <= negated / len(records) <= 0.35


def test_contrast_sentences(records: list[dict]) -> None:
    contrasts = [r for r in records if "but" in r["sentence"].split()]
    assert 0.1 <= len(contrasts) / len(records) <= 0.3
    for record in contrasts:
        words = record["sentence"].split()
        start = deciding_clause_start(words)
        assert not any(record["rationale"][:start])
        first = words[:start]
        first_positive = {
            w in POSITIVE_WORDS for w in first if w in POSITIVE_WORDS | NEGATIVE_WORDS
        }
        assert len(first_positive) == 1, record
        first_negated = any(w in _NEGATORS for w in first)
        # the clause before "but" states the opposite of the label
        assert int(first_positive.pop() != first_negated) == 1 - record["label"], record


def test_distractors_and_intensifiers_never_marked(records: list[dict]) -> None:
    seen_distractors: set[str] = set()
    seen_intensifiers: set[str] = set()
    for record in records:
        for word, flag in zip(record["sentence"].split(), record["rationale"], strict=True):
            if word in DISTRACTOR_WORDS:
                seen_distractors.add(word)
                assert flag == 0, record
            if word in _INTENSIFIERS:
                seen_intensifiers.add(word)
                assert flag == 0, record
    assert set(_COLORS) <= seen_distractors
    assert {"yesterday", "sister", "center"} <= seen_distractors
    assert seen_intensifiers == set(_INTENSIFIERS)


def test_every_domain_and_template_shape_used(records: list[dict]) -> None:
    all_words = {w for r in records for w in r["sentence"].split()}
    for domain in _DOMAINS:
        assert set(domain.subjects) & all_words
    for template in _TEMPLATES:
        literal = [t for t in template.plain.split() if not t.startswith("{")]
        assert any(all(w in r["sentence"].split() for w in literal) for r in records), (
            template.plain
        )


def find(records: list[dict], predicate) -> list[dict]:
    matches = [r for r in single_clause(records) if predicate(r["sentence"].split())]
    assert matches, "pattern not found in the default dataset"
    return matches


def test_hand_checked_patterns(records: list[dict]) -> None:
    positive = {"good", "great", "excellent", "wonderful", "loved", "masterpiece"}
    negative = {"bad", "terrible", "awful", "boring", "hated", "disaster"}

    def has(words: list[str], vocab: set[str]) -> bool:
        return bool(set(words) & vocab)

    # "not" + positive word -> negative
    for r in find(records, lambda w: "not" in w and has(w, positive)):
        assert r["label"] == 0, r
    # "never" + negative word -> positive
    for r in find(records, lambda w: "never" in w and has(w, negative)):
        assert r["label"] == 1, r
    # plain positive / negative words without negation
    for r in find(records, lambda w: has(w, positive) and not has(w, set(_NEGATORS))):
        assert r["label"] == 1, r
    for r in find(records, lambda w: has(w, negative) and not has(w, set(_NEGATORS))):
        assert r["label"] == 0, r
    # "X , but <positive word, no negator>" -> positive, whatever X says
    decided_positive = [
        r
        for r in records
        if "but" in (words := r["sentence"].split())
        and has(words[deciding_clause_start(words) :], positive)
        and not has(words[deciding_clause_start(words) :], set(_NEGATORS))
    ]
    assert decided_positive
    assert all(r["label"] == 1 for r in decided_positive)


def test_exact_sentence_rationale(records: list[dict]) -> None:
    """Spot-check a concrete sentence shape word by word."""
    record = next(
        r
        for r in records
        if r["sentence"].startswith("the ")
        and " was not " in r["sentence"]
        and "but" not in r["sentence"].split()
    )
    words = record["sentence"].split()
    not_index = words.index("not")
    assert record["rationale"][not_index] == 1
    assert record["rationale"][: not_index - 1] == [0] * (not_index - 1)
    assert record["rationale"][not_index - 1] == 0  # "was"
