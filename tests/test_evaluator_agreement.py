"""Agreement between evaluators: Kendall's tau between the method rankings two evaluators give,
against scipy and a bootstrap loop written from the definition on hand-made results; its
orientation, the schema, the typed round trip, the reports, merge, and a run end to end."""

from __future__ import annotations

import copy
import io
import json
import math
from itertools import combinations

import numpy as np
import pytest
from rich.console import Console
from scipy.stats import kendalltau

from attrib_bench.core.errors import UsageError
from attrib_bench.reports.evaluator_agreement import evaluator_agreement_tables
from attrib_bench.reports.html import render_html
from attrib_bench.reports.markdown import render_markdown
from attrib_bench.results.evaluator_agreement import (
    EvaluatorAgreement,
    evaluator_agreement_section,
)
from attrib_bench.results.merge import merge
from attrib_bench.results.typed import Result, validate

METHODS = ("a", "b", "c", "d", "e")
EXAMPLES = 12


def per_example_scores(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """evaluator -> method -> per-example scores: ``up`` (higher is better), ``down`` its
    lower-is-better mirror, ``noisy`` a noisy copy of up, ``reversed`` up negated (higher is
    better), ``other`` unrelated; a NaN example here and there."""
    rng = np.random.default_rng(seed)
    up = {m: rng.normal(0.15 * i, 0.3, EXAMPLES) for i, m in enumerate(METHODS)}
    up["c"][3] = math.nan
    scores = {
        "up": up,
        "down": {m: -v for m, v in up.items()},
        "noisy": {m: v + rng.normal(0, 0.4, EXAMPLES) for m, v in up.items()},
        "reversed": {m: -v for m, v in up.items()},
        "other": {m: rng.uniform(size=EXAMPLES) for m in METHODS},
    }
    scores["other"]["d"][:] = math.nan  # undefined on every example: left out of its pairs
    return scores


INFO = {
    "up": {"higher_is_better": True, "needs_reference": False},
    "down": {"higher_is_better": False, "needs_reference": False},
    "noisy": {"higher_is_better": True, "needs_reference": False},
    "reversed": {"higher_is_better": True, "needs_reference": False},
    "other": {"higher_is_better": True, "needs_reference": True},
}


def hand_made(scores: dict[str, dict[str, np.ndarray]], ids: list[str] | None = None) -> dict:
    """A valid result document holding ``scores`` (last layer = the only layer), with its
    ``evaluator_agreement`` section computed as a run computes it."""
    from test_check import document

    first = next(iter(scores))
    doc = document({m: [None] * EXAMPLES for m in METHODS}, ids=ids, evaluator=first)
    doc["evaluators"] = {name: {"status": "ok", "error": None} for name in scores}
    doc["evaluator_info"] = {name: dict(INFO[name]) for name in scores}
    for spec, method in doc["methods"].items():
        for name, by_method in scores.items():
            values = by_method[spec]
            finite = values[~np.isnan(values)]
            summary = {
                "layer": 1,
                "mean": float(finite.mean()) if len(finite) else None,
                "std": 0.0,
                "ci95": [0.0, 0.0],
                "n": len(finite),
                "nan": int(np.isnan(values).sum()),
            }
            rows = [[None if math.isnan(v) else float(v) for v in values]]
            method["scores"][name] = {"aggregated": [summary]}
            method["per_example"][name] = {"aggregated": rows}
            method.setdefault("evaluators", {})[name] = {"status": "ok", "error": None}
    ran = {spec: m["per_example"] for spec, m in doc["methods"].items()}
    doc["reference"] = "e"  # a method of the run, left out where an evaluator reads it
    doc["evaluator_agreement"] = evaluator_agreement_section(ran, doc["evaluator_info"], {"e"}, 0)
    return doc


def oriented_means(scores: dict[str, dict[str, np.ndarray]], rows: np.ndarray | None = None):
    """evaluator -> the methods' means over ``rows`` (all examples: None), NaN left out, times
    -1 where lower is better; the reference ``e`` NaN under evaluators that compare with it."""
    out = {}
    for name, by_method in scores.items():
        sign = 1.0 if INFO[name]["higher_is_better"] else -1.0
        means = []
        for spec in METHODS:
            values = by_method[spec] if rows is None else by_method[spec][rows]
            undefined = np.isnan(values).all() or (INFO[name]["needs_reference"] and spec == "e")
            means.append(math.nan if undefined else sign * float(np.nanmean(values)))
        out[name] = np.array(means)
    return out


def scipy_tau(x: np.ndarray, y: np.ndarray) -> float:
    both = ~(np.isnan(x) | np.isnan(y))
    return float(kendalltau(x[both], y[both]).statistic) if both.sum() >= 2 else math.nan


def test_tau_is_scipys_between_the_oriented_summary_rankings():
    scores = per_example_scores()
    section = EvaluatorAgreement.from_json(hand_made(scores)["evaluator_agreement"])
    means = oriented_means(scores)
    names = list(scores)
    assert section.evaluators == {"aggregated": names}
    assert len(section.pairs["aggregated"]) == len(names) * (len(names) - 1) // 2
    for a, b in combinations(names, 2):
        pair = section.pair("aggregated", a, b)
        assert pair.tau == pytest.approx(scipy_tau(means[a], means[b]), abs=1e-12)
        assert pair == section.pair("aggregated", b, a)  # symmetric, either order
    # d is undefined under other, and the reference e is left out of other's ranking.
    for a in names[:-1]:
        pair = section.pair("aggregated", a, "other")
        assert pair.methods == 3 and pair.left_out == ("d", "e")
    assert section.pair("aggregated", "up", "noisy").methods == len(METHODS)


def test_orientation_a_mirror_agrees_fully_and_a_reversal_gives_minus_one():
    scores = per_example_scores()
    section = EvaluatorAgreement.from_json(hand_made(scores)["evaluator_agreement"])
    mirror = section.pair("aggregated", "up", "down")  # down = -up, lower is better
    assert mirror.tau == pytest.approx(1.0) and mirror.ci95 == pytest.approx((1.0, 1.0))
    assert not mirror.disagrees()
    reverse = section.pair("aggregated", "up", "reversed")  # -up, higher is better
    assert reverse.tau == pytest.approx(-1.0) and reverse.disagrees()
    assert section.pair("aggregated", "down", "reversed").tau == pytest.approx(-1.0)
    matrix = section.matrix("aggregated")
    assert np.allclose(matrix, matrix.T) and np.all(np.diag(matrix) == 1.0)
    assert ("up", "reversed") in {(p.a, p.b) for p in section.disagreeing("aggregated")}


def test_the_bootstrap_is_paired_over_examples_seeded_and_contains_the_estimate():
    scores = per_example_scores()
    document = hand_made(scores)
    ran = {spec: m["per_example"] for spec, m in document["methods"].items()}
    point = oriented_means(scores)
    for seed in (0, 5):
        section = EvaluatorAgreement.from_json(
            evaluator_agreement_section(ran, document["evaluator_info"], {"e"}, seed)
        )
        # From the definition: the draws of results.stats (default_rng(seed), 1000 x n), the
        # same examples for every evaluator and method, each mean recomputed, then scipy's tau.
        drawn = np.random.default_rng(seed).integers(0, EXAMPLES, size=(1000, EXAMPLES))
        wanted = {name: scores[name] for name in ("up", "noisy", "other")}
        resampled = [oriented_means(wanted, rows) for rows in drawn]
        for a, b in (("up", "noisy"), ("noisy", "other")):
            kept = ~(np.isnan(point[a]) | np.isnan(point[b]))
            taus = [scipy_tau(r[a][kept], r[b][kept]) for r in resampled]
            expected = np.nanpercentile(taus, [2.5, 97.5])
            pair = section.pair("aggregated", a, b)
            assert pair.ci95 == pytest.approx(tuple(expected), abs=1e-9)
            assert pair.ci95[0] <= pair.tau <= pair.ci95[1]
            assert pair.ci95[0] < pair.ci95[1]  # a real interval, not a constant
    assert hand_made(scores)["evaluator_agreement"] == document["evaluator_agreement"]


def test_the_section_validates_round_trips_and_bad_ones_are_usage_errors():
    document = hand_made(per_example_scores())
    validate(document, "ok.json")
    result = Result.from_document(document)
    assert isinstance(result.evaluator_agreement, EvaluatorAgreement)
    assert result.to_document()["evaluator_agreement"] == document["evaluator_agreement"]
    assert Result.from_document(json.loads(json.dumps(result.to_document()))) == result
    bad = copy.deepcopy(document)
    bad["evaluator_agreement"]["kinds"]["aggregated"]["pairs"][0]["a"] = "nowhere"
    with pytest.raises(UsageError, match=r"evaluator_agreement\.kinds\.aggregated\.pairs\[0\]\.a"):
        validate(bad, "bad.json")
    bad = copy.deepcopy(document)
    bad["evaluator_agreement"]["kinds"]["aggregated"]["pairs"][1]["tau"] = "0.5"
    with pytest.raises(UsageError, match=r"pairs\[1\]\.tau must be a number or null"):
        validate(bad, "bad.json")
    bad["evaluator_agreement"]["kinds"] = {"rows": {"evaluators": [], "pairs": []}}
    with pytest.raises(UsageError, match="'aggregated' or 'local'"):
        validate(bad, "bad.json")


def test_corpus_level_evaluators_are_skipped_and_one_evaluator_gives_no_kind():
    scores = per_example_scores()
    info = {**INFO, "up": {**INFO["up"], "corpus_level": True}}
    ran = {m: {n: {"aggregated": [list(v[m])]} for n, v in scores.items()} for m in METHODS}
    section = evaluator_agreement_section(ran, info, {"e"}, 0)
    assert section["skipped"] == ["up"] and "up" not in section["kinds"]["aggregated"]["evaluators"]
    alone = {m: {"noisy": {"aggregated": [list(scores["noisy"][m])]}} for m in METHODS}
    assert evaluator_agreement_section(alone, info, {"e"}, 0)["kinds"] == {}


def test_ties_and_two_methods_give_nan_or_a_tau_never_an_error():
    """tau-b is undefined where a side ranks every method alike (NaN, not a disagreement); two
    methods give +-1; a method drawn only on its undefined examples leaves that resample."""
    info = {name: {"higher_is_better": True, "needs_reference": False} for name in "xyz"}
    rows = {
        "a": {"x": [1.0, 1.0, 1.0, 1.0], "y": [0.9, 1.0, 0.8, 0.95], "z": [0.9, 0.8, 0.7, 0.6]},
        "b": {"x": [1.0, 1.0, 1.0, 1.0], "y": [0.5, 0.4, 0.3, 0.1], "z": [None, None, 0.1, None]},
    }
    ran = {m: {e: {"aggregated": [v]} for e, v in by.items()} for m, by in rows.items()}
    section = EvaluatorAgreement.from_json(evaluator_agreement_section(ran, info, (), 0))
    flat = section.pair("aggregated", "x", "y")
    assert math.isnan(flat.tau) and math.isnan(flat.ci95[0]) and flat.methods == 2
    assert not flat.disagrees() and section.disagreeing("aggregated") == []
    two = section.pair("aggregated", "y", "z")  # a above b under both
    assert two.tau == pytest.approx(1.0) and two.methods == 2
    assert two.ci95 == pytest.approx((1.0, 1.0))  # resamples without b under z left out


def test_the_reports_show_the_matrix_and_name_the_disagreeing_pairs():
    scores = per_example_scores()
    document = hand_made({name: scores[name] for name in ("up", "down", "reversed")})
    markdown = render_markdown(document)
    assert "## Agreement between evaluators (aggregated rows)" in markdown
    assert "| 1 | `up` | 1 | +1.00 [+1.00, +1.00] |" in markdown
    line = next(x for x in markdown.splitlines() if x.startswith("Disagree (tau <= 0"))
    assert "up vs reversed (tau -1.00" in line and "up vs down" not in line
    page = render_html(document)
    assert '<table class="evaluator-agreement" data-kind="aggregated">' in page
    assert 'class="num disagree"' in page and "up vs reversed (tau -1.00" in page
    console = Console(width=200, record=True)
    for table in evaluator_agreement_tables(Result.from_document(document)):
        console.print(table)
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert "Agreement between evaluators (aggregated rows)" in text and "1 up" in text
    assert "up vs reversed (tau -1.00" in text
    without = {k: v for k, v in document.items() if k != "evaluator_agreement"}
    assert "Agreement between evaluators" not in render_markdown(without)


def test_merging_two_parts_gives_the_section_of_the_whole():
    scores = per_example_scores()
    ids = [f"ex{i}" for i in range(EXAMPLES)]
    whole = hand_made(scores, ids)
    halves = [slice(0, 5), slice(5, EXAMPLES)]
    parts = []
    for part in halves:
        cut = {n: {m: v[part] for m, v in by.items()} for n, by in scores.items()}
        document = hand_made(cut, ids[part])
        document["config"]["limit"] = len(ids[part])
        parts.append(Result.from_document(document))
    merged = merge(parts).to_document()
    assert merged["evaluator_agreement"] == whole["evaluator_agreement"]


def check_taus_against_the_summaries(document: dict, evaluators: list[str], count: int) -> None:
    """Every pair's tau is scipy's between the leaderboard's last-layer means, oriented."""
    validate(document, "result")
    kind = document["evaluator_agreement"]["kinds"]["aggregated"]
    assert kind["evaluators"] == evaluators
    methods = document["methods"]
    for pair in kind["pairs"]:  # every method ranked: none of these reads the reference
        x, y = (
            np.array([m["scores"][e]["aggregated"][-1]["mean"] for m in methods.values()])
            * (1.0 if document["evaluator_info"][e]["higher_is_better"] else -1.0)
            for e in (pair["a"], pair["b"])
        )
        assert pair["methods"] == count == len(methods)
        assert pair["tau"] == pytest.approx(kendalltau(x, y).statistic, abs=1e-12, nan_ok=True)


def test_run_and_evaluate_rank_by_parametrised_evaluators_of_one_name(tiny_bert, run_cli, tmp_path):
    data = ("--model", tiny_bert, "--dataset", "default", "--limit", "4", "--quiet")
    evaluators = "comprehensiveness,comprehensiveness:ratios=0.5,sufficiency"
    methods = ("--attributors", "attention,saliency")
    output = tmp_path / "result.json"
    code, out, err = run_cli(
        "run", *data, *methods, "--batch-size", "4", "--output", output,
        "--evaluators", evaluators, "--agreement-k", "0",
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(output.read_text())
    assert set(document["methods"]) == {"attention", "saliency", "random"}
    check_taus_against_the_summaries(document, evaluators.split(","), 3)
    assert "Agreement between evaluators (aggregated rows)" in out
    # evaluate: scores from a file, the same section.
    attributions, scored = tmp_path / "mine.jsonl", tmp_path / "scored.json"
    assert run_cli("attribute", *data, *methods, "--output", attributions)[0] == 0
    code, out, err = run_cli(
        "evaluate", *data, "--attributions", attributions, "--output", scored,
        "--evaluators", evaluators,
    )  # fmt: skip
    assert code == 0, err
    check_taus_against_the_summaries(json.loads(scored.read_text()), evaluators.split(","), 2)
    assert "Agreement between evaluators (aggregated rows)" in out


def test_mutated_sections_give_a_usage_error_or_a_report():
    """The fuzz of test_result_fuzz, aimed at the ``evaluator_agreement`` section: a mutant is
    refused in one line or read and shown, never a traceback."""
    import random

    from test_result_fuzz import WRONG, answers, places

    from attrib_bench.reports.evaluator_agreement import (
        evaluator_agreement_html,
        evaluator_agreement_markdown,
    )
    from attrib_bench.results.typed import as_result

    base = hand_made(per_example_scores())

    def render(document: dict) -> None:
        result = as_result(document)
        evaluator_agreement_markdown(result)
        evaluator_agreement_html(result)
        for table in evaluator_agreement_tables(result):
            Console(width=200, file=io.StringIO()).print(table)

    render(base)
    rng = random.Random(0)
    for _ in range(100):
        mutant = copy.deepcopy(base)
        path = rng.choice(places(mutant["evaluator_agreement"]))
        parent, key = mutant, "evaluator_agreement"
        for step in path:
            parent, key = parent[key], step
        if isinstance(parent, dict) and rng.random() < 0.3:
            del parent[key]
        else:
            parent[key] = rng.choice(WRONG)
        answers(render, mutant)
