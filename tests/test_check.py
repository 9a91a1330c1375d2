"""The regression gate: the paired-bootstrap rule, what it reports, exit codes, end to end."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from attrib_bench.core.errors import ExitCode, UsageError
from attrib_bench.reports.gate import gate_markdown
from attrib_bench.results.compare import compare, paired_bootstrap
from attrib_bench.results.typed import load_results

N = 60


def document(
    scores: dict[str, list[float]],
    ids: list[str] | None = None,
    higher_is_better: bool = True,
    evaluator: str = "spearman",
) -> dict:
    """A minimal result document: one last-layer aggregated score per example and method."""
    ids = ids or [f"ex{i}" for i in range(len(next(iter(scores.values()))))]
    methods = {}
    for spec, values in scores.items():
        finite = [v for v in values if v is not None]
        mean = float(np.mean(finite)) if finite else math.nan
        summary = {"layer": 1, "mean": mean, "std": 0.0, "ci95": [0, 0]}
        methods[spec] = {
            "name": spec.partition(":")[0],
            "plugin": "test",
            "status": "ok",
            "error": None,
            "seconds_per_example": 0.01,
            "scores": {evaluator: {"aggregated": [{**summary, "n": len(finite), "nan": 0}]}},
            "per_example": {evaluator: {"aggregated": [list(values)]}},
        }
    return {
        "schema_version": 1,
        "created": "2026-01-01T00:00:00+00:00",
        "config": {"limit": len(ids), "batch_size": 16, "seed": 0},
        "provenance": {
            "packages": {},
            "python": "3.11",
            "model": {
                "name": "m",
                "id": "m",
                "type": "bert",
                "weights_sha256": "a" * 64,
                "fresh_head": False,
            },
            "dataset": {
                "name": "d",
                "split": "test",
                "fingerprint": "f",
                "examples": len(ids),
                "truncated": 0,
                "max_length": 128,
            },
            "seed": 0,
            "hardware": {"device": "cpu"},
        },
        "reference": "saliency",
        "evaluators": {evaluator: {"status": "ok", "error": None}},
        "evaluator_info": {evaluator: {"higher_is_better": higher_is_better}},
        "example_ids": ids,
        "methods": methods,
    }


@pytest.fixture
def scores() -> np.ndarray:
    return np.random.default_rng(0).uniform(0.2, 0.9, N)


def test_identical_results_pass_with_zero_deltas(scores):
    base = document({"a": list(scores), "b": list(scores[::-1])})
    comparison = compare(copy.deepcopy(base), base)
    assert comparison.passed and comparison.exit_code == ExitCode.OK
    assert [(r.method, r.delta, r.ci, r.n) for r in comparison.rows] == [
        ("a", 0.0, (0.0, 0.0), N),
        ("b", 0.0, (0.0, 0.0), N),
    ]


def test_a_clear_drop_is_a_regression(scores):
    noise = np.random.default_rng(1).normal(0, 0.02, N)
    base = document({"a": list(scores), "b": list(scores)})
    now = document({"a": list(scores - 0.1 + noise), "b": list(scores + noise)})
    comparison = compare(now, base, tolerance=0.02)
    assert comparison.exit_code == ExitCode.REGRESSION
    (regression,) = comparison.regressions
    assert regression.method == "a"
    assert regression.delta == pytest.approx(float(np.mean(noise - 0.1)))
    assert regression.ci[0] < regression.delta < regression.ci[1] < 0
    text = gate_markdown(comparison, "now.json", "base.json")
    assert text.startswith("## ❌ attrib-bench check: 1 regression(s)")
    assert "| `a` | spearman | aggregated | 1 |" in text and "❌ regression" in text


def test_a_drop_within_tolerance_or_within_noise_passes(scores):
    base = document({"a": list(scores), "b": list(scores)})
    # a: fell by 0.01 everywhere (CI far below 0) but less than the tolerance.
    # b: fell by 0.05 on average, but only because of a few examples: the CI straddles 0.
    b = scores.copy()
    b[:3] -= 1.0
    now = document({"a": list(scores - 0.01), "b": list(b)})
    comparison = compare(now, base, tolerance=0.02)
    assert comparison.passed, gate_markdown(comparison)
    rows = {r.method: r for r in comparison.rows}
    assert rows["a"].ci[1] < 0 and rows["a"].delta > -0.02
    assert rows["b"].delta < -0.02 and rows["b"].ci[1] >= 0
    assert "⚠️ worse, within noise" in gate_markdown(comparison)
    # The same drops gate with a zero tolerance only where the CI excludes zero.
    assert [r.method for r in compare(now, base, tolerance=0.0).regressions] == ["a"]


def test_lower_is_better_evaluators_regress_when_the_score_rises(scores):
    base = document({"a": list(scores)}, higher_is_better=False, evaluator="deletion")
    worse = document({"a": list(scores + 0.1)}, higher_is_better=False, evaluator="deletion")
    better = document({"a": list(scores - 0.1)}, higher_is_better=False, evaluator="deletion")
    assert compare(worse, base).exit_code == ExitCode.REGRESSION
    improved = compare(better, base)
    assert improved.passed and "✅ improved" in gate_markdown(improved)


def test_examples_are_paired_by_id_not_position(scores):
    ids = [f"ex{i}" for i in range(N)]
    base = document({"a": list(scores)}, ids)
    order = np.random.default_rng(2).permutation(N)
    now = document({"a": list(scores[order])}, [ids[i] for i in order])
    (row,) = compare(now, base).rows
    assert (row.delta, row.ci) == (0.0, (0.0, 0.0))

    # Only shared examples with a defined score in both files count.
    now = document({"a": [None, *list(scores[1:40])]}, ids[:40])
    (row,) = compare(now, base).rows
    assert row.n == 39 and row.delta == 0.0


def test_scores_that_became_undefined_fail_the_gate(scores):
    base = document({"a": list(scores + 0.2)})  # baseline mean about 0.75
    # Undefined on every example now: nothing is compared, and the gate must not pass.
    comparison = compare(document({"a": [None] * N}), base)
    assert comparison.exit_code == ExitCode.REGRESSION
    (row,) = comparison.regressions
    assert (row.n, row.undefined, row.undefined_rose) == (0, (0.0, 1.0), True)
    text = gate_markdown(comparison)
    assert text.startswith("## ❌ attrib-bench check: 1 regression(s)")
    assert "| 0 | 0% → 100% | ❌ undefined 0% → 100%; ❌ no example scored in both |" in text
    assert "no shared scores" not in text and "✅" not in text

    # Undefined on 55 of 60: the 5 left agree with the baseline, but the share rose.
    comparison = compare(document({"a": [None] * 55 + list(scores[55:] + 0.2)}), base)
    (row,) = comparison.regressions
    assert (row.n, row.delta) == (5, 0.0)
    assert "| 5 | 0% → 92% | ❌ undefined 0% → 92% |" in gate_markdown(comparison)

    # A rise within the tolerance passes; beyond it (here 2 of 60 > 0.02) it does not.
    one, two = list(scores), list(scores)
    one[0] = None
    two[:2] = [None, None]
    assert compare(document({"a": one}), document({"a": list(scores)})).passed
    assert not compare(document({"a": two}), document({"a": list(scores)})).passed
    # A share that fell or stayed the same is fine.
    assert compare(document({"a": list(scores)}), document({"a": two})).passed
    assert compare(document({"a": two}), document({"a": two})).passed


def test_missing_examples_and_missing_scores_fail_the_gate(scores):
    ids = [f"ex{i}" for i in range(N)]
    base = document({"a": list(scores)}, ids)
    comparison = compare(document({"a": list(scores[:40])}, ids[:40]), base)
    (row,) = comparison.regressions
    assert (row.n, row.delta, row.missing) == (40, 0.0, 20)
    assert "| 40 | 0% | ❌ 20 baseline example(s) missing |" in gate_markdown(comparison)
    # More examples now than in the baseline is fine.
    assert compare(base, document({"a": list(scores[:40])}, ids[:40])).passed

    # Scored in the baseline and not at all now (the method still ran): every example undefined.
    now = copy.deepcopy(base)
    now["methods"]["a"]["scores"] = now["methods"]["a"]["per_example"] = {}
    (row,) = compare(now, base).regressions
    assert (row.n, row.undefined) == (0, (0.0, 1.0))


def test_failed_removed_added_and_changed_settings_are_reported(scores):
    base = document({"a": list(scores), "b": list(scores), "gone": list(scores)})
    now = document({"a": list(scores), "b": list(scores), "new": list(scores)})
    now["methods"]["b"].update(status="failed", error="RuntimeError: boom")
    now["config"]["limit"] = 10
    now["config"]["batch_size"] = 4
    now["provenance"]["model"]["weights_sha256"] = "b" * 64
    comparison = compare(now, base, allow_model_change=True)
    assert comparison.failed == {"b": "RuntimeError: boom"}
    assert comparison.exit_code == ExitCode.REGRESSION  # a method that broke fails the gate
    assert (comparison.removed, comparison.added) == (["gone"], ["new"])
    assert ("limit", N, 10) in comparison.config_changes
    text = gate_markdown(comparison)
    assert "- ❌ `b`: RuntimeError: boom" in text
    assert "- ❌ `gone`" in text
    assert "**Added** (no baseline yet): `new`" in text
    assert f"- `limit`: `{N}` → `10`" in text
    assert "- `batch_size`: `16` → `4` (does not change the numbers)" in text
    assert "> **the model weights differ (sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb)" in text
    assert "may be meaningless" in text


def test_a_method_gone_from_the_results_is_a_regression_unless_removed_on_purpose(scores):
    """A method dropped from the run (or whose plugin stopped importing) fails the gate."""
    base = document({"a": list(scores), "gone": list(scores), "ig:steps=2": list(scores)})
    base["methods"]["broken"] = {**base["methods"]["a"], "status": "failed", "error": "E: x"}
    now = document({"a": list(scores)})
    comparison = compare(now, base)
    assert comparison.exit_code == ExitCode.REGRESSION
    assert comparison.removed == ["gone", "ig:steps=2", "broken"]
    # Failed in the baseline: nothing was lost.
    assert comparison.unallowed_removed == ["gone", "ig:steps=2"]
    text = gate_markdown(comparison)
    assert text.startswith("## ❌ attrib-bench check: 2 regression(s)")
    assert "- ❌ `gone`" in text and "- ❌ `ig:steps=2`" in text and "--allow-removed" in text

    # Allowed by spec or by name (every spec of that method): recorded, and the gate passes.
    comparison = compare(now, base, allow_removed=["gone", "ig", "a", "nosuch"])
    assert comparison.passed and comparison.exit_code == ExitCode.OK
    assert comparison.allowed_removed == {
        "gone": "--allow-removed",
        "ig:steps=2": "--allow-removed",
    }
    assert comparison.unallowed_removed == []
    text = gate_markdown(comparison)
    assert text.startswith("## ✅ attrib-bench check: no regression")
    assert "**Removed on purpose** (--allow-removed): `gone`, `ig:steps=2`" in text
    # An allowance that matches no removed method is said, not silently kept.
    assert "`--allow-removed a`: `a` is in the results" in text
    assert "`--allow-removed nosuch`: no such method in the baseline" in text


def test_a_floor_left_out_with_no_floor_is_removed_on_purpose(scores):
    base = document({"a": list(scores), "random": list(scores)})
    base["methods"]["random"]["added_as_floor"] = True
    now = document({"a": list(scores)})
    assert compare(now, base).unallowed_removed == ["random"]  # not said: a regression
    now["config"]["floor"] = False
    comparison = compare(now, base)
    assert comparison.passed and comparison.allowed_removed == {"random": "--no-floor"}
    assert "**Removed on purpose** (--no-floor): `random`" in gate_markdown(comparison)


def test_a_different_model_or_reference_is_incomparable_unless_allowed(scores):
    base = document({"a": list(scores)})
    other_model = copy.deepcopy(base)
    other_model["provenance"]["model"]["weights_sha256"] = "b" * 64
    with pytest.raises(UsageError, match=r"weights differ.*--allow-model-change") as error:
        compare(other_model, base)
    assert "\n" not in str(error.value)
    comparison = compare(other_model, base, allow_model_change=True)
    assert comparison.passed and comparison.allow_model_change
    text = gate_markdown(comparison)
    assert "> [!WARNING]\n> **the model weights differ (sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb" in text
    assert "allowed by --allow-model-change" in text

    other_reference = copy.deepcopy(base)
    other_reference["reference"] = "integrated-gradients"
    with pytest.raises(UsageError, match=r"reference differs.*--allow-reference-change"):
        compare(other_reference, base)
    # The other allowance does not cover it.
    with pytest.raises(UsageError, match="reference differs"):
        compare(other_reference, base, allow_model_change=True)
    comparison = compare(other_reference, base, allow_reference_change=True)
    assert comparison.passed and comparison.allow_reference_change
    # The baseline's reference, added only as such, leaves with it; a selected method does not.
    base["methods"]["saliency"] = {**base["methods"]["a"], "added_as_reference": True}
    base["methods"]["selected"] = base["methods"]["a"]
    comparison = compare(other_reference, base, allow_reference_change=True)
    assert comparison.allowed_removed == {"saliency": "--allow-reference-change"}
    assert comparison.unallowed_removed == ["selected"] and not comparison.passed
    base = document({"a": list(scores)})
    text = gate_markdown(comparison)
    assert (
        "> [!WARNING]\n> **the reference differs (saliency -> integrated-gradients)" in text
        and "allowed by --allow-reference-change" in text
    )


def test_a_summary_only_result_is_unusable_input(scores):
    """Summaries without the per-example scores behind them cannot be paired: exit 2."""
    base = document({"a": list(scores), "b": list(scores)})
    stripped = copy.deepcopy(base)
    for method in stripped["methods"].values():
        method["per_example"] = {}
    for current, baseline in ((stripped, base), (base, stripped)):
        with pytest.raises(UsageError) as error:
            compare(current, baseline)
        name = "results" if current is stripped else "baseline"
        assert str(error.value) == (
            f"{name!r} holds summaries only (methods['a'].scores['spearman'].aggregated has no "
            "per-example scores), so no paired comparison is possible; write it with "
            "attrib-bench run --output"
        )


def test_a_failed_evaluator_fails_the_gate(scores):
    base = document({"a": list(scores)})
    now = copy.deepcopy(base)
    now["evaluators"]["spearman"] = {"status": "failed", "error": "ValueError: shapes"}
    comparison = compare(now, base)
    assert comparison.failed_evaluators == {"spearman": "ValueError: shapes"}
    assert comparison.exit_code == ExitCode.REGRESSION


def test_unusable_inputs_are_usage_errors(scores):
    base = document({"a": list(scores)})
    summary_only = copy.deepcopy(base)
    del summary_only["example_ids"]
    with pytest.raises(UsageError, match="summaries only"):
        compare(base, summary_only)
    with pytest.raises(UsageError, match="schema_version 2"):
        compare({**base, "schema_version": 2}, base)
    with pytest.raises(UsageError, match="nothing to compare"):
        compare(document({"other": list(scores)}), base, allow_removed=["a"])
    with pytest.raises(UsageError, match="tolerance"):
        compare(base, base, tolerance=-1)


def test_errors_name_the_file_and_the_field(tmp_path, scores):
    base = document({"a": list(scores)})
    summary_only = copy.deepcopy(base)
    del summary_only["example_ids"]
    good, summary = write(tmp_path / "good.json", base), write(tmp_path / "sum.json", summary_only)
    with pytest.raises(UsageError, match=r"^'.*sum\.json' holds summaries only"):
        compare(load_results(good), load_results(summary))
    with pytest.raises(UsageError, match=r"^'.*sum\.json' holds summaries only"):
        compare(load_results(summary), load_results(good))

    texts = copy.deepcopy(base)
    texts["methods"]["a"]["per_example"]["spearman"]["aggregated"][0][3] = "0.5"
    with pytest.raises(UsageError) as error:
        load_results(write(tmp_path / "texts.json", texts))
    assert str(error.value) == (
        f"{str(tmp_path / 'texts.json')!r} is not a valid attrib-bench result: "
        "methods['a'].per_example['spearman'].aggregated[0][3] must be a number or null, "
        "not '0.5'"
    )
    short = copy.deepcopy(base)
    short["methods"]["a"]["per_example"]["spearman"]["aggregated"][0].pop()
    with pytest.raises(UsageError, match=r"an array of 60 \(one per example id\)"):
        compare(short, base)


def test_paired_bootstrap_is_seeded_and_brackets_the_mean():
    differences = np.random.default_rng(3).normal(-0.05, 0.1, 200)
    low, high = paired_bootstrap(differences, seed=0)
    assert (low, high) == paired_bootstrap(differences, seed=0)
    assert low < differences.mean() < high
    # The half-width shrinks like 1/sqrt(n): about 1.96 standard errors.
    assert high - low == pytest.approx(2 * 1.96 * differences.std() / math.sqrt(200), rel=0.15)
    assert all(math.isnan(v) for v in paired_bootstrap(differences[:1]))


def test_the_gate_ci_covers_the_true_difference_at_its_nominal_rate():
    """200 seeded simulations with a known mean difference: the 95% CI covers it ~95% of runs.

    Binomial sd of the coverage over 200 runs is 1.5 points; [0.90, 0.99] is about 3 sd wide.
    """
    rng = np.random.default_rng(11)
    true_difference, covered = -0.03, 0
    for repetition in range(200):
        difficulty = rng.uniform(0.2, 0.9, N)
        before = difficulty + rng.normal(0, 0.05, N)
        now = difficulty + true_difference + rng.normal(0, 0.05, N)
        (row,) = compare(
            document({"a": list(now)}), document({"a": list(before)}), seed=repetition
        ).rows
        covered += row.ci[0] <= true_difference <= row.ci[1]
    assert 0.90 <= covered / 200 <= 0.99, covered


# ------------------------------------------------------------------------------------- the CLI


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_check_exit_codes_and_step_summary(run_cli, tmp_path, scores, monkeypatch):
    base = write(tmp_path / "base.json", document({"a": list(scores)}))
    same = write(tmp_path / "same.json", document({"a": list(scores)}))
    worse = write(tmp_path / "worse.json", document({"a": list(scores - 0.2)}))
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))

    code, out, err = run_cli("check", same, "--baseline", base)
    assert code == 0, err
    assert out.startswith("## ✅ attrib-bench check: no regression")
    assert f"summaryappendedto{summary}" in "".join(err.split())  # wrapped at any width

    code, out, _ = run_cli("check", worse, "--baseline", base, "--tolerance", "0.05")
    assert code == 1
    assert "❌ regression" in out and "tolerance (0.05)" in out
    text = summary.read_text()
    assert text.startswith("earlier step\n## ✅") and "## ❌ attrib-bench check" in text

    # A method gone from the results, allowed by name; a different model, allowed by flag.
    with_gone = document({"a": list(scores), "gone": list(scores)})
    gone_base = write(tmp_path / "gone_base.json", with_gone)
    code, out, _ = run_cli("check", same, "--baseline", gone_base)
    assert code == 1 and "- ❌ `gone`" in out
    code, out, err = run_cli("check", same, "--baseline", gone_base, "--allow-removed", "gone")
    assert code == 0, err
    assert "**Removed on purpose** (--allow-removed): `gone`" in out
    other = document({"a": list(scores)})
    other["provenance"]["model"]["weights_sha256"] = "b" * 64
    other = write(tmp_path / "other.json", other)
    code, out, err = run_cli("check", other, "--baseline", base)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--allow-model-change" in err
    code, out, err = run_cli("check", other, "--baseline", base, "--allow-model-change")
    assert code == 0, err
    assert "allowed by --allow-model-change" in out

    (tmp_path / "broken.json").write_text("{not json")
    for bad in (tmp_path / "missing.json", tmp_path / "broken.json"):
        code, out, err = run_cli("check", bad, "--baseline", base)
        assert code == 2 and out == ""
        assert "error:" in err


#: A method of its own (saliency under another name), and a degraded version of it.
MY_METHOD = """
import torch

import attrib_bench
from attrib_bench_plugins.gradient import Saliency

NOISE = {noise}


class MyMethod(Saliency):
    name = "my-method"
    description = "Gradient x input, as a team's own method"

    def attribute(self, trace):
        attribution = super().attribute(trace)
        if not NOISE:
            return attribution
        rows = attribution.aggregated_BLN
        generator = torch.Generator().manual_seed(0)
        noise = torch.rand(rows.shape, generator=generator).to(rows.device)
        rows = rows + NOISE * noise * rows.abs().amax(dim=-1, keepdim=True)
        return attrib_bench.Attribution(rows * trace.mask_BN[:, None, :].to(rows.dtype))


@attrib_bench.hookimpl
def attrib_bench_attributors():
    return [MyMethod()]
"""


def test_a_degraded_plugin_fails_the_gate_and_the_clean_one_passes(
    tiny_bert, run_cli, tmp_path, monkeypatch
):
    monkeypatch.delenv("ATTRIB_BENCH_NO_CACHE")  # as users run it: the edit must miss the cache
    plugin = tmp_path / "my_method.py"
    args = ["--model", tiny_bert, "--limit", "16", "--attributors", "my-method,attention"]
    args += ["--plugin", plugin, "--quiet"]

    def run(noise: float, name: str) -> Path:
        plugin.write_text(MY_METHOD.format(noise=noise))
        code, _, err = run_cli("run", *args, "--output", tmp_path / name)
        assert code == 0, err
        return tmp_path / name

    baseline = run(0.0, "baseline.json")
    degraded = run(2.0, "degraded.json")
    code, out, _ = run_cli("check", degraded, "--baseline", baseline)
    assert code == 1, out
    assert "| `my-method` | spearman | aggregated | 1 | +1.000 |" in out
    assert "❌ regression" in out
    assert "| `attention` |" in out and out.count("❌ regression") == 1

    clean = run(0.0, "clean.json")
    code, out, _ = run_cli("check", clean, "--baseline", baseline)
    assert code == 0, out
    assert "## ✅ attrib-bench check: no regression" in out


def test_an_evaluator_failing_on_one_method_is_a_regression_with_its_error(scores):
    base = document({"a": list(scores), "b": list(scores)})
    now = copy.deepcopy(base)
    del now["methods"]["a"]["scores"]["spearman"], now["methods"]["a"]["per_example"]["spearman"]
    now["methods"]["a"]["evaluators"] = {
        "spearman": {"status": "failed", "error": "ValueError: bad shape"}
    }
    comparison = compare(now, base)
    assert comparison.exit_code == ExitCode.REGRESSION
    assert comparison.failed == {"a (spearman)": "ValueError: bad shape"}
    assert [r.method for r in comparison.regressions] == ["a"]
    assert "❌ `a (spearman)`: ValueError: bad shape" in gate_markdown(comparison)


def test_undefined_in_both_files_is_reported_not_a_regression(scores):
    base = document({"a": list(scores), "b": [None] * N})
    comparison = compare(copy.deepcopy(base), base)
    assert comparison.passed
    (row,) = [r for r in comparison.rows if r.method == "b"]
    assert (row.n, row.undefined) == (0, (1.0, 1.0))


def test_a_fall_on_a_single_shared_example_is_a_regression():
    """One pair has no bootstrap CI; the gate must not read that as 'within noise'."""
    base = document({"a": [0.8], "b": [0.5]}, ids=["only"])
    now = document({"a": [-4.2], "b": [0.5]}, ids=["only"])
    comparison = compare(now, base)
    assert comparison.exit_code == ExitCode.REGRESSION
    assert [(r.method, r.n) for r in comparison.regressions] == [("a", 1)]
    assert compare(copy.deepcopy(base), base).passed
