"""A dataset's fingerprint (in every cache key) follows its rows, not its files' timestamps."""

from __future__ import annotations

import os

from attrib_bench.data.load import load_examples


def write(path, rows: list[tuple[str, int]]) -> None:
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))


def test_touching_or_copying_the_files_keeps_the_fingerprint(tmp_path):
    """datasets hashes a local file's modification time: a re-extracted data folder on another
    machine gave a new fingerprint, so cached fine-tunes were trained again."""
    rows = [("a fine film", 1), ("a dull film", 0)]
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    write(first / "train.tsv", rows)
    before = load_examples(str(first), "train").fingerprint
    os.utime(first / "train.tsv", (1_000_000_000, 1_000_000_000))
    assert load_examples(str(first), "train").fingerprint == before
    write(second / "train.tsv", rows)  # the same rows in another folder
    assert load_examples(str(second), "train").fingerprint == before


def test_other_rows_or_another_limit_change_the_fingerprint(tmp_path):
    write(tmp_path / "train.tsv", [("a fine film", 1), ("a dull film", 0)])
    plain = load_examples(str(tmp_path), "train").fingerprint
    assert load_examples(str(tmp_path), "train", limit=1).fingerprint != plain
    write(tmp_path / "train.tsv", [("a fine film", 1), ("a dull film", 1)])
    assert load_examples(str(tmp_path), "train").fingerprint != plain
