"""Next-token minimal pairs: a prefix, its correct and wrong next word, and the evidence word.

The format of Ferrando et al.'s BLiMP and IOI files (docs/next-token.md; ACL 2023,
"Explaining How Transformers Use Context to Build Predictions"): CSVs with the columns
``one_prefix_prefix`` (the prefix), ``one_prefix_word_good`` / ``one_prefix_word_bad`` (the next
words) and ``target`` (the prefix word that decides between them); BLiMP's ``UID`` names the
paradigm, ``pairID`` numbers the pair. ``--dataset`` is one such file or a folder of them; its
split is ``all`` (every file, in name order) or one file's stem (one paradigm).

Each row becomes an Example: ``text`` the stripped prefix, ``rationale`` 1 at the evidence word
among ``text.split()``, id ``<paradigm>-<pairID>`` (the row number without a ``pairID``), the
paradigm being the ``UID`` or else the file's stem. The evidence word is matched after stripping
punctuation from both sides, case-sensitively, else case-insensitively; of several matches the
last (the one nearest the predicted word) is marked. Rows whose evidence word is not in the
prefix (BLiMP writes ``NA`` for 93 of its 11,000) are dropped, counted and warned about; with a
``limit`` only the rows read until it is met (a file after it is not read).

The two words are carried beside the examples (``NextTokens``, by example id): the token ids
they stand for depend on the model's tokenizer (``token_pairs``).
"""

from __future__ import annotations

import csv
import hashlib
import json
import string
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from attrib_bench.core.console import warn
from attrib_bench.core.errors import UsageError, unknown_choice
from attrib_bench.core.interfaces import Example

PREFIX, GOOD, BAD, EVIDENCE = (
    "one_prefix_prefix",
    "one_prefix_word_good",
    "one_prefix_word_bad",
    "target",
)
#: A CSV with any of these columns is next-token data (then it needs every REQUIRED column).
SIGNATURE = frozenset({PREFIX, GOOD, BAD})
REQUIRED = (PREFIX, GOOD, BAD, EVIDENCE)
ALL_SPLIT = "all"


@dataclass(frozen=True)
class NextWords:
    """One example's correct and wrong next word, and its paradigm (results split by it)."""

    good: str
    bad: str
    paradigm: str


@dataclass(frozen=True)
class NextTokens:
    """What a next-token dataset adds to its examples: their next words, by example id, and how
    many rows were dropped for an evidence word missing from the prefix."""

    words: Mapping[str, NextWords]
    unmatched: int


def _header(path: Path) -> list[str]:
    """The column names of a CSV; none for a file that is not UTF-8 text."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])
    except (UnicodeDecodeError, csv.Error):
        return []


def _csv_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(path.glob("*.csv")) if path.is_dir() else []


def is_next_token_source(path: Path) -> bool:
    """A CSV with a next-token column, or a folder holding one."""
    return any(
        f.suffix == ".csv" and SIGNATURE & set(_header(f)) for f in _csv_files(path.resolve())
    )


def _rows(path: Path) -> list[dict[str, str]]:
    """The rows of a next-token CSV; a one-line UsageError naming the file when it is none."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise UsageError(
                    f"{str(path)!r} lacks the column{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(missing)}; a next-token CSV needs {', '.join(REQUIRED)}"
                )
            return [{k: v or "" for k, v in row.items()} for row in reader]
    except (UnicodeDecodeError, csv.Error) as error:
        raise UsageError(f"{str(path)!r} is not a readable CSV ({error})") from None


def evidence_index(words: list[str], evidence: str) -> int | None:
    """Index of the evidence word among ``words`` (see the module for the rule); None if absent."""
    bare = [word.strip(string.punctuation) for word in words]
    wanted = evidence.strip(string.punctuation)
    for same in (str.__eq__, lambda a, b: a.lower() == b.lower()):
        hits = [i for i, word in enumerate(bare) if wanted and same(word, wanted)]
        if hits:
            return hits[-1]
    return None


def load_next_token(
    path: Path, split: str | None, limit: int | None
) -> tuple[list[Example], str, str, NextTokens]:
    """The examples of one split (``all`` unless given), the split, a fingerprint, the words."""
    path = path.resolve()
    files = {f.stem: f for f in _csv_files(path)}
    chosen = split or ALL_SPLIT
    if chosen != ALL_SPLIT and chosen not in files:
        raise unknown_choice(f"split of dataset {str(path)!r}:", chosen, [ALL_SPLIT, *files])
    examples, words, unmatched = [], {}, 0
    for stem, file in files.items():
        if chosen not in (ALL_SPLIT, stem):
            continue
        if limit is not None and len(examples) >= limit:
            break  # the files after the limit are not read, nor warned about
        rows = _rows(file)
        dropped = read = 0
        for index, row in enumerate(rows):
            if limit is not None and len(examples) >= limit:
                break
            read += 1
            text = row[PREFIX].strip()
            marked = evidence_index(text.split(), row[EVIDENCE])
            if marked is None:
                dropped += 1
                continue
            paradigm = row.get("UID") or stem
            example_id = f"{paradigm}-{row.get('pairID') or index}"
            rationale = tuple(int(i == marked) for i in range(len(text.split())))
            examples.append(Example(id=example_id, text=text, rationale=rationale))
            words[example_id] = NextWords(row[GOOD].strip(), row[BAD].strip(), paradigm)
        if dropped:
            of = f"{len(rows)} rows" if read == len(rows) else f"the {read} rows read (--limit)"
            warn(
                f"{file.name}: {dropped} of {of} dropped, their evidence word "
                f"({EVIDENCE!r} column) is not among the prefix words"
            )
        unmatched += dropped
    records = [[e.id, e.text, e.rationale, asdict(words[e.id])] for e in examples]
    fingerprint = hashlib.sha256(json.dumps([chosen, limit, records]).encode()).hexdigest()
    kept = NextTokens({e.id: words[e.id] for e in examples}, unmatched)
    return examples, chosen, fingerprint, kept


def next_token_ids(
    tokenizer: PreTrainedTokenizerBase, good: str, bad: str
) -> tuple[int, int] | None:
    """The first sub-token of " " + each word (as it follows a prefix); None when they share it.

    A shared first token (BLiMP's "grocery store" / "grocery stores") leaves nothing to
    contrast at the next position, so such an example cannot be scored.
    """
    good_id, bad_id = (
        tokenizer(" " + word, add_special_tokens=False)["input_ids"][0] for word in (good, bad)
    )
    return None if good_id == bad_id else (good_id, bad_id)


def token_pairs(
    tokenizer: PreTrainedTokenizerBase, next_tokens: NextTokens
) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Per example id, its (good, bad) next-token ids; and the ids whose words share their first
    token under this tokenizer, which a run drops and counts."""
    pairs, shared = {}, []
    for example_id, words in next_tokens.words.items():
        ids = next_token_ids(tokenizer, words.good, words.bad)
        if ids is None:
            shared.append(example_id)
        else:
            pairs[example_id] = ids
    return pairs, shared
