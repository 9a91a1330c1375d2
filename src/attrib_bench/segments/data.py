"""Context data: a context split into segments, a query, the answer to explain, human evidence.

A segment is the unit attributed to (a sentence, a line, a retrieved document, a few-shot
demonstration). The formats (docs/segments.md):

- a JSONL file of records with ``segments`` (a list of strings) or ``context`` (one string,
  split by ``--split-by sentences|lines|tokens``), a ``query``, optionally an ``answer`` (the
  continuation whose log-probability is explained; without one, ``--generate N`` produces it),
  a ``foil`` (a contrasting continuation, for ``--target score=contrastive,foil=example``) and
  ``evidence`` (indices of the segments humans marked as the evidence), and an ``id``; or a
  ``prompt`` and a ``continuation`` (a next-token dataset generalised: the prompt is used as it
  is, no template, and is split as a context; the continuation is the answer);
- an ERASER folder (movie reviews): a review's lines are its sentences, the answer is the gold
  label's word, the foil the other label's, and a sentence is evidence when it overlaps a
  human evidence span. A line holding punctuation alone (the tokenised reviews break some
  sentences before their final ``.``) joins the line before it.

Segments are joined by ``separator`` (one space by default), as ContextCite joins sentences.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from attrib_bench.core.errors import UsageError, unknown_choice

SPLIT_RULES = ("sentences", "lines", "tokens")
#: The template of a prompt/continuation record: its prompt as it is.
RAW_TEMPLATE = "{context}{query}"
#: The answers of ERASER movie reviews, by label (NEG, POS); the default query asks for them.
ERASER_ANSWERS = {"NEG": " negative", "POS": " positive"}
ERASER_QUERY = "Is this movie review positive or negative?\nAnswer:"
# A sentence ends at . ! or ? (and closing quotes or brackets) followed by white space.
SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")

#: ContextCite's template (its DEFAULT_PROMPT_TEMPLATE).
DEFAULT_TEMPLATE = "Context: {context}\n\nQuery: {query}"


def check_template(template: str) -> None:
    """A template names ``{context}`` and ``{query}`` once each; else a UsageError."""
    for field in ("{context}", "{query}"):
        if template.count(field) != 1:
            raise UsageError(f"the prompt template must contain {field} once, got {template!r}")
    try:
        template.format(context="", query="")
    except (KeyError, IndexError, ValueError) as error:
        raise UsageError(f"bad prompt template {template!r} ({error!r})") from None


@dataclass(frozen=True)
class SegmentExample:
    """One context to attribute: its segments, the query after them, the answer explained.

    ``answer`` None means the model's own continuation is generated first; ``foil`` is a
    contrasting continuation (a contrastive run explains the answer's log-probability minus
    the foil's); ``evidence`` marks the human evidence segments (1/0 per segment), None where
    there is none.
    """

    id: str
    segments: tuple[str, ...]
    query: str
    answer: str | None = None
    evidence: tuple[int, ...] | None = None
    separator: str = " "
    foil: str | None = None
    #: A prompt/continuation record: the prompt is the context as it is, no template.
    raw: bool = False

    def template(self, template: str) -> str:
        """The template this example's prompt is made with: ``template``, or none (the
        context alone) for a prompt/continuation record."""
        return RAW_TEMPLATE if self.raw else template

    def context(self, keep: tuple[bool, ...] | None = None) -> str:
        """The context with the segments ``keep`` marks (all when None), joined by the
        separator: a dropped segment takes its separator with it."""
        if keep is None:
            return self.separator.join(self.segments)
        return self.separator.join(s for s, k in zip(self.segments, keep, strict=True) if k)


def split_context(text: str, rule: str, tokenizer: Any = None) -> list[str]:
    """``text`` cut into sentences (after ``.``, ``!`` or ``?`` and white space) or lines, empty
    pieces dropped and every piece stripped; or into ``tokenizer``'s tokens (``split_tokens``)."""
    if rule not in SPLIT_RULES:
        raise unknown_choice("segment split rule", rule, SPLIT_RULES)
    if rule == "tokens":
        return split_tokens(text, tokenizer)
    pieces = SENTENCE_END.split(text) if rule == "sentences" else text.splitlines()
    return [piece.strip() for piece in pieces if piece.strip()]


def split_tokens(text: str, tokenizer: Any) -> list[str]:
    """``text`` cut after each of its tokens' last character, so that the pieces joined with
    no separator are ``text`` again: a token's piece carries the white space before it (a
    token of white space alone joins the token after it, so no piece is empty)."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    pieces, start = [], 0
    for _, end in offsets["offset_mapping"]:
        if end > start and text[start:end].strip():
            pieces.append(text[start:end])
            start = end
    if start < len(text):  # trailing white space (or text no token covered)
        if pieces:
            pieces[-1] += text[start:]
        else:
            pieces.append(text[start:])
    return pieces


def _segments(record: dict, where: str, split_by: str, tokenizer: Any) -> tuple[str, ...]:
    if "segments" in record:
        segments = record["segments"]
        if not isinstance(segments, list) or not all(isinstance(s, str) for s in segments):
            raise UsageError(f"{where}: 'segments' must be a list of strings")
        return tuple(segments)
    for key in ("context", "prompt"):
        if key in record:
            return tuple(split_context(str(record[key]), split_by, tokenizer))
    raise UsageError(
        f"{where}: a record needs 'segments' (a list), 'context' or 'prompt' (a string)"
    )


def _evidence(record: dict, count: int, where: str) -> tuple[int, ...] | None:
    marked = record.get("evidence")
    if marked is None:
        return None
    if not isinstance(marked, list) or not all(isinstance(i, int) for i in marked):
        raise UsageError(f"{where}: 'evidence' must be a list of segment indices")
    outside = [i for i in marked if not 0 <= i < count]
    if outside:
        raise UsageError(f"{where}: evidence segment {outside[0]} is not among its {count}")
    return tuple(int(i in marked) for i in range(count))


def load_jsonl(
    path: Path, split_by: str, limit: int | None, tokenizer: Any = None
) -> list[SegmentExample]:
    """The examples of a JSONL context file (the module's first format)."""
    examples = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if limit is not None and len(examples) >= limit:
                break
            where = f"{path.name} line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise UsageError(f"{where} is not JSON ({error.msg})") from None
            raw = "prompt" in record
            if raw and ("query" in record or "context" in record or "segments" in record):
                raise UsageError(
                    f"{where}: a 'prompt' record takes its prompt as it is; give no 'query', "
                    "'context' or 'segments' beside it"
                )
            if not raw and "query" not in record:
                raise UsageError(f"{where}: a record needs a 'query' (or a 'prompt')")
            segments = _segments(record, where, split_by, tokenizer)
            answer = record.get("continuation" if raw else "answer")
            foil = record.get("foil")
            examples.append(
                SegmentExample(
                    id=str(record.get("id", number)),
                    segments=segments,
                    query=str(record.get("query", "")),
                    answer=None if answer is None else str(answer),
                    evidence=_evidence(record, len(segments), where),
                    foil=None if foil is None else str(foil),
                    separator="" if split_by == "tokens" else " ",
                    raw=raw,
                )
            )
    return examples


def _review_sentences(lines: list[str]) -> tuple[list[str], list[tuple[int, int]]]:
    """A tokenised review's sentences and each one's whitespace-token range [start, end)."""
    sentences: list[list[str]] = []
    for line in lines:
        words = line.split()
        if not words:
            continue
        if sentences and all(w.strip(string.punctuation) == "" for w in words):
            sentences[-1].extend(words)
        else:
            sentences.append(words)
    ranges, start = [], 0
    for words in sentences:
        ranges.append((start, start + len(words)))
        start += len(words)
    return [" ".join(words) for words in sentences], ranges


def load_eraser(path: Path, split: str, limit: int | None, query: str) -> list[SegmentExample]:
    """ERASER movie reviews as sentence contexts (the module's second format)."""
    annotations_file = path / f"{split}.jsonl"
    if not annotations_file.is_file():
        raise unknown_choice(
            f"split of ERASER folder {str(path)!r}:", split, ["train", "val", "test"]
        )
    examples = []
    with annotations_file.open() as handle:
        for line in handle:
            if limit is not None and len(examples) >= limit:
                break
            record = json.loads(line)
            docid = record["annotation_id"]
            lines = (path / "docs" / docid).read_text().splitlines()
            sentences, ranges = _review_sentences(lines)
            spans = [
                (span["start_token"], span["end_token"])
                for group in record["evidences"]
                for span in group
            ]
            evidence = tuple(
                int(any(s < end and start < e for s, e in spans)) for start, end in ranges
            )
            label = record["classification"]
            if label not in ERASER_ANSWERS:
                raise UsageError(f"{annotations_file.name}: {docid} has the label {label!r}")
            (foil,) = (word for key, word in ERASER_ANSWERS.items() if key != label)
            examples.append(
                SegmentExample(
                    docid, tuple(sentences), query, ERASER_ANSWERS[label], evidence, foil=foil
                )
            )
    return examples


def load_segments(
    dataset: str | Path,
    split: str | None = None,
    limit: int | None = None,
    split_by: str = "sentences",
    query: str | None = None,
    tokenizer: Any = None,
) -> tuple[list[SegmentExample], str]:
    """The examples of ``dataset`` (a JSONL file or an ERASER folder) and their fingerprint;
    ``tokenizer`` splits contexts by ``tokens``."""
    path = Path(dataset)
    if split_by == "tokens" and tokenizer is None:
        raise ValueError("split_by='tokens' needs the model's tokenizer")
    if path.is_dir() and (path / "docs").is_dir():
        examples = load_eraser(path, split or "val", limit, query or ERASER_QUERY)
    elif path.is_file():
        examples = load_jsonl(path, split_by, limit, tokenizer)
        if query is not None:  # a prompt record has no query: its prompt is used as it is
            examples = [e if e.raw else replace(e, query=query) for e in examples]
    else:
        raise UsageError(
            f"context dataset {str(path)!r} is neither a JSONL file nor an ERASER folder"
        )
    if not examples:
        raise UsageError(f"context dataset {str(path)!r} has no example")
    return examples, fingerprint(examples)


def fingerprint(examples: list[SegmentExample]) -> str:
    """The SHA-256 of the examples' fields, which a report records to name its data."""
    # Fields added since fingerprints began count only where set: older data keeps its print.
    records = [
        _first(e) | {k: getattr(e, k) for k, v in LATER_FIELDS.items() if getattr(e, k) != v}
        for e in examples
    ]
    return hashlib.sha256(json.dumps(records).encode()).hexdigest()


#: SegmentExample fields added after the first fingerprints, with their defaults.
LATER_FIELDS: dict[str, Any] = {"foil": None, "raw": False}


def _first(example: SegmentExample) -> dict[str, Any]:
    """The fields fingerprinted from the start, in their order."""
    return {k: v for k, v in asdict(example).items() if k not in LATER_FIELDS}
