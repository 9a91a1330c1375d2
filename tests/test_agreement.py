"""Agreement between methods (Krishna et al. 2022): the vectorised measures against a pure-Python
loop written from the paper's definitions, the tally and its summaries, and a run end to end
(JSON, schema, cache, reports, check)."""

from __future__ import annotations

import json
import math
from itertools import combinations

import numpy as np
import pytest
from scipy.stats import spearmanr

import attrib_bench
from attrib_bench.core.errors import UsageError
from attrib_bench.results.agreement import (
    MEASURES,
    Agreement,
    AgreementTally,
    example_agreement,
    summarize_columns,
)
from attrib_bench.results.stats import summarize
from attrib_bench.results.typed import Result, validate

METHODS = "attention,rollout,saliency,random"


def loop_reference(a: list[float], b: list[float], k: int) -> dict[str, float]:
    """The paper's definitions, one feature at a time: rank = place by |score|, ties to the
    earlier position; k capped at the number of features; Spearman of the magnitudes."""
    n = len(a)
    k = min(k, n)

    def ranking(scores: list[float]) -> list[int]:
        return sorted(range(n), key=lambda i: (-abs(scores[i]), i))[:k]

    def sign(value: float) -> int:
        return (value > 0) - (value < 0)

    top_a, top_b = ranking(a), ranking(b)
    shared = set(top_a) & set(top_b)
    same_rank = [r for r in range(k) if top_a[r] == top_b[r]]
    if len(set(map(abs, a))) > 1 and len(set(map(abs, b))) > 1:
        correlation = float(spearmanr([abs(x) for x in a], [abs(x) for x in b]).statistic)
    else:
        correlation = math.nan
    return {
        "feature": len(shared) / k,
        "rank": len(same_rank) / k,
        "sign": sum(sign(a[i]) == sign(b[i]) for i in shared) / k,
        "signed_rank": sum(sign(a[top_a[r]]) == sign(b[top_b[r]]) for r in same_rank) / k,
        "rank_correlation": correlation,
    }


def check_against_loop(rows: list[list[float]], k: int) -> None:
    matrix = example_agreement(np.array(rows, dtype=float), k)
    for i, j in combinations(range(len(rows)), 2):
        expected = loop_reference(rows[i], rows[j], k)
        for m, measure in enumerate(MEASURES):
            got = matrix[i, j, m]
            if math.isnan(expected[measure]):
                assert math.isnan(got), (measure, rows[i], rows[j])
            else:
                assert got == pytest.approx(expected[measure], abs=1e-12), (measure, i, j)
            assert got == pytest.approx(matrix[j, i, m], nan_ok=True)  # symmetric


def test_hand_made_rows_match_the_definitions():
    # Same top 2, opposite signs: features and ranks agree, signs never.
    values = example_agreement(np.array([[3.0, -2.0, 1.0, 0.0], [-3.0, 2.0, 0.0, 1.0]]), k=2)
    assert values[0, 1, :4].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert values[0, 1, 4] == pytest.approx(0.8)  # |a| = 3 2 1 0, |b| = 3 2 0 1
    # Ties go to the earlier position: a's top 2 is {0, 1}, b's is (3, 0).
    ties = example_agreement(np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]]), k=2)
    assert ties[0, 1, 0] == 0.5 and ties[0, 1, 1] == 0.0
    assert math.isnan(ties[0, 1, 4])  # a constant explanation has no rank correlation
    # Magnitude, not signed value, ranks: -5 is the top feature of the first row.
    negative = example_agreement(np.array([[-5.0, 1.0, 2.0], [5.0, 2.0, 1.0]]), k=1)
    assert negative[0, 1, :4].tolist() == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("k", [1, 3, 5, 50])  # 50: more than any row has
def test_random_rows_with_ties_and_signs_match_the_loop(k):
    rng = np.random.default_rng(k)
    for _ in range(40):
        n = int(rng.integers(1, 12))
        # Small integers: many ties in |score|, zeros and negative scores.
        rows = rng.integers(-3, 4, size=(4, n)).astype(float).tolist()
        check_against_loop(rows, k)


def test_a_method_agrees_with_itself_and_no_feature_is_undefined():
    rows = np.array([[0.3, -0.1, 0.2, 0.0], [1.0, 2.0, 3.0, 4.0]])
    values = example_agreement(np.vstack([rows, rows]), k=3)
    for i in range(2):  # the copies agree perfectly
        assert values[i, i + 2].tolist() == pytest.approx([1.0] * len(MEASURES))
    assert np.isnan(example_agreement(np.zeros((3, 0)), k=5)).all()


def test_tally_section_summarises_each_pair_and_drops_failed_methods():
    rng = np.random.default_rng(0)
    methods = ["a", "b", "c"]
    tally = AgreementTally(methods, k=2)
    ids = [f"e{i}" for i in range(8)]
    expected: dict[tuple[str, str], list[dict]] = {}
    for index, example in enumerate(ids):
        n = int(rng.integers(2, 6))
        rows = {m: rng.normal(size=n + 2) for m in methods}
        if index == 5:
            rows.pop("c")  # c failed from here on
        features = np.r_[False, np.ones(n, dtype=bool), False]  # [CLS] ... [SEP]
        tally.add(example, rows, features)
        for a, b in combinations(methods, 2):
            if a in rows and b in rows:
                reference = loop_reference(
                    rows[a][features].tolist(), rows[b][features].tolist(), 2
                )
                expected.setdefault((a, b), []).append(reference)
    section = tally.section(["a", "b"], ids, seed=0)
    assert section["methods"] == ["a", "b"] and section["k"] == 2
    assert [(p["a"], p["b"]) for p in section["pairs"]] == [("a", "b")]
    scores = section["pairs"][0]["scores"]
    for measure in MEASURES:
        values = np.array([r[measure] for r in expected[("a", "b")]])
        reference = summarize(values, seed=0)
        assert scores[measure]["mean"] == pytest.approx(reference["mean"], nan_ok=True)
        assert scores[measure]["ci95"] == pytest.approx(reference["ci95"], nan_ok=True)
        assert (scores[measure]["n"], scores[measure]["nan"]) == (reference["n"], reference["nan"])
    # With every method: a's pairs with c hold the five examples before c failed.
    full = tally.section(methods, ids, seed=0)
    with_c = next(p for p in full["pairs"] if (p["a"], p["b"]) == ("a", "c"))
    assert with_c["scores"]["feature"]["n"] == 7 and with_c["scores"]["feature"]["nan"] == 1
    matrix = Agreement.from_json(full).matrix("feature")
    assert np.allclose(matrix, matrix.T) and np.diag(matrix).tolist() == [1.0, 1.0, 1.0]


def test_summarize_columns_equals_summarize_per_column():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(30, 6))
    values[[2, 7], 1] = np.nan
    values[[2, 7], 4] = np.nan  # the same rows: one shared resampling
    values[:, 5] = np.nan  # nothing defined
    values[1:, 3] = np.nan  # one value: no spread, no CI
    for column, got in enumerate(summarize_columns(values, seed=3)):
        expected = summarize(values[:, column], seed=3)
        for key in ("mean", "std", "ci95"):
            assert got[key] == pytest.approx(expected[key], nan_ok=True), (column, key)
        assert (got["n"], got["nan"]) == (expected["n"], expected["nan"])


def test_validator_names_a_malformed_agreement_section(tmp_path):
    document = json.loads(_run(tmp_path, limit=3).read_text())
    document["agreement"]["k"] = 0
    with pytest.raises(UsageError, match=r"agreement\.k must be an integer >= 1"):
        validate(document, "bad.json")
    document["agreement"]["k"] = 5
    document["agreement"]["pairs"][0]["a"] = "unknown"
    with pytest.raises(UsageError, match=r"agreement\.pairs\[0\]\.a"):
        validate(document, "bad.json")


def _run(tmp_path, limit: int = 6, **settings) -> object:
    from attrib_bench.testing.conformance import save_tiny_model

    model = tmp_path / "model"
    if not model.exists():
        save_tiny_model(model, "bert")
    output = tmp_path / f"result-{len(list(tmp_path.glob('result-*')))}.json"
    attrib_bench.run(
        model=str(model),
        dataset="default",
        limit=limit,
        attributors=METHODS.split(","),
        batch_size=4,
        output=output,
        **settings,
    )
    return output


def test_run_end_to_end_json_cache_reports_and_check(tiny_bert, run_cli, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from attrib_bench.runner.cache import cached_rows

    monkeypatch.delenv("ATTRIB_BENCH_NO_CACHE")  # the rows are checked in the cache entries

    output = tmp_path / "result.json"
    code, _, err = run_cli(
        "run", "--model", tiny_bert, "--dataset", "default", "--limit", "6",
        "--attributors", METHODS, "--batch-size", "4", "--quiet", "--output", output,
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(output.read_text())
    section = document["agreement"]
    specs = METHODS.split(",")
    assert section["k"] == 5 and section["methods"] == specs
    assert [(p["a"], p["b"]) for p in section["pairs"]] == list(combinations(specs, 2))

    # Every pair's means are the loop reference over the rows the run cached, over the real
    # tokens that are not special, on the last aggregated row.
    special = set(AutoTokenizer.from_pretrained(tiny_bert).all_special_tokens)
    for pair in section["pairs"]:
        per_example = []
        for example in document["example_ids"]:
            rows = [cached_rows(document, spec, example) for spec in (pair["a"], pair["b"])]
            keep = [t not in special for t in rows[0]["tokens"]]
            a, b = (
                [v for v, k in zip(r["rows"]["aggregated"][-1], keep, strict=True) if k]
                for r in rows
            )
            per_example.append(loop_reference(a, b, 5))
        for measure in MEASURES:
            expected = summarize(np.array([r[measure] for r in per_example]), seed=0)
            got = pair["scores"][measure]
            assert got["mean"] == pytest.approx(expected["mean"], nan_ok=True), measure
            assert got["ci95"] == pytest.approx(expected["ci95"], nan_ok=True), measure

    jsonschema = pytest.importorskip("jsonschema")
    from attrib_bench.results import SCHEMA_PATH

    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(document)
    assert Result.load(output).to_document()["agreement"] == section

    # A rerun reads every example from the cache and gives the same matrix.
    again = tmp_path / "again.json"
    code, _, err = run_cli(
        "run", "--model", tiny_bert, "--dataset", "default", "--limit", "6",
        "--attributors", METHODS, "--batch-size", "4", "--quiet", "--output", again,
    )  # fmt: skip
    rerun = json.loads(again.read_text())
    assert code == 0 and set(rerun["cache"]["hits"].values()) == {6}
    assert rerun["agreement"] == section

    html, markdown = tmp_path / "report.html", tmp_path / "report.md"
    code, _, err = run_cli("report", output, "--html", html, "--markdown", markdown)
    assert code == 0, err
    page = html.read_text()
    assert "<h2>Agreement between methods</h2>" in page
    for measure in MEASURES:
        assert f'<table class="agreement" data-measure="{measure}">' in page
    feature = Agreement.from_json(section).summary("feature", "attention", "rollout")
    assert f">{feature['mean']:.3f}</td>" in page
    assert "feature agreement at top 5" in markdown.read_text()
    code, _, err = run_cli("check", output, "--baseline", again)
    assert code == 0, err


def test_agreement_k_is_a_run_setting_and_zero_turns_it_off(tmp_path):
    with_k = json.loads(_run(tmp_path, limit=3, agreement_k=2).read_text())
    assert with_k["agreement"]["k"] == 2 and with_k["config"]["agreement_k"] == 2
    off = json.loads(_run(tmp_path, limit=3, agreement_k=0).read_text())
    assert "agreement" not in off
    with pytest.raises(UsageError, match="agreement_k must be at least 0"):
        _run(tmp_path, limit=3, agreement_k=-1)


def test_the_tally_frees_each_examples_rows_computed_or_cached(tiny_bert, monkeypatch):
    """Only per-example agreement is held: rows read for it are dropped unless the run keeps
    them (``keep_rows``, for runs over several models)."""
    from attrib_bench.runner.engine import run_single
    from attrib_bench.runner.state import RunConfig

    monkeypatch.delenv("ATTRIB_BENCH_NO_CACHE")
    config = RunConfig(
        model=str(tiny_bert), dataset="default", limit=5, attributors=["attention"], batch_size=2
    )
    computed = run_single(config, quiet=True)
    restored = run_single(config, quiet=True)  # every example from the cache
    assert set(restored.document()["cache"]["hits"].values()) == {5}
    for run in (computed, restored):
        assert all(method.rows == {} for method in run.methods)
        assert len(run.agreement.values) == 5
    assert restored.document()["agreement"] == computed.document()["agreement"]
    kept = run_single(config, quiet=True, keep_rows=True)
    assert all(len(method.rows) == 5 for method in kept.methods)


def test_agreement_k_from_the_command_line_and_a_config_file(run_cli, tiny_bert, tmp_path):
    output = tmp_path / "flag.json"
    code, _, err = run_cli(
        *("run", "--model", tiny_bert, "--attributors", "attention,rollout", "--limit", "3"),
        *("--agreement-k", "2", "--quiet", "--output", output),
    )
    assert code == 0, err
    assert json.loads(output.read_text())["agreement"]["k"] == 2
    config = tmp_path / "bench.toml"
    config.write_text(f'model = "{tiny_bert}"\nattributors = ["attention"]\nagreement_k = 0\n')
    code, _, err = run_cli("run", "--config", config, "--limit", "3", "--quiet", "--output", output)
    assert code == 0, err
    assert "agreement" not in json.loads(output.read_text())
    code, _, err = run_cli("run", "--model", tiny_bert, "--agreement-k", "-1", "--quiet")
    assert code == 2 and "agreement_k must be at least 0" in err
