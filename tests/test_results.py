"""The typed result: it reads and writes the JSON unchanged, and runs over disjoint examples
merge into the run over all of them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from attrib_bench.core.errors import UsageError
from attrib_bench.results import Result, merge
from attrib_bench.results.typed import validate

TEXTS = [
    "a fine film",
    "the plot was thin but the actors carried every scene",
    "dull",
    "an uneven yet often moving portrait of a family",
    "I laughed , I cried",
    "nothing happens for two hours",
]


def write_tsv(path: Path, rows: list[tuple[int, str]]) -> Path:
    path.write_text("idx\tsentence\tlabel\n" + "".join(f"{i}\t{t}\t{i % 2}\n" for i, t in rows))
    return path


@pytest.fixture(scope="module")
def runs(tiny_bert, tmp_path_factory) -> dict[str, Path]:
    """One run over all six sentences and one over each half, example by example."""
    from attrib_bench.cli import main

    folder = tmp_path_factory.mktemp("merge")
    rows = list(enumerate(TEXTS))
    outputs = {}
    patch = pytest.MonkeyPatch()
    patch.setenv("ATTRIB_BENCH_CACHE", str(folder / "cache"))  # never the user's cache
    for name, part in (("whole", rows), ("first", rows[:3]), ("second", rows[3:])):
        data = write_tsv(folder / f"{name}.tsv", part)
        outputs[name] = folder / f"{name}.json"
        code = main(
            ["run", "--model", str(tiny_bert), "--dataset", str(data), "--batch-size", "1",
             "--attributors", "attention,rollout,saliency",
             "--evaluators", "spearman,comprehensiveness:ratios=0.2/0.5",
             "--no-cache", "--quiet", "--output", str(outputs[name])]
        )  # fmt: skip
        assert code == 0
    patch.undo()
    return outputs


def test_the_typed_result_reads_and_writes_the_json_unchanged(runs, tmp_path):
    document = json.loads(runs["whole"].read_text())
    result = Result.load(runs["whole"])
    assert result.to_document() == document
    assert result.methods["rollout"].score("spearman").n == 6
    assert len(result.methods["attention"].example_scores("spearman", "local", 0)) == 6
    result.save(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text()) == document


def test_runs_over_disjoint_halves_merge_into_the_run_over_both(runs):
    whole = Result.load(runs["whole"])
    merged = merge([Result.load(runs["first"]), Result.load(runs["second"])])
    assert merged.example_ids == whole.example_ids
    for spec, method in whole.methods.items():
        assert merged.methods[spec].per_example == method.per_example, spec
        assert merged.methods[spec].scores == method.scores, spec  # statistics recomputed
        assert merged.methods[spec].evaluators == method.evaluators
    assert merged.provenance["dataset"]["examples"] == 6
    assert [p["examples"] for p in merged.extra["merged_from"]] == [3, 3]
    assert merged.paired == whole.paired  # recomputed over all examples, not dropped
    assert merged.agreement is None  # needs the attributions, which results do not hold
    validate(merged.to_document(), "merged")


def test_merge_refuses_what_it_cannot_recompute(runs):
    first, second = Result.load(runs["first"]), Result.load(runs["second"])
    with pytest.raises(UsageError, match="example id '0' is in parts 1 and 2"):
        merge([first, first])
    other = copy.deepcopy(second)
    other.provenance["model"]["weights_sha256"] = "0" * 64
    with pytest.raises(UsageError, match="different model weights"):
        merge([first, other])
    corpus = copy.deepcopy(second)
    for part in (first, corpus):
        part.evaluator_info["spearman"]["corpus_level"] = True
    with pytest.raises(UsageError, match="cannot merge spearman: a corpus-level score"):
        merge([first, corpus])


def test_a_method_failed_in_one_part_is_failed_in_the_merge(runs):
    first, second = Result.load(runs["first"]), Result.load(runs["second"])
    broken = second.methods["rollout"]
    broken.status, broken.error = "failed", "RuntimeError: boom"
    broken.scores, broken.per_example, broken.evaluators = {}, {}, {}
    merged = merge([first, second])
    assert (merged.methods["rollout"].status, merged.methods["rollout"].error) == (
        "failed",
        "RuntimeError: boom",
    )
    assert merged.methods["attention"].status == "ok"
