"""Word-level human rationales: ERASER-format data, subword-to-word alignment, truncation losses.

ERASER (DeYoung et al., ACL 2020) stores a dataset as a folder of ``{train,val,test}.jsonl``
annotation lines (``annotation_id``, ``classification``, ``evidences``: lists of spans
``{docid, start_token, end_token}`` over the document's whitespace tokens, ``end_token``
exclusive) and the documents, either as ``docs/<docid>`` text files (movies) or as one
``docs.jsonl`` of ``{docid, document}`` lines (the HateXplain conversion). An annotation becomes
an :class:`Example` whose ``text`` is the document's whitespace tokens joined by single spaces,
whose ``label`` is the index of its class in the sorted class names of all the folder's splits
(movies: NEG 0, POS 1; HateXplain: non-toxic 0, toxic 1), and whose ``rationale`` marks the words
of ``text.split()`` inside any evidence span.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from attrib_bench.core.errors import UsageError, unknown_choice
from attrib_bench.core.interfaces import Batch, Example

ERASER_SPLITS = ("train", "val", "test")


def is_eraser_folder(path: Path) -> bool:
    """An ERASER folder: split annotation files plus ``docs/`` or ``docs.jsonl``."""
    has_split = any((path / f"{split}.jsonl").is_file() for split in ERASER_SPLITS)
    return has_split and ((path / "docs").is_dir() or (path / "docs.jsonl").is_file())


def _read_jsonl(path: Path) -> list[dict]:
    with path.open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _documents(path: Path, docids: set[str]) -> dict[str, str]:
    if (path / "docs.jsonl").is_file():
        return {
            record["docid"]: record["document"]
            for record in _read_jsonl(path / "docs.jsonl")
            if record["docid"] in docids
        }
    return {docid: (path / "docs" / docid).read_text() for docid in docids}


def _docid(annotation: dict) -> str:
    """The document an annotation classifies: its evidence's docid, else its own id (ERASER)."""
    for group in annotation["evidences"]:
        for span in group:
            return span["docid"]
    docids = annotation.get("docids")
    return docids[0] if docids else annotation["annotation_id"]


def rationale_mask(num_words: int, evidences: list[list[dict]]) -> tuple[int, ...]:
    """1 for every word inside an evidence span ``[start_token, end_token)``, else 0."""
    mask = [0] * num_words
    for group in evidences:
        for span in group:
            for word in range(span["start_token"], min(span["end_token"], num_words)):
                mask[word] = 1
    return tuple(mask)


def load_eraser(path: Path, split: str | None, limit: int | None) -> tuple[list[Example], str, str]:
    """Examples of one split (``val`` unless given), the split chosen, and a fingerprint."""
    available = [s for s in ERASER_SPLITS if (path / f"{s}.jsonl").is_file()]
    chosen = split or ("val" if "val" in available else available[0])
    if chosen not in available:
        raise unknown_choice(f"split of dataset {str(path)!r}:", chosen, available)
    classes = sorted(
        {a["classification"] for s in available for a in _read_jsonl(path / f"{s}.jsonl")}
    )
    annotations = _read_jsonl(path / f"{chosen}.jsonl")[:limit]
    if not annotations:
        raise UsageError(f"dataset {str(path)!r} split {chosen!r} has no examples")
    documents = _documents(path, {_docid(a) for a in annotations})
    examples = []
    digest = hashlib.sha256(json.dumps([chosen, limit, classes]).encode())
    for annotation in annotations:
        words = documents[_docid(annotation)].split()
        examples.append(
            Example(
                id=annotation["annotation_id"],
                text=" ".join(words),
                label=classes.index(annotation["classification"]),
                rationale=rationale_mask(len(words), annotation["evidences"]),
            )
        )
        digest.update(json.dumps([annotation, words]).encode())
    return examples, chosen, digest.hexdigest()


def token_word_ids(
    text: str, offsets: Sequence[tuple[int, int]], sequence_ids: Sequence[int | None]
) -> list[int]:
    """For each token, the index of its word in ``text.split()``; -1 outside the first text.

    Works for any fast tokenizer: a token belongs to the whitespace word holding the first
    non-space character of its character span (its offsets), whatever the tokenizer's own
    pre-tokenisation (BERT splits "don't" into three words, RoBERTa's offsets may include the
    leading space). Special tokens, padding and the second text of a pair get -1.
    """
    char_word = np.full(len(text) + 1, -1, dtype=np.int64)
    for index, match in enumerate(re.finditer(r"\S+", text)):
        char_word[match.start() : match.end()] = index
    out = []
    for (start, end), sequence in zip(offsets, sequence_ids, strict=True):
        words = char_word[start:end] if sequence == 0 else char_word[:0]
        words = words[words >= 0]
        out.append(int(words[0]) if len(words) else -1)
    return out


def word_scores(
    token_scores: np.ndarray, word_ids: np.ndarray, num_words: int, pool: str = "sum"
) -> tuple[np.ndarray, np.ndarray]:
    """Token scores pooled per word (sum or max over its pieces) and the mask of visible words.

    A word is visible when at least one of its tokens is in the input (not truncated away);
    invisible words score 0 and are reported by the mask, so callers can leave them out.
    """
    inside = word_ids >= 0
    ids, scores = word_ids[inside], token_scores[inside].astype(np.float64)
    visible = np.zeros(num_words, dtype=bool)
    visible[ids] = True
    if pool == "max":
        pooled = np.full(num_words, -np.inf)
        np.maximum.at(pooled, ids, scores)
        pooled[~visible] = 0.0
    else:
        pooled = np.zeros(num_words)
        np.add.at(pooled, ids, scores)
    return pooled, visible


def rationale_words_lost(batches: Iterable[Batch]) -> float | None:
    """Share of rationale words cut off by truncation, over all examples; None without any."""
    counts = [rationale_word_counts(batch) for batch in batches]
    lost, total = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return lost / total if total else None


def rationale_word_counts(batch: Batch) -> tuple[int, int]:
    """(rationale words cut off by truncation, rationale words) over the batch's examples."""
    total = lost = 0
    if batch.word_ids_BN is None:
        return 0, 0
    for row, example in enumerate(batch.examples):
        if example.rationale is None:
            continue
        marked = np.flatnonzero(np.asarray(example.rationale))
        seen = set(batch.word_ids_BN[row].tolist())
        total += len(marked)
        lost += sum(int(word) not in seen for word in marked)
    return lost, total
