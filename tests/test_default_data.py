"""The embedded default dataset (attrib_bench.data.default), tested by its behaviour.

Nothing here reads the generator's private vocabularies or recomputes its output the way it
does: the checks are what a user relies on (a seed fixes the data, labels are balanced, the
rationale lines up with ``text.split()`` and decides the label, the held-out split is disjoint
from the training split) plus a golden snapshot and fingerprint of the default data.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from attrib_bench.data import default
from attrib_bench.data.default import dataset_fingerprint, generate_default_dataset
from attrib_bench.data.load import load_examples

MODULE_FILE = Path(default.__file__)

#: The golden default data (seed 0, 3000 sentences). The default model's cache key and every
#: published default number depend on it: change it only on purpose, and say so.
DEFAULT_FINGERPRINT = "75ff80a91983e800a7726848e491467f156dd0ad25971894b6b22af05b3190f1"
#: Its first records, labels and rationales checked by hand.
GOLDEN = {
    "train": [
        ("the album seemed very excellent to me .", 1, "excellent"),
        ("the script proved to be an annoying flop .", 0, "annoying flop"),
        ("i thought the pool on the third floor was pleasant .", 1, "pleasant"),
        (
            "the controller on my tablet proved to be a chore , but i would call the game a "
            "marvel .",
            1,
            "marvel",
        ),
    ],
    "test": [
        ("the critics regretted the cookbook last weekend .", 0, "regretted"),
        ("the performance is awful , but the singer was brilliant .", 1, "brilliant"),
        ("my experience with the show was not lousy .", 1, "not lousy"),
    ],
}

# Written here, not imported: the generator's documented negators, and words that carry no
# sentiment in any sentence (function words, punctuation, the contrast marker).
NEGATORS = {"not", "never", "hardly"}
NEVER_RATIONALE = {"the", "a", "an", "i", "my", "this", "is", "was", "to", "me", ",", ".", "but"}
NEVER_RATIONALE |= {"and", "we", "our", "on", "at", "in", "of"}
# A few words whose polarity a reader knows; the generator must agree with them.
POSITIVE = {"good", "great", "excellent", "wonderful", "brilliant", "loved", "masterpiece"}
NEGATIVE = {"bad", "terrible", "awful", "boring", "hated", "disaster", "lousy"}


@pytest.fixture(scope="module")
def dataset() -> dict[str, list[dict]]:
    return generate_default_dataset()


@pytest.fixture(scope="module")
def records(dataset: dict[str, list[dict]]) -> list[dict]:
    return dataset["train"] + dataset["test"]


def marked(record: dict) -> tuple[str, ...]:
    """The rationale's words, in sentence order."""
    words = record["sentence"].split()
    return tuple(w for w, flag in zip(words, record["rationale"], strict=True) if flag)


def test_golden_snapshot(dataset: dict[str, list[dict]]) -> None:
    assert dataset_fingerprint() == DEFAULT_FINGERPRINT
    for split, expected in GOLDEN.items():
        for k, (sentence, label, rationale) in enumerate(expected):
            record = dataset[split][k]
            assert record["id"] == f"default-{split}-{k}"
            assert (record["sentence"], record["label"]) == (sentence, label)
            assert marked(record) == tuple(rationale.split())


def test_default_split_sizes(dataset: dict[str, list[dict]]) -> None:
    assert {split: len(rows) for split, rows in dataset.items()} == {"train": 2400, "test": 600}


@pytest.mark.parametrize(
    ("size", "test_fraction", "n_train", "n_test"),
    [(100, 0.3, 70, 30), (50, 0.0, 50, 0), (10, 0.2, 8, 2), (7, 0.5, 3, 4)],
)
def test_custom_sizes(size: int, test_fraction: float, n_train: int, n_test: int) -> None:
    data = generate_default_dataset(seed=3, size=size, test_fraction=test_fraction)
    assert (len(data["train"]), len(data["test"])) == (n_train, n_test)


@pytest.mark.parametrize(("size", "test_fraction"), [(0, 0.2), (10, 1.0), (10, -0.1)])
def test_invalid_arguments(size: int, test_fraction: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        generate_default_dataset(size=size, test_fraction=test_fraction)


def test_record_schema_and_ids(dataset: dict[str, list[dict]]) -> None:
    for split, split_records in dataset.items():
        for k, record in enumerate(split_records):
            assert set(record) == {"id", "sentence", "label", "rationale"}
            assert record["id"] == f"default-{split}-{k}"
            assert type(record["label"]) is int and record["label"] in (0, 1)
            assert all(type(flag) is int and flag in (0, 1) for flag in record["rationale"])


def test_a_seed_fixes_the_data(dataset: dict[str, list[dict]]) -> None:
    assert generate_default_dataset() == dataset
    assert generate_default_dataset(seed=7, size=200) == generate_default_dataset(seed=7, size=200)
    assert dataset_fingerprint(seed=7, size=200) == dataset_fingerprint(seed=7, size=200)
    other = generate_default_dataset(seed=1)
    sentences = {r["sentence"] for r in dataset["train"]}
    assert len(sentences & {r["sentence"] for r in other["train"]}) < len(sentences) // 2
    assert dataset_fingerprint(seed=1) != dataset_fingerprint()
    assert dataset_fingerprint(size=100) != dataset_fingerprint()


def test_the_same_data_in_every_process() -> None:
    """Independent of hash randomisation (set and dict order): another PYTHONHASHSEED."""
    # Load the module file alone: the fresh process then skips the package's heavy imports.
    code = (
        "import importlib.util, sys; "
        "spec = importlib.util.spec_from_file_location('default_data', sys.argv[1]); "
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
        "print(module.dataset_fingerprint())"
    )
    fingerprints = {
        subprocess.run(
            [sys.executable, "-c", code, str(MODULE_FILE)],
            env=dict(os.environ, PYTHONHASHSEED=hash_seed),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for hash_seed in ("1", "12345")
    }
    assert fingerprints == {dataset_fingerprint()}


@pytest.mark.parametrize(("seed", "size"), [(0, 3000), (4, 7), (5, 101)])
def test_labels_are_balanced(seed: int, size: int) -> None:
    data = generate_default_dataset(seed=seed, size=size)
    labels = [r["label"] for split in data.values() for r in split]
    assert abs(labels.count(1) - labels.count(0)) <= 1
    if size >= 1000:
        for split_records in data.values():  # the shuffle spreads both labels over both splits
            share = sum(r["label"] for r in split_records) / len(split_records)
            assert 0.45 <= share <= 0.55


def test_held_out_split_is_disjoint_from_train(dataset: dict[str, list[dict]]) -> None:
    train = [r["sentence"] for r in dataset["train"]]
    test = [r["sentence"] for r in dataset["test"]]
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert not set(train) & set(test)
    # What fine-tuning reads and what `run` scores by default, through the loader.
    fitted, scored = load_examples("default", "train"), load_examples("default")
    assert (fitted.split, scored.split) == ("train", "test")
    assert [e.text for e in fitted.examples] == train
    assert [e.text for e in scored.examples] == test
    assert not {e.id for e in fitted.examples} & {e.id for e in scored.examples}
    assert fitted.fingerprint != scored.fingerprint


def test_sentence_format(records: list[dict]) -> None:
    for record in records:
        sentence = record["sentence"]
        words = sentence.split()
        assert sentence == " ".join(words)  # single spaces: split() is the word list
        assert 5 <= len(words) <= 25 and words[-1] == "."
        assert all(w in {",", "."} or re.fullmatch(r"[a-z]+", w) for w in words), sentence


def test_rationale_aligns_with_the_words(records: list[dict]) -> None:
    for record in records:
        assert len(record["rationale"]) == len(record["sentence"].split()), record
        assert 1 <= sum(record["rationale"]) <= 3, record
        assert not set(marked(record)) & NEVER_RATIONALE, record


def test_rationale_words_fit_the_loader_and_the_tokenizer(minilm) -> None:
    from transformers import AutoTokenizer

    from attrib_bench.data.batches import make_batches

    examples = load_examples("default", "test", limit=64).examples
    assert all(e.rationale is not None for e in examples)
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    batches, truncated = make_batches(examples, tokenizer, 64, 128)
    assert truncated == 0
    batch = batches[0]
    for row, example in enumerate(batch.examples):
        words = example.text.split()
        ids = batch.word_ids_BN[row][batch.word_ids_BN[row] >= 0]
        assert sorted(set(ids.tolist())) == list(range(len(words)))  # every word, in order


def test_the_rationale_decides_the_label(records: list[dict]) -> None:
    """Sentences with the same rationale words share a label, whatever else they say; a
    negator among them flips it."""
    labels: dict[tuple[str, ...], set[int]] = defaultdict(set)
    sentences: dict[tuple[str, ...], int] = defaultdict(int)
    for record in records:
        labels[marked(record)].add(record["label"])
        sentences[marked(record)] += 1
    assert all(len(found) == 1 for found in labels.values())
    # Not vacuous: most rationales occur in several different sentences.
    assert sum(n >= 2 for n in sentences.values()) > len(sentences) / 2

    flipped = 0
    for words, (label,) in labels.items():
        assert sum(w in NEGATORS for w in words) <= 1, words
        plain = tuple(w for w in words if w not in NEGATORS)
        if plain != words and plain in labels:
            assert labels[plain] == {1 - label}, words
            flipped += 1
    assert flipped >= 50


def test_labels_agree_with_a_readers_lexicon(records: list[dict]) -> None:
    checked = 0
    for record in records:
        words = marked(record)
        sentiment = [w for w in words if w not in NEGATORS]
        if len(sentiment) == 1 and sentiment[0] in POSITIVE | NEGATIVE:
            negated = len(words) == 2
            assert record["label"] == int((sentiment[0] in POSITIVE) != negated), record
            checked += 1
    assert checked >= 200


def test_negation_and_contrast_occur_and_are_marked(records: list[dict]) -> None:
    negated = [r for r in records if set(marked(r)) & NEGATORS]
    assert 0.15 <= len(negated) / len(records) <= 0.35
    contrasts = [r for r in records if "but" in r["sentence"].split()]
    assert 0.1 <= len(contrasts) / len(records) <= 0.3
    for record in contrasts:
        # "X , but Y": Y decides, so nothing of X is rationale.
        words = record["sentence"].split()
        last_but = len(words) - 1 - words[::-1].index("but")
        assert not any(record["rationale"][:last_but]), record
    # A contrast's first clause says the opposite of its label, in the reader's lexicon.
    opposite = 0
    for record in contrasts:
        words = record["sentence"].split()
        first = words[: words.index("but")]
        if not set(first) & NEGATORS:
            polar = {w in POSITIVE for w in first if w in POSITIVE | NEGATIVE}
            if polar:
                assert polar == {record["label"] == 0}, record
                opposite += 1
    assert opposite >= 10
