"""The typed result: it reads and writes the JSON unchanged, a malformed file is one line naming
the field (checked against the JSON Schema), and runs over disjoint examples merge into the run
over all of them."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_check import document as small_document

from attrib_bench.core.errors import UsageError
from attrib_bench.results import Result, merge
from attrib_bench.results.typed import validate
from attrib_bench.runner.cache import NO_CACHE_ENV

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
    patch.delenv(NO_CACHE_ENV, raising=False)
    for name, part in (("whole", rows), ("first", rows[:3]), ("second", rows[3:])):
        data = write_tsv(folder / f"{name}.tsv", part)
        outputs[name] = folder / f"{name}.json"
        cache = [] if name == "whole" else ["--no-cache"]  # the whole run's rows: heatmaps
        code = main(
            ["run", "--model", str(tiny_bert), "--dataset", str(data), "--batch-size", "1",
             "--attributors", "attention,rollout,saliency",
             "--evaluators", "spearman,comprehensiveness:ratios=0.2/0.5",
             *cache, "--quiet", "--output", str(outputs[name])]
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


def test_a_result_shows_its_leaderboards_and_heatmaps_in_a_notebook(runs):
    from attrib_bench.reports.html import notebook_html  # installs the view

    small = Result.from_document(small_document({"a": [0.1, 0.5, 0.9], "b:x=1": [0.3, 0.2, 0.4]}))
    html = small._repr_html_()
    assert "Leaderboard: spearman vs saliency (aggregated rows)" in html
    for spec, mean in (("a", "+0.500"), ("b:x=1", "+0.300")):
        assert f'<td><code>{spec}</code></td><td class="num">{mean}</td>' in html, html
    assert "Token heatmaps" not in html  # no cache: no token rows at hand
    assert "<html" not in html and "<style" not in html  # a notebook cell, not a page

    result = Result.load(runs["whole"])  # a run with its cache entries
    html = result._repr_html_()
    assert html == notebook_html(result)
    for spec, method in result.methods.items():
        assert f"<code>{spec}</code>" in html and f"{method.score('spearman').mean:+.3f}" in html
    heatmaps = html[html.index("<h2>Token heatmaps</h2>") :]
    assert heatmaps.count('<span class="tok"') > len(result.methods)


def test_a_result_from_the_facade_shows_itself_in_a_fresh_process(runs):
    """``attrib_bench.load`` in a new notebook: no report imported by hand, the view is there."""
    probe = (
        "import sys, attrib_bench; "
        f"html = attrib_bench.load({str(runs['whole'])!r})._repr_html_(); "
        "print(html is not None and '<code>rollout</code>' in html)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


def _set(*path: Any, to: Any) -> Callable[[dict], None]:
    """A change of the document: the value at ``path`` becomes ``to``."""

    def change(document: dict) -> None:
        for step in path[:-1]:
            document = document[step]
        document[path[-1]] = to

    return change


def _delete(*path: Any) -> Callable[[dict], None]:
    def change(document: dict) -> None:
        for step in path[:-1]:
            document = document[step]
        del document[path[-1]]

    return change


SUMMARY = ("methods", "rollout", "scores", "spearman", "aggregated", 0)
ROW = ("methods", "rollout", "per_example", "spearman", "aggregated", 0)
CACHE = {"dir": "c", "methods": {"rollout": "ab"}, "examples": {}, "hits": {}}
#: A change to a run's result file, and the field and reason its one-line error gives.
MALFORMED = [
    # the schema's checks the hand-written validator did not make
    (
        _set("provenance", "model", "weights_sha256", to="xyz"),
        "provenance.model.weights_sha256 must be a SHA-256 hex digest, not 'xyz'",
    ),
    (
        _set("target", "position", to="middle"),
        "target.position must be 'first' or 'last', not 'middle'",
    ),
    (_delete("provenance", "python"), "provenance has no 'python'"),
    (_delete(*SUMMARY, "std"), "methods['rollout'].scores['spearman'].aggregated[0] has no 'std'"),
    (
        _set("target", "foil", to="x"),
        "target.foil must be an integer >= 0 or 'example' or null, not 'x'",
    ),
    # the hand-written validator's checks, now the schema's
    (_delete("created"), "the result has no 'created'"),
    (
        _set(*SUMMARY, "n", to=-1),
        "methods['rollout'].scores['spearman'].aggregated[0].n must be an integer >= 0, not -1",
    ),
    (
        _set(*SUMMARY, "ci95", to=[0.1]),
        "methods['rollout'].scores['spearman'].aggregated[0].ci95 must be an array of 2, not [0.1]",
    ),
    (
        _set("methods", "rollout", "status", to="done"),
        "methods['rollout'].status must be 'ok' or 'failed', not 'done'",
    ),
    (
        _set("methods", "rollout", "scores", "spearman", "middle", to=[]),
        "methods['rollout'].scores['spearman'] must be keyed by 'aggregated' or 'local', "
        "not 'middle'",
    ),
    (
        _set(*ROW, 2, to="0.5"),
        "methods['rollout'].per_example['spearman'].aggregated[0][2] must be a number or null, "
        "not '0.5'",
    ),
    (_set("methods", to={}), "methods must be an object with at least 1 entry, not {}"),
    (
        _set("evaluator_info", "spearman", "higher_is_better", to="yes"),
        "evaluator_info['spearman'].higher_is_better must be true or false, not 'yes'",
    ),
    (_set("agreement", "k", to=0), "agreement.k must be an integer >= 1, not 0"),
    (_set("paired", "alpha", to=None), "paired.alpha must be a number, not None"),
    (
        _set("cache", to={**CACHE, "methods": {"rollout": "../x"}}),
        "cache.methods['rollout'] must be a hex cache key, not '../x'",
    ),
    (
        _set("cache", to={**CACHE, "dir": "c\0"}),
        "cache.dir must be a path (no NUL character), not 'c\\x00'",
    ),
    # across fields: what the schema cannot say
    (
        _set(*ROW, to=[0.5]),
        "methods['rollout'].per_example['spearman'].aggregated[0] must be an array of 6 "
        "(one per example id), not [0.5]",
    ),
    (
        _set("model_right", to=[True]),
        "model_right must be an array of 6 (one per example id), not [True]",
    ),
    (
        _set("agreement", "pairs", 0, "a", to="lime"),
        "agreement.pairs[0].a must be 'attention' or 'rollout' or 'saliency' or 'random', "
        "not 'lime'",
    ),
    (
        _set("agreement", "measures", to=["rank"]),
        "agreement.pairs[0].scores key must be 'rank', not 'feature'",
    ),
]


@pytest.mark.parametrize("change, message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_a_malformed_result_file_is_one_line_naming_the_file_and_the_field(
    runs, tmp_path, change, message
):
    document = json.loads(runs["whole"].read_text())
    change(document)
    path = tmp_path / "x.json"
    path.write_text(json.dumps(document))
    with pytest.raises(UsageError) as error:
        Result.load(path)
    assert str(error.value) == f"{str(path)!r} is not a valid attrib-bench result: {message}"
    with pytest.raises(UsageError) as error:  # a document built in memory: the same check
        validate(document, "results")
    assert str(error.value) == f"'results' is not a valid attrib-bench result: {message}"


def test_json_nan_is_an_undefined_score_and_infinity_or_a_huge_number_is_refused(runs, tmp_path):
    """Python's json reads the tokens NaN and Infinity; NaN stands for undefined in memory, as
    null does in the file, while no score is infinite or beyond a float."""
    document = json.loads(runs["whole"].read_text())
    summary = document["methods"]["rollout"]["scores"]["spearman"]["aggregated"][0]
    path = tmp_path / "x.json"
    summary["mean"] = math.nan
    path.write_text(json.dumps(document))  # the token NaN
    assert "NaN" in path.read_text()
    assert math.isnan(Result.load(path).methods["rollout"].score("spearman", layer=0).mean)
    field = "methods['rollout'].scores['spearman'].aggregated[0].mean"
    huge = 10**400
    for value, shown in ((math.inf, "inf"), (-math.inf, "-inf"), (huge, str(huge)[:37] + "...")):
        summary["mean"] = value
        path.write_text(json.dumps(document))  # Infinity, -Infinity, 400 digits
        with pytest.raises(UsageError) as error:
            Result.load(path)
        assert str(error.value) == (
            f"{str(path)!r} is not a valid attrib-bench result: {field} must be a number or "
            f"null, not {shown}"
        )


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
