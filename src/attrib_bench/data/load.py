"""Examples from a Hugging Face hub dataset, a local file or folder, or the built-in default.

Two local formats carry more than a table: ERASER folders (word rationales from evidence spans,
attrib_bench.data.rationales) and next-token minimal pairs (BLiMP / IOI CSVs: a prefix, its two
next words and the evidence word, attrib_bench.data.next_token).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import datasets

from attrib_bench.core.errors import UsageError, unknown_choice
from attrib_bench.core.interfaces import Example
from attrib_bench.data.default import DEFAULT_SEED, DEFAULT_SIZE, generate_default_dataset
from attrib_bench.data.next_token import PREFIX, NextTokens, is_next_token_source, load_next_token
from attrib_bench.data.rationales import is_eraser_folder, load_eraser

DEFAULT_DATASET = "default"
#: Local file types and the ``datasets`` builder (with its options) that reads each.
FILE_BUILDERS: dict[str, tuple[str, dict]] = {
    # GLUE-style TSVs contain bare quotes: read them without CSV quoting (csv.QUOTE_NONE = 3).
    ".tsv": ("csv", {"delimiter": "\t", "quoting": 3}),
    ".csv": ("csv", {}),
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
}
#: Text columns tried in order when none is given: pairs first, then single texts.
PAIR_COLUMNS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question1", "question2"))
SINGLE_COLUMNS = ("sentence", "text", "question")
#: Preferred evaluation splits when ``--split`` is not given.
SPLIT_PREFERENCE = ("validation", "dev", "test", "train")


@dataclass
class LoadedData:
    examples: list[Example]
    name: str
    split: str
    fingerprint: str
    text_column: str
    text_pair_column: str | None
    label_column: str | None
    #: Next-token data only: each example's two next words (labels come from the tokenizer).
    next_tokens: NextTokens | None = None

    @property
    def num_labels(self) -> int | None:
        labels = {e.label for e in self.examples if e.label is not None}
        return max(labels) + 1 if labels else None


def _pick_split(available: list[str], split: str | None, name: str) -> str:
    if split is not None:
        if split not in available:
            raise unknown_choice(f"split of dataset {name!r}:", split, available)
        return split
    for preferred in SPLIT_PREFERENCE:
        if preferred in available:
            return preferred
    return sorted(available)[0]


def _load_local(path: Path, split: str | None) -> tuple[datasets.Dataset, str]:
    path = path.resolve()  # the datasets fingerprint hashes the path: one spelling per file
    if path.is_file():
        files = {path.stem: path}
    else:
        files = {p.stem: p for p in sorted(path.iterdir()) if p.suffix in FILE_BUILDERS}
        if not files:
            raise UsageError(
                f"dataset folder {str(path)!r} holds no data file; expected one of "
                + ", ".join(FILE_BUILDERS)
            )
    if path.suffix not in FILE_BUILDERS and path.is_file():
        raise unknown_choice("data file type", path.suffix or path.name, FILE_BUILDERS)
    chosen = _pick_split(list(files), split, str(path))
    builder, options = FILE_BUILDERS[files[chosen].suffix]
    try:
        # datasets accepts only \w+ split names: read the file as "data", report its own name
        dataset = datasets.load_dataset(
            builder, data_files={"data": str(files[chosen])}, split="data", **options
        )
    except (ValueError, datasets.exceptions.DatasetGenerationError) as error:
        raise UsageError(
            f"cannot read {str(files[chosen])!r}: no examples or not a table "
            f"({type(error).__name__})"
        ) from None
    return dataset, chosen


def _load_hub(name: str, split: str | None) -> tuple[datasets.Dataset, str]:
    attempts = [(name, None)]
    if name.count("/") == 1:  # "glue/sst2" means dataset glue, configuration sst2
        attempts.append(tuple(name.split("/")))
    errors = []
    for path, config in attempts:
        try:
            dataset_dict = datasets.load_dataset(path, config)
        except Exception as error:  # datasets raises many types for "not found" and "offline"
            errors.append(f"{path}{'/' + config if config else ''}: {type(error).__name__}")
            continue
        chosen = _pick_split(list(dataset_dict), split, name)
        return dataset_dict[chosen], chosen
    raise UsageError(
        f"dataset {name!r} not found: no such local file or folder, and the Hugging Face hub "
        f"gave nothing ({'; '.join(errors)}); use 'default', a local path, or a hub id"
    )


def _columns(
    names: list[str], text: str | None, pair: str | None, label: str | None, dataset: str
) -> tuple[str, str | None, str | None]:
    for given in (text, pair, label):
        if given is not None and given not in names:
            raise unknown_choice(f"column of dataset {dataset!r}:", given, names)
    if text is None:
        for first, second in PAIR_COLUMNS:
            if first in names and second in names:
                text, pair = first, pair or second
                break
        else:
            text = next((c for c in SINGLE_COLUMNS if c in names), None)
        if text is None and "prompt" in names:
            raise UsageError(
                f"dataset {dataset!r} holds prompts (columns: {', '.join(names)}); a run explains "
                "one class or next token: explain a prompt's continuation with attrib-bench "
                "context --split-by tokens"
            )
        if text is None:
            raise UsageError(
                f"no text column found in dataset {dataset!r} (columns: {', '.join(names)}); "
                "name one with --text-column"
            )
    if label is None and "label" in names:
        label = "label"
    return text, pair, label


def _label(value: object, column: str, dataset: str) -> int | None:
    """An integer class id; None for a missing label (GLUE marks test labels -1)."""
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(
            f"label column {column!r} of dataset {dataset!r} holds {value!r}, not an integer "
            "class id; convert the labels or choose another column with --label-column"
        ) from None


def _default(split: str | None, limit: int | None) -> LoadedData:
    splits = generate_default_dataset(DEFAULT_SEED, DEFAULT_SIZE)
    chosen = _pick_split(list(splits), split or "test", DEFAULT_DATASET)
    records = splits[chosen][:limit]
    examples = [
        Example(r["id"], r["sentence"], None, r["label"], tuple(r["rationale"])) for r in records
    ]
    digest = hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()
    return LoadedData(examples, DEFAULT_DATASET, chosen, digest, "sentence", None, "label")


def _unique_ids(examples: list[Example], name: str, split: str, source: str) -> None:
    """Refuse duplicate ids: scores, cache entries and the gate are all keyed by example id."""
    counts = Counter(e.id for e in examples)
    duplicates = [example_id for example_id, n in counts.items() if n > 1]
    if duplicates:
        shown = ", ".join(f"{d!r} ({counts[d]}x)" for d in duplicates[:5])
        more = f" and {len(duplicates) - 5} more" if len(duplicates) > 5 else ""
        raise UsageError(
            f"dataset {name!r} split {split!r} has {len(duplicates)} duplicate example ids: "
            f"{shown}{more}; ids come from {source}, and every result is keyed by id, so make "
            "them unique (or remove the id column to number the rows)"
        )


def load_examples(
    name: str | None = None,
    split: str | None = None,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    limit: int | None = None,
) -> LoadedData:
    """Load the first ``limit`` examples of one split, with text columns detected or given."""
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    name = name or DEFAULT_DATASET
    if name == DEFAULT_DATASET:
        data, id_source = _default(split, limit), "the generator"
    elif is_eraser_folder(Path(name).expanduser()):  # documents + evidence spans (ERASER)
        examples, chosen, fingerprint = load_eraser(Path(name).expanduser(), split, limit)
        data = LoadedData(examples, name, chosen, fingerprint, "document", None, "classification")
        id_source = "the annotation ids"
    elif is_next_token_source(Path(name).expanduser()):  # prefix, next words, evidence word
        examples, chosen, fingerprint, next_tokens = load_next_token(
            Path(name).expanduser(), split, limit
        )
        data = LoadedData(examples, name, chosen, fingerprint, PREFIX, None, None, next_tokens)
        id_source = "the paradigm and pairID (or row number)"
    else:
        path = Path(name).expanduser()
        dataset, chosen = _load_local(path, split) if path.exists() else _load_hub(name, split)
        text, pair, label = _columns(
            dataset.column_names, text_column, text_pair_column, label_column, name
        )
        id_column = next((c for c in ("idx", "id") if c in dataset.column_names), None)
        rows = dataset if limit is None else dataset.select(range(min(limit, len(dataset))))
        id_source = f"the {id_column!r} column" if id_column else "the row numbers"
        examples = []
        for index, row in enumerate(rows):
            gold = _label(row[label], label, name) if label else None
            examples.append(
                Example(
                    id=str(row[id_column]) if id_column else str(index),
                    text=str(row[text]),
                    text_pair=str(row[pair]) if pair else None,
                    label=gold if gold is not None and gold >= 0 else None,
                )
            )
        # The rows themselves, not datasets' own fingerprint: that one hashes a local file's
        # modification time, so a copied or re-extracted data folder (a new machine, a CI
        # checkout) gave new cache keys, and a cached fine-tune was trained again.
        rows_key = [(e.id, e.text, e.text_pair, e.label) for e in examples]
        key = json.dumps([rows_key, chosen, text, pair, label, limit])
        fingerprint = hashlib.sha256(key.encode()).hexdigest()
        data = LoadedData(examples, name, chosen, fingerprint, text, pair, label)
    if not data.examples:
        raise UsageError(f"dataset {name!r} split {data.split!r} has no examples")
    _unique_ids(data.examples, name, data.split, id_source)
    return data
