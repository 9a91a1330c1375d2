"""Paired comparison of methods: the paired bootstrap against a loop reference and scipy, the
result's ``paired`` section, and the leaderboard marker end to end through the CLI."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import numpy as np
import pytest
from scipy.stats import bootstrap

from attrib_bench.core.errors import UsageError
from attrib_bench.reports.leaderboard import NOT_AHEAD, next_row_differences
from attrib_bench.results.paired import (
    paired_bootstrap,
    paired_differences,
    paired_section,
)
from attrib_bench.results.stats import bootstrap_ci
from attrib_bench.results.typed import Result, validate

#: ``attention`` twice (residual 0 is its default): the same scores under two specs.
METHODS = "saliency,attention,attention:residual=0.0,random"


def loop_reference(a: list[float], b: list[float], seed: int, resamples: int = 1000) -> dict:
    """Resample the examples both scored, the same indices for both methods, one mean at a time;
    two-sided p from the share of resampled means on each side of 0, add-one corrected."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
    n = len(pairs)
    drawn = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    estimates = []
    for rows in drawn:
        first = sum(pairs[i][0] for i in rows) / n
        second = sum(pairs[i][1] for i in rows) / n
        estimates.append(first - second)
    low, high = np.percentile(estimates, [2.5, 97.5])
    below = sum(e <= 0 for e in estimates)
    above = sum(e >= 0 for e in estimates)
    return {
        "mean": sum(x - y for x, y in pairs) / n,
        "ci95": [low, high],
        "p": min(1.0, 2 * (min(below, above) + 1) / (resamples + 1)),
        "n": n,
    }


def test_paired_bootstrap_matches_the_loop_reference_and_drops_nan_pairs():
    rng = np.random.default_rng(0)
    for shift in (0.0, 0.02, 0.3):
        a = rng.normal(size=40)
        b = a - shift + rng.normal(scale=0.2, size=40)
        a[3], b[7] = math.nan, math.nan  # either undefined: the example leaves the pair
        got = paired_bootstrap(a, b, seed=5)
        expected = loop_reference(a.tolist(), b.tolist(), seed=5)
        assert got["n"] == expected["n"] == 38
        assert got["mean"] == pytest.approx(expected["mean"])
        assert got["ci95"] == pytest.approx(expected["ci95"], abs=1e-12)
        # The CI may be off by a resample count near the edges only through rounding: p exact.
        assert got["p"] == pytest.approx(expected["p"])
        defined = ~(np.isnan(a) | np.isnan(b))
        assert got["ci95"] == pytest.approx(bootstrap_ci(a[defined] - b[defined], 5), abs=1e-12)


def test_the_interval_agrees_with_scipys_paired_percentile_bootstrap():
    rng = np.random.default_rng(1)
    a = rng.normal(size=200)
    b = a - 0.1 + rng.normal(scale=0.5, size=200)
    got = paired_bootstrap(a, b, seed=0)
    scipy_ci = bootstrap(
        (a, b),
        lambda x, y: np.mean(x - y),
        paired=True,
        vectorized=False,
        method="percentile",
        n_resamples=1000,
        random_state=0,
    ).confidence_interval
    width = scipy_ci.high - scipy_ci.low
    assert abs(got["ci95"][0] - scipy_ci.low) < 0.1 * width
    assert abs(got["ci95"][1] - scipy_ci.high) < 0.1 * width


def test_a_clearly_better_method_is_significant_and_a_copy_is_not():
    rng = np.random.default_rng(2)
    worse = rng.uniform(size=30)
    better = worse + 0.3 + rng.normal(scale=0.05, size=30)
    clear = paired_bootstrap(better, worse, seed=0)
    assert clear["p"] < 0.05 and clear["ci95"][0] > 0
    assert clear["p"] == pytest.approx(2 / 1001)  # every resampled mean above 0
    noise = paired_bootstrap(worse, worse[::-1], seed=0)  # same values, unrelated order
    assert noise["p"] >= 0.05 and noise["ci95"][0] < 0 < noise["ci95"][1]
    copy = paired_bootstrap(worse, worse.copy(), seed=0)
    assert copy == {"mean": 0.0, "ci95": [0.0, 0.0], "p": 1.0, "n": 30}
    one = paired_bootstrap(np.array([1.0, math.nan]), np.array([0.0, 1.0]), seed=0)
    assert one["n"] == 1 and one["mean"] == 1.0 and math.isnan(one["p"])


def test_columns_defined_on_different_examples_each_get_their_own_pairs():
    rng = np.random.default_rng(3)
    d = rng.normal(loc=0.1, size=(25, 4))
    d[[1, 2], 0] = math.nan
    d[[1, 2], 2] = math.nan
    d[5, 3] = math.nan
    for column, entry in enumerate(paired_differences(d, seed=4)):
        alone = paired_bootstrap(d[:, column], np.zeros(25), seed=4)
        assert entry["n"] == alone["n"] and entry["p"] == alone["p"]
        assert entry["mean"] == pytest.approx(alone["mean"])
        assert entry["ci95"] == pytest.approx(alone["ci95"], abs=1e-12)


def test_the_section_compares_every_pair_and_skips_corpus_level_evaluators():
    def scores(*values):
        return [list(values)]

    per_example = {
        "a": {"spearman": {"aggregated": scores(0.9, 0.8, None, 0.7)}, "iou-f1": {}},
        "b": {"spearman": {"aggregated": scores(0.1, 0.2, 0.3, 0.1), "local": scores(1, 2, 3, 4)}},
        "c": {"spearman": {"aggregated": scores(0.1, 0.2, 0.3, 0.1)}},
    }
    per_example["a"]["iou-f1"] = {"aggregated": scores(1, 0, 1, 0)}
    per_example["b"]["iou-f1"] = {"aggregated": scores(0, 1, 0, 1)}
    section = paired_section(per_example, ["iou-f1"], seed=0)
    assert section["skipped"] == ["iou-f1"] and list(section["evaluators"]) == ["spearman"]
    aggregated = section["evaluators"]["spearman"]["aggregated"]
    assert [(e["a"], e["b"]) for e in aggregated] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert aggregated[0]["n"] == 3 and aggregated[0]["mean"] == pytest.approx((0.8 + 0.6 + 0.6) / 3)
    assert aggregated[2]["mean"] == 0.0 and aggregated[2]["p"] == 1.0
    assert "local" not in section["evaluators"]["spearman"]  # only b has local rows


def test_validator_names_a_malformed_paired_section():
    from test_check import document

    doc = document({"a": [0.1, 0.5, 0.2], "b": [0.3, 0.2, 0.4]})
    entry = {"a": "a", "b": "b", "mean": 0.1, "ci95": [0.0, 0.2], "p": 0.5, "n": 3}
    doc["paired"] = {"alpha": 0.05, "evaluators": {"spearman": {"aggregated": [entry]}}}
    validate(doc, "ok.json")
    doc["paired"]["evaluators"]["spearman"]["aggregated"][0]["p"] = "0.5"
    with pytest.raises(UsageError, match=r"paired\.evaluators\['spearman'\]\.aggregated\[0\]\.p"):
        validate(doc, "bad.json")
    doc["paired"]["evaluators"]["spearman"] = {"rollout": []}
    with pytest.raises(UsageError, match="keyed by 'aggregated' or 'local'"):
        validate(doc, "bad.json")


def test_run_end_to_end_marks_rows_not_ahead_of_the_next(tiny_bert, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    output = tmp_path / "result.json"
    code, out, err = run_cli(
        "run", "--model", tiny_bert, "--dataset", "default", "--limit", "6",
        "--attributors", METHODS, "--batch-size", "4", "--quiet", "--output", output,
        "--evaluators", "spearman,iou-f1",  # the default data has rationales
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(output.read_text())
    section = document["paired"]
    # ERASER's macro F1 aggregates parts the result does not keep: not compared per example.
    assert section["skipped"] == ["iou-f1"] and list(section["evaluators"]) == ["spearman"]
    corpus = out[out.index("iou-f1 (aggregated") :]
    assert "vs next" not in corpus and NOT_AHEAD not in corpus
    entries = {(e["a"], e["b"]): e for e in section["evaluators"]["spearman"]["aggregated"]}
    specs = METHODS.split(",")
    assert len(entries) == len(specs) * (len(specs) - 1) // 2
    copy = entries[("attention", "attention:residual=0.0")]
    assert copy["mean"] == 0.0 and copy["ci95"] == [0.0, 0.0] and copy["p"] == 1.0
    assert entries[("saliency", "random")]["p"] < 0.05  # the reference against itself is 1
    # Each entry is the paired bootstrap of the two methods' per-example scores.
    methods = document["methods"]
    for (a, b), entry in entries.items():
        rows = [
            np.array(methods[s]["per_example"]["spearman"]["aggregated"][-1], dtype=float)
            for s in (a, b)
        ]
        expected = paired_bootstrap(*rows, seed=0)
        assert entry["p"] == pytest.approx(expected["p"], nan_ok=True)
        assert entry["mean"] == pytest.approx(expected["mean"])

    # The terminal: a "vs next" column whose marker follows the JSON's p, and its caption.
    table = out[: out.index("iou-f1 (aggregated")]  # spearman's aggregated rows
    rows = [line.split("│") for line in table.splitlines() if line.startswith("│ ")]
    header = next(line for line in table.splitlines() if "method" in line)
    assert "vs next" in header and "not significantly ahead of it (p >= 0.05)" in table
    order = [cells[1].strip() for cells in rows]
    for cells, (spec, following) in zip(rows, pairwise(order), strict=False):
        p = entries.get((spec, following), entries.get((following, spec)))["p"]
        marked = cells[5].strip().endswith(NOT_AHEAD)
        assert marked == (p >= 0.05), (spec, following, p)
        assert cells[5].strip().startswith(f"{p:.3f}")
    first = order.index("attention")
    assert order[first + 1] == "attention:residual=0.0"
    assert rows[first][5].strip() == f"1.000 {NOT_AHEAD}"

    result = Result.load(output)
    assert result.to_document()["paired"] == section
    differences = next_row_differences(result, "spearman", "aggregated")
    assert [row["spec"] for row in differences] == order[:-1]

    jsonschema = pytest.importorskip("jsonschema")
    from attrib_bench.results import SCHEMA_PATH

    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(document)

    html, markdown = tmp_path / "report.html", tmp_path / "report.md"
    code, _, err = run_cli("report", output, "--html", html, "--markdown", markdown)
    assert code == 0, err
    page = html.read_text()
    assert '<table class="paired">' in page and "not significantly ahead" in page
    text = markdown.read_text()
    assert "Rank i against rank i + 1" in text
    assert "| `attention` | `attention:residual=0.0` | +0.000 | [+0.000, +0.000] | 1.000 |" in text
    code, _, err = run_cli("check", output, "--baseline", output)
    assert code == 0, err


def test_mutated_sections_give_a_usage_error_or_a_report(tmp_path):
    """The fuzz of test_result_fuzz, aimed at the ``paired`` and ``agreement`` sections."""
    import copy
    import random

    from test_result_fuzz import WRONG, answers, places, valid

    from attrib_bench.reports.html import _agreement_html, _next_rows_html
    from attrib_bench.reports.markdown import _agreement, _next_rows
    from attrib_bench.results.agreement import AgreementTally
    from attrib_bench.results.typed import as_result

    base = valid(tmp_path)
    specs = list(base["methods"])
    base["paired"] = paired_section(
        {s: m["per_example"] for s, m in base["methods"].items()}, [], 0
    )
    tally = AgreementTally(specs, k=2)
    for index, example in enumerate(base["example_ids"]):
        rows = {s: np.array([0.1 * index, -0.2 * len(s), 0.3]) for s in specs}
        tally.add(example, rows, np.ones(3, dtype=bool))
    base["agreement"] = tally.section(specs, base["example_ids"], seed=0)

    def render(document):
        result = as_result(document)  # the sections' own rendering, without the plots
        _agreement_html(result)
        _agreement(result)
        for kind in ("aggregated", "local"):
            _next_rows_html(result, "spearman", kind)
            _next_rows(result, "spearman", kind)

    render(base)
    assert _next_rows(as_result(base), "spearman", "aggregated") and _agreement(as_result(base))
    rng = random.Random(0)
    for _ in range(150):
        mutant = copy.deepcopy(base)
        section = rng.choice(["paired", "agreement"])
        path = rng.choice(places(mutant[section]))
        parent, key = mutant, section
        for step in path:
            parent, key = parent[key], step
        if isinstance(parent, dict) and rng.random() < 0.3:
            del parent[key]
        else:
            parent[key] = rng.choice(WRONG)
        answers(render, mutant)
