"""Representation similarity: each measure against a textbook float64 implementation written
here from the formulas, the invariances that tell the measures apart, and the command end to end
on the tiny BERT (``--no-learned``, so it does not depend on the alignment maps)."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from attrib_bench.analyses.similarity import (
    MEASURES,
    Features,
    SimilarityConfig,
    compare,
    gram_rows,
    linear_cka,
    linreg_r2,
    procrustes_distance,
    pwcca,
    rbf_cka,
    svcca,
)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _pair(n=60, d1=6, d2=5, seed=0):
    rng = _rng(seed)
    x = rng.normal(size=(n, d1))
    y = np.tanh(x @ rng.normal(size=(d1, d2))) + 0.3 * rng.normal(size=(n, d2))
    return x, y


# --- textbook implementations (explicit formulas, independent of the module) -----------------


def _hsic(k, l):  # noqa: E741
    """Biased HSIC: tr(K H L H) / (n - 1)^2 with H = I - 11^T / n."""
    n = len(k)
    h = np.eye(n) - np.ones((n, n)) / n
    return np.trace(k @ h @ l @ h) / (n - 1) ** 2


def _cka(k, l):  # noqa: E741
    return _hsic(k, l) / np.sqrt(_hsic(k, k) * _hsic(l, l))


def _hsic_u_statistic(k, l):  # noqa: E741
    """Song et al. 2012's unbiased HSIC as the U-statistic over distinct index 4-tuples:
    mean of k_ij l_ij + k_ij l_qr - 2 k_ij l_iq."""
    total, count = 0.0, 0
    for i, j, q, r in itertools.permutations(range(len(k)), 4):
        total += k[i, j] * l[i, j] + k[i, j] * l[q, r] - 2 * k[i, j] * l[i, q]
        count += 1
    return total / count


def _rbf(x, threshold):
    n = len(x)
    squared = np.array([[np.sum((x[i] - x[j]) ** 2) for j in range(n)] for i in range(n)])
    sigma2 = threshold**2 * np.median(squared)
    return np.exp(-squared / (2 * sigma2))


def _inverse_sqrt(matrix):
    values, vectors = np.linalg.eigh(matrix)
    return vectors @ np.diag(values**-0.5) @ vectors.T


def _cca(x, y):
    """Canonical correlations and X's canonical variates from the covariance matrices."""
    xc, yc = x - x.mean(0), y - y.mean(0)
    n = len(x)
    sxx, syy, sxy = xc.T @ xc / (n - 1), yc.T @ yc / (n - 1), xc.T @ yc / (n - 1)
    u, s, _ = np.linalg.svd(_inverse_sqrt(sxx) @ sxy @ _inverse_sqrt(syy))
    k = min(x.shape[1], y.shape[1])
    variates = xc @ _inverse_sqrt(sxx) @ u[:, :k]
    return s[:k], variates


# --- each measure against its textbook form --------------------------------------------------


def test_linear_cka_matches_the_hsic_formula():
    x, y = _pair()
    assert linear_cka(x, y) == pytest.approx(_cka(x @ x.T, y @ y.T), abs=1e-10)


def test_debiased_linear_cka_matches_the_u_statistic():
    x, y = _pair(n=8)
    k, l = x @ x.T, y @ y.T  # noqa: E741
    expected = _hsic_u_statistic(k, l) / np.sqrt(_hsic_u_statistic(k, k) * _hsic_u_statistic(l, l))
    assert linear_cka(x, y, debiased=True) == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize("threshold", [0.5, 1.0, 2.0])
def test_rbf_cka_matches_the_kernel_formula(threshold):
    x, y = _pair(n=30)
    expected = _cka(_rbf(x, threshold), _rbf(y, threshold))
    assert rbf_cka(x, y, threshold) == pytest.approx(expected, abs=1e-10)


def test_svcca_matches_truncated_svd_then_cca():
    x, y = _pair(n=80, d1=8, d2=7)

    def reduce(a, keep):
        ac = a - a.mean(0)
        u, s, _ = np.linalg.svd(ac, full_matrices=False)
        k = next(i + 1 for i in range(len(s)) if s[: i + 1].sum() >= keep * s.sum())
        return u[:, :k] * s[:k]

    for keep in (0.5, 0.9, 1.0):
        correlations, _ = _cca(reduce(x, keep), reduce(y, keep))
        assert svcca(x, y, keep) == pytest.approx(correlations.mean(), abs=1e-8)


def test_pwcca_weights_correlations_by_projection_on_x():
    x, y = _pair(n=80, d1=5, d2=7)
    correlations, variates = _cca(x, y)
    variates = variates / np.linalg.norm(variates, axis=0)
    xc = x - x.mean(0)
    alpha = np.array([sum(abs(h @ xc[:, j]) for j in range(x.shape[1])) for h in variates.T])
    expected = np.sum(alpha / alpha.sum() * correlations)
    assert pwcca(x, y) == pytest.approx(expected, abs=1e-8)
    assert pwcca(x, y) != pytest.approx(correlations.mean(), abs=1e-4)  # weighting matters


def test_procrustes_is_the_minimum_over_rotations():
    x, y = _pair(d1=5, d2=5)
    xc, yc = x - x.mean(0), y - y.mean(0)
    xc, yc = xc / np.linalg.norm(xc), yc / np.linalg.norm(yc)
    u, _, vt = np.linalg.svd(xc.T @ yc)
    expected = np.sum((xc @ u @ vt - yc) ** 2)  # min_R ||X R - Y||_F^2, R orthogonal
    assert procrustes_distance(x, y) == pytest.approx(expected, abs=1e-10)
    # different widths: 2 - 2 ||X^T Y||_* (Ding et al. 2021)
    x, y = _pair(d1=6, d2=3)
    xc, yc = x - x.mean(0), y - y.mean(0)
    xc, yc = xc / np.linalg.norm(xc), yc / np.linalg.norm(yc)
    nuclear = np.linalg.svd(xc.T @ yc, compute_uv=False).sum()
    assert procrustes_distance(x, y) == pytest.approx(2 - 2 * nuclear, abs=1e-10)


def test_linreg_r2_matches_least_squares_and_ridge():
    x, y = _pair(n=50)
    train, test = slice(0, 35), slice(35, None)

    def r2(predicted, target):
        return 1 - np.sum((target - predicted) ** 2) / np.sum((target - target.mean(0)) ** 2)

    design = np.hstack([x[train], np.ones((35, 1))])
    weights = np.linalg.lstsq(design, y[train], rcond=None)[0]
    predicted = np.hstack([x[test], np.ones((15, 1))]) @ weights
    assert linreg_r2(x[train], y[train], x[test], y[test]) == pytest.approx(
        r2(predicted, y[test]), abs=1e-10
    )
    # fewer train rows than features: ridge, lambda = 1e-3 trace(Xc^T Xc) / d (primal form)
    x, y = _pair(n=12, d1=20, d2=4)
    xtr, ytr, xte, yte = x[:8], y[:8], x[8:], y[8:]
    xc, yc = xtr - xtr.mean(0), ytr - ytr.mean(0)
    lam = 1e-3 * np.trace(xc.T @ xc) / 20
    weights = np.linalg.solve(xc.T @ xc + lam * np.eye(20), xc.T @ yc)
    predicted = (xte - xtr.mean(0)) @ weights + ytr.mean(0)
    assert linreg_r2(xtr, ytr, xte, yte) == pytest.approx(r2(predicted, yte), abs=1e-8)


# --- memory: feature-space linear CKA, the Gram row cap ---------------------------------------


@pytest.mark.parametrize("n, d1, d2", [(60, 6, 5), (7, 20, 3), (200, 3, 9)])
def test_feature_space_linear_cka_equals_the_gram_form(n, d1, d2):
    x, y = _pair(n=n, d1=d1, d2=d2, seed=n)
    x, y = x * 3.0 + 5.0, y - 2.0  # uncentred input: the measure centres it
    assert linear_cka(x, y) == pytest.approx(_cka(x @ x.T, y @ y.T), abs=1e-10)


def test_biased_linear_cka_builds_no_n_by_n_matrix():
    """200,000 rows of 3 features: an n x n float64 matrix would be 320 GB; the feature-space form
    needs a few copies of the 4.8 MB inputs. tracemalloc sees numpy's allocations."""
    import tracemalloc

    n = 200_000
    x, y = _pair(n=n, d1=3, d2=3)
    tracemalloc.start()
    try:
        value = linear_cka(x, y)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 < value < 1
    assert peak < 10 * x.nbytes  # n x n would be n / 3 = 66,667 times x's size


def _features(layers):
    n = layers[0].shape[0]
    return Features(layers=layers, rows_per_sentence=[1] * n, input_ids=[[0]] * n)


def _config(**overrides):
    return SimilarityConfig(models=["x", "y"], learned=False, debiased=True, **overrides)


def test_gram_rows_are_a_seeded_subset_only_above_the_cap():
    assert gram_rows(100, None, 0) is None and gram_rows(100, 100, 0) is None
    rows = gram_rows(100, 30, 7)
    assert len(rows) == len(set(rows.tolist())) == 30 and np.all(np.diff(rows) > 0)
    assert rows.min() >= 0 and rows.max() < 100
    assert np.array_equal(rows, gram_rows(100, 30, 7))  # reproducible from the seed
    assert not np.array_equal(rows, gram_rows(100, 30, 8))
    expected = np.sort(np.random.default_rng(7).choice(100, size=30, replace=False))
    assert np.array_equal(rows, expected)  # the documented rule


def test_capped_gram_measures_use_exactly_the_paired_subset():
    x, y = _pair(n=90, d1=6, d2=5)
    cap, seed = 25, 3
    config = _config(max_gram_rows=cap, seed=seed)
    result, *_ = compare(_features([x]), _features([y]), config)
    rows = gram_rows(90, cap, seed)
    xs, ys = x[rows], y[rows]
    assert result["rbf_cka"][0][0] == pytest.approx(_cka(_rbf(xs, 1.0), _rbf(ys, 1.0)), abs=1e-10)
    assert result["rbf_cka"][0][0] != pytest.approx(rbf_cka(x, y), abs=1e-6)
    assert result["linear_cka_debiased"][0][0] == pytest.approx(
        linear_cka(xs, ys, debiased=True), abs=1e-12
    )
    # measures without n x n matrices keep every row
    assert result["linear_cka"][0][0] == pytest.approx(_cka(x @ x.T, y @ y.T), abs=1e-10)
    assert result["procrustes"][0][0] == procrustes_distance(x, y)
    # paired: the same rows for x and y, so a model against itself stays at 1
    itself, *_ = compare(_features([x]), _features([x]), config)
    assert itself["rbf_cka"][0][0] == pytest.approx(1, abs=1e-12)
    assert itself["linear_cka_debiased"][0][0] == pytest.approx(1, abs=1e-12)
    # reproducible from the seed, and the seed matters
    assert compare(_features([x]), _features([y]), config)[0] == result
    other, *_ = compare(_features([x]), _features([y]), _config(max_gram_rows=cap, seed=seed + 1))
    assert other["rbf_cka"][0][0] != result["rbf_cka"][0][0]


def test_below_the_cap_nothing_changes():
    x, y = _pair(n=40)
    capped, *_ = compare(_features([x]), _features([y]), _config(max_gram_rows=40))
    uncapped, *_ = compare(_features([x]), _features([y]), _config(max_gram_rows=None))
    assert capped == uncapped
    assert capped["rbf_cka"][0][0] == rbf_cka(x, y)
    assert capped["linear_cka_debiased"][0][0] == linear_cka(x, y, debiased=True)


# --- invariances -----------------------------------------------------------------------------


def test_identity_gives_perfect_scores():
    x, _ = _pair()
    assert linear_cka(x, x) == pytest.approx(1, abs=1e-12)
    assert linear_cka(x, x, debiased=True) == pytest.approx(1, abs=1e-12)
    assert rbf_cka(x, x) == pytest.approx(1, abs=1e-12)
    assert svcca(x, x) == pytest.approx(1, abs=1e-8)
    assert pwcca(x, x) == pytest.approx(1, abs=1e-8)
    assert procrustes_distance(x, x) == pytest.approx(0, abs=1e-10)


def test_orthogonal_transform_and_isotropic_scaling_are_a_known_bijection():
    x, _ = _pair(d1=6)
    q = np.linalg.qr(_rng(3).normal(size=(6, 6)))[0]
    y = 7.5 * x @ q + 2.0  # rotation, scale and shift
    assert linear_cka(x, y) == pytest.approx(1, abs=1e-10)
    assert linear_cka(x, y, debiased=True) == pytest.approx(1, abs=1e-10)
    assert rbf_cka(x, y) == pytest.approx(1, abs=1e-10)
    assert procrustes_distance(x, y) == pytest.approx(0, abs=1e-10)
    x2, y2 = _pair()
    assert procrustes_distance(x2, y2) > 0.05  # an unrelated pair is not at distance 0


def test_invertible_linear_map_keeps_cca_and_regression_but_not_cka():
    x = _rng(1).normal(size=(200, 6))
    q1, q2 = (np.linalg.qr(_rng(s).normal(size=(6, 6)))[0] for s in (4, 5))
    a = q1 @ np.diag(np.logspace(-1, 1, 6)) @ q2  # invertible, far from orthogonal
    y = x @ a
    assert svcca(x, y, keep=1.0) == pytest.approx(1, abs=1e-8)
    assert pwcca(x, y) == pytest.approx(1, abs=1e-8)
    assert linreg_r2(x[:140], y[:140], x[140:], y[140:]) == pytest.approx(1, abs=1e-8)
    assert linear_cka(x, y) < 0.8
    assert procrustes_distance(x, y) > 0.1


# --- the command ------------------------------------------------------------------------------


def _similarity(run_cli, tiny, output, *extra):
    """The command on the tiny model with itself; each map trains 3 epochs at most (these
    tests check what is fitted where, not the fit: early stopping's patience is 30)."""
    return run_cli(
        "similarity",
        "--models",
        f"{tiny},{tiny}",
        "--dataset",
        "default",
        "--limit",
        "24",
        "--output",
        output,
        "--quiet",
        "--map-epochs",
        "3",
        *extra,
    )


def test_command_model_with_itself(tiny_bert, run_cli, tmp_path):
    output = tmp_path / "similarity.json"
    code, out, err = _similarity(
        run_cli, tiny_bert, output, "--no-learned", "--plots", tmp_path / "plots"
    )
    assert code == 0, err
    report = json.loads(output.read_text())
    assert report["schema"] == "attrib-bench/similarity" and report["version"] == 1
    assert [m["layers"] for m in report["models"]] == [3]  # one model, loaded once
    kinds = [p["kind"] for p in report["pairs"]]
    assert kinds == ["models", "random-floor", "random-random"]
    measures = ["linear_cka", "rbf_cka", "svcca", "pwcca", "procrustes", "linreg_r2"]
    for pair in report["pairs"]:
        assert list(pair["measures"]) == measures
        for name, matrix in pair["measures"].items():
            assert len(matrix) == 4 and all(len(row) == 4 for row in matrix)
            values = [v for row in matrix for v in row]
            # 24 sentences for 32 features: PWCCA's correlations would all be 1 by construction,
            # so it is undefined (null); SVCCA may be too, on its reduced features.
            if name == "pwcca":
                assert all(v is None for v in values)
            elif name != "svcca":
                assert all(v is not None for v in values)
    itself = report["pairs"][0]["measures"]
    for i in range(4):
        assert itself["linear_cka"][i][i] == pytest.approx(1, abs=1e-6)
        assert itself["procrustes"][i][i] == pytest.approx(0, abs=1e-6)
    floor = report["pairs"][1]["measures"]["linear_cka"]
    assert all(floor[i][i] < 1 - 1e-3 for i in range(1, 4))
    assert report["pairs"][2]["x"].startswith("random-init:")
    assert "linear_cka" in out and "random-random" in out
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3 * len(measures)


def test_seed_models_share_one_random_init_and_one_random_pair(tiny_bert, run_cli, tmp_path):
    """Models of one architecture get the same random init, so it is built and compared once:
    each model's floor is against it, and there is a single random-random pair."""
    twin = tmp_path / "twin"
    shutil.copytree(tiny_bert, twin)
    output = tmp_path / "twins.json"
    code, _, err = run_cli(
        "similarity",
        "--models",
        f"{tiny_bert},{twin}",
        "--dataset",
        "default",
        "--limit",
        "12",
        "--no-learned",
        "--output",
        output,
        "--quiet",
    )
    assert code == 0, err
    pairs = json.loads(output.read_text())["pairs"]
    assert [p["kind"] for p in pairs] == ["models", "random-floor", "random-floor", "random-random"]
    shared = f"random-init:{tiny_bert}@seed0"
    assert [p["x"] for p in pairs[1:3]] == [str(tiny_bert), str(twin)]
    assert [p["y"] for p in pairs[1:3]] == [shared, shared]
    assert pairs[3]["x"] == shared
    # The twin's floor is the model's own: the same weights against the same random init.
    assert pairs[1]["measures"] == pairs[2]["measures"]


def test_token_level_rows_are_tokens(tiny_bert, run_cli, tmp_path):
    output = tmp_path / "tokens.json"
    code, _, err = _similarity(run_cli, tiny_bert, output, "--no-learned", "--token-level")
    assert code == 0, err
    report = json.loads(output.read_text())
    assert report["dataset"]["rows"] > report["dataset"]["sentences"] == 24
    cka = report["pairs"][0]["measures"]["linear_cka"]
    assert all(cka[i][i] == pytest.approx(1, abs=1e-6) for i in range(4))


def test_token_level_cap_is_recorded(tiny_bert, run_cli, tmp_path):
    output = tmp_path / "capped.json"
    code, _, err = _similarity(
        run_cli,
        tiny_bert,
        output,
        "--no-learned",
        "--token-level",
        "--debiased",
        "--max-gram-rows",
        "50",
        "--seed",
        "5",
    )
    assert code == 0, err
    report = json.loads(output.read_text())
    rows = report["dataset"]["rows"]
    assert rows > 50
    record = report["gram_subsample"]
    assert record["rows"] == 50 and record["of"] == rows and record["seed"] == 5
    assert record["measures"] == ["rbf_cka", "linear_cka_debiased"]
    assert report["config"]["max_gram_rows"] == 50
    itself = report["pairs"][0]["measures"]
    assert all(itself["rbf_cka"][i][i] == pytest.approx(1, abs=1e-6) for i in range(4))
    # the default cap (4000) is far above these rows: every row, and the report says so
    code, _, err = _similarity(run_cli, tiny_bert, output, "--no-learned", "--token-level")
    assert code == 0, err
    report = json.loads(output.read_text())
    assert report["gram_subsample"] is None and report["config"]["max_gram_rows"] == 4000


def test_token_level_refuses_different_tokenizers(tiny_bert, run_cli, tmp_path):
    other = tmp_path / "other"  # the same weights, a vocabulary with "the" and "a" swapped
    shutil.copytree(tiny_bert, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["the"], vocab["a"] = vocab["a"], vocab["the"]
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    code, _, err = run_cli(
        "similarity",
        "--models",
        f"{tiny_bert},{other}",
        "--dataset",
        "default",
        "--limit",
        "8",
        "--token-level",
        "--no-learned",
        "--quiet",
        "--output",
        tmp_path / "x.json",
    )
    assert code == 2 and "share the tokenizer" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "models, extra, message",
    [
        ("{m}", [], "at least 2"),
        ("{m},/no/such/model", [], "not found"),
        ("{m},{m}", ["--limit", "2"], "at least 4 sentences"),
        ("{m},{m}", ["--limit", "0"], "--limit"),
        ("{m},{m}", ["--svcca-keep", "1.5"], "--svcca-keep"),
        ("{m},{m}", ["--max-gram-rows", "3"], "--max-gram-rows"),
        ("{m},{m}", ["--map-epochs", "0"], "--map-epochs"),
        ("{m},{m}", ["--maps-only"], "--maps-only"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny_bert, run_cli, tmp_path, models, extra, message):
    code, _, err = run_cli(
        "similarity",
        "--models",
        models.format(m=tiny_bert),
        "--dataset",
        "default",
        "--no-learned",
        "--quiet",
        "--output",
        tmp_path / "x.json",
        *extra,
    )
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_missing_alignment_module_is_a_usage_error(tiny_bert, run_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "attrib_bench.analyses.alignment", None)
    code, _, err = _similarity(run_cli, tiny_bert, tmp_path / "x.json")
    assert code == 2 and "--no-learned" in err


def _without_freia(monkeypatch) -> None:
    """FrEIA not installed: every import of it fails, also of a submodule imported already."""
    for name in [m for m in sys.modules if m.split(".")[0] == "FrEIA"] + ["FrEIA"]:
        monkeypatch.setitem(sys.modules, name, None)


def test_without_freia_the_default_maps_skip_the_inn_and_say_so(
    tiny_bert, run_cli, tmp_path, monkeypatch
):
    """The default maps include the INN: without FrEIA the command failed, now the other maps
    and measures run, one warning names the extra and the report records the skip."""
    _without_freia(monkeypatch)
    output = tmp_path / "no-inn.json"
    code, _, err = _similarity(run_cli, tiny_bert, output, "--limit", "12")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "attrib-bench[similarity]" in warnings[0], err
    report = json.loads(output.read_text())
    assert list(report["skipped_maps"]) == ["inn"]
    assert "attrib-bench[similarity]" in report["skipped_maps"]["inn"]
    assert report["config"]["maps"] == ["linear", "mlp"]
    measures = report["pairs"][0]["measures"]
    assert "linear_r2" in measures and "mlp_r2" in measures
    assert not any(name.startswith("inn_") for name in measures)


@pytest.mark.parametrize("maps", ["inn", "linear,inn"])
def test_asking_for_the_inn_without_freia_is_one_line(
    tiny_bert, run_cli, tmp_path, monkeypatch, maps
):
    _without_freia(monkeypatch)
    code, _, err = _similarity(run_cli, tiny_bert, tmp_path / "x.json", "--maps", maps)
    assert code == 2 and "attrib-bench[similarity]" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--maps", "linear,nope"], "unknown alignment map 'nope'"),
        (["--maps", ","], "--maps needs at least one"),
        (["--maps", "linear", "--no-learned"], "--no-learned"),
        (["--floor-maps", "linear", "--no-learned"], "--no-learned"),
        (["--maps", "linear", "--floor-maps", "mlp"], "--floor-maps names 'mlp'"),
    ],
)
def test_bad_maps_are_one_line(tiny_bert, run_cli, tmp_path, extra, message):
    code, _, err = _similarity(run_cli, tiny_bert, tmp_path / "x.json", *extra)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_the_maps_asked_for_are_the_maps_fitted(tiny_bert, run_cli, tmp_path):
    output = tmp_path / "linear.json"
    code, _, err = _similarity(run_cli, tiny_bert, output, "--limit", "12", "--maps", "linear")
    assert code == 0, err
    report = json.loads(output.read_text())
    assert report["skipped_maps"] == {} and report["config"]["maps"] == ["linear"]
    assert list(report["pairs"][0]["measures"]) == [*MEASURES, "linear_mse", "linear_r2"]
    # each learned score carries its bootstrap interval on the diagonal, none elsewhere
    for pair in report["pairs"]:
        assert list(pair["intervals"]) == ["linear_mse", "linear_r2"]
        for name, matrix in pair["intervals"].items():
            for i, row in enumerate(matrix):
                for j, cell in enumerate(row):
                    if i != j:
                        assert cell is None
                        continue
                    low, high = cell
                    assert low <= pair["measures"][name][i][j] <= high, (name, i)


def test_maps_only_fits_the_same_maps_and_computes_no_closed_form_measure(
    tiny_bert, run_cli, tmp_path, monkeypatch
):
    """--maps-only gives the learned maps of a full run, value for value, and nothing else."""
    from attrib_bench.analyses import similarity

    full = tmp_path / "full.json"
    code, _, err = _similarity(run_cli, tiny_bert, full, "--maps", "linear")
    assert code == 0, err

    def refuse(*args, **kwargs):
        raise AssertionError("a closed-form measure was computed")

    for name in ("linear_cka", "rbf_cka", "svcca", "pwcca", "procrustes_distance", "linreg_r2"):
        monkeypatch.setattr(similarity, name, refuse)
    only = tmp_path / "only.json"
    code, _, err = _similarity(run_cli, tiny_bert, only, "--maps", "linear", "--maps-only")
    assert code == 0, err
    full_report, only_report = json.loads(full.read_text()), json.loads(only.read_text())
    assert only_report["gram_subsample"] is None
    assert [p["kind"] for p in only_report["pairs"]] == [p["kind"] for p in full_report["pairs"]]
    for whole, maps in zip(full_report["pairs"], only_report["pairs"], strict=True):
        assert list(maps["measures"]) == ["linear_mse", "linear_r2"]
        assert maps["intervals"] == whole["intervals"]
        for name, matrix in maps["measures"].items():
            for i, row in enumerate(matrix):
                for j, value in enumerate(row):
                    assert value == (whole["measures"][name][i][j] if i == j else None)


def test_floor_maps_choose_the_maps_of_the_floors_pairs(tiny_bert, run_cli, tmp_path):
    """The models' pair gets every map of --maps, the floors' pairs those of --floor-maps; with
    --maps-only and no floor map, a floor's pair computes nothing."""
    for floor, expected in (("linear", ["linear"]), ("", [])):
        output = tmp_path / f"floor-{floor}.json"
        code, _, err = _similarity(
            run_cli, tiny_bert, output, "--maps", "linear,mlp", "--floor-maps", floor,
            "--maps-only",
        )  # fmt: skip
        assert code == 0, err
        report = json.loads(output.read_text())
        assert report["config"]["floor_maps"] == expected
        for pair in report["pairs"]:
            fitted = ["linear", "mlp"] if pair["kind"] == "models" else expected
            for name in ("linear", "mlp"):
                diagonal = [row[i] for i, row in enumerate(pair["measures"][f"{name}_mse"])]
                assert all((v is not None) == (name in fitted) for v in diagonal), (pair, name)


def test_map_epochs_bound_every_learned_map(tiny_bert, run_cli, tmp_path, monkeypatch):
    """--map-epochs is the budget of each early-stopped map fit, for every diagonal layer pair."""
    from attrib_bench.analyses import alignment

    budgets: list[int] = []
    real = alignment.train_map
    monkeypatch.setattr(
        alignment,
        "train_map",
        lambda *args, max_epochs, **kwargs: (
            budgets.append(max_epochs) or real(*args, max_epochs=max_epochs, **kwargs)
        ),
    )
    output = tmp_path / "budget.json"
    code, _, err = _similarity(
        run_cli, tiny_bert, output, "--maps", "linear,mlp", "--map-epochs", "2"
    )
    assert code == 0, err
    report = json.loads(output.read_text())
    assert report["config"]["map_epochs"] == 2
    fits = len(report["pairs"]) * 4 * 2  # (i, i) of 4 layers, 2 maps, every pair
    assert budgets == [2] * fits
    for pair in report["pairs"]:  # the MLP's paired interval against the linear map
        keys = ["linear_mse", "linear_r2", "mlp_mse", "mlp_r2", "mlp_mse_minus_linear"]
        assert list(pair["intervals"]) == keys
        for matrix in pair["epochs"].values():  # [epochs trained, epoch kept] where fitted
            for i, row in enumerate(matrix):
                trained, kept = row[i]
                assert 1 <= trained <= 2 and 0 <= kept <= trained
                assert all(cell is None for j, cell in enumerate(row) if j != i)
        mse = pair["measures"]
        for i, row in enumerate(pair["intervals"]["mlp_mse_minus_linear"]):
            low, high = row[i]
            assert low <= mse["mlp_mse"][i][i] - mse["linear_mse"][i][i] <= high
            assert all(cell is None for j, cell in enumerate(row) if j != i)


@pytest.fixture
def narrow_bert(tiny_bert, tmp_path) -> Path:
    """The tiny BERT's architecture and tokenizer at half its width: 16 features, not 32."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    config = BertConfig.from_pretrained(tiny_bert, hidden_size=16, intermediate_size=24)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        BertForSequenceClassification(config).save_pretrained(tmp_path / "narrow")
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path / "narrow")
    return tmp_path / "narrow"


def test_models_of_different_widths_skip_the_inn_for_their_pair(
    tiny_bert, narrow_bert, run_cli, tmp_path
):
    """An invertible map needs equal widths: the default maps failed the whole command for two
    models of different widths; now that pair alone goes without the INN, said and recorded.
    Every learned map is fitted on the diagonal alone (layer l onto layer l), on every pair."""
    pytest.importorskip("FrEIA")
    output = tmp_path / "widths.json"
    models = f"{tiny_bert},{narrow_bert}"
    code, _, err = run_cli(
        "similarity", "--models", models, "--dataset", "default", "--limit", "12",
        "--output", output, "--quiet", "--map-epochs", "3",
    )  # fmt: skip
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "needs equal widths" in warnings[0], err
    pairs = json.loads(output.read_text())["pairs"]
    assert pairs[0]["kind"] == "models" and list(pairs[0]["skipped_maps"]) == ["inn"]
    assert f"{tiny_bert} has 32, {narrow_bert} 16" in pairs[0]["skipped_maps"]["inn"]
    assert all(v is None for row in pairs[0]["measures"]["inn_r2"] for v in row)
    assert all(pairs[0]["measures"]["linear_r2"][i][i] is not None for i in range(4))
    assert pairs[0]["starts"] == {}  # no INN, so no start to report
    for pair in pairs[1:]:  # a model and its random init: one width
        assert pair["skipped_maps"] == {}
        assert pair["measures"]["inn_r2"][0][0] is not None
        starts = pair["starts"]["inn"]  # where each diagonal INN began, None elsewhere
        assert all(starts[i][i] in ("least-squares", "identity") for i in range(4)), starts
        assert all(starts[i][j] is None for i in range(4) for j in range(4) if i != j)
    for pair in pairs:
        fitted = ("linear", "mlp") if pair is pairs[0] else ("linear", "mlp", "inn")
        for name in (f"{m}_{score}" for m in ("linear", "mlp", "inn") for score in ("mse", "r2")):
            matrix = pair["measures"][name]
            diagonal = name.startswith(fitted)
            assert all((matrix[i][i] is not None) is diagonal for i in range(4)), name
            assert all(matrix[i][j] is None for i in range(4) for j in range(4) if i != j), name
    code, _, err = run_cli(
        "similarity", "--models", models, "--dataset", "default", "--limit", "12",
        "--output", output, "--quiet", "--maps", "linear,inn",
    )  # fmt: skip
    assert code == 2 and "leave inn out of --maps" in err, err
    assert len(err.strip().splitlines()) == 1


def test_cca_measures_are_undefined_when_the_sentences_are_too_few():
    """With n - 1 < rank X + rank Y the two subspaces meet: correlations of 1 for any data."""
    generator = np.random.default_rng(0)
    x, y = generator.normal(size=(20, 16)), generator.normal(size=(20, 16))
    assert math.isnan(pwcca(x, y)) and math.isnan(svcca(x, y, keep=1.0))
    x, y = generator.normal(size=(400, 16)), generator.normal(size=(400, 16))
    assert 0 < pwcca(x, y) < 0.5 and 0 < svcca(x, y, keep=1.0) < 0.5


def google_pwcca_transcription(acts1: np.ndarray, acts2: np.ndarray) -> float:
    """google/svcca's compute_pwcca as written there (neurons as rows, ``np.cov`` on the stacked
    activations, each covariance block divided by its largest entry, S^-1/2 from the pseudo-
    inverse, the full SVD, ``dirns = u.T (acts - means) + means``, QR, weights on the raw
    activations): an independent float64 transcription of its steps, not of our function."""
    a1, a2 = acts1.T, acts2.T  # (neurons, datapoints)
    d1 = a1.shape[0]
    sigma = np.cov(a1, a2)
    sxx, sxy, syx, syy = sigma[:d1, :d1], sigma[:d1, d1:], sigma[d1:, :d1], sigma[d1:, d1:]
    xmax, ymax = np.max(np.abs(sxx)), np.max(np.abs(syy))
    sxx, syy = sxx / xmax, syy / ymax
    sxy, syx = sxy / np.sqrt(xmax * ymax), syx / np.sqrt(xmax * ymax)

    def inv_sqrt(m):
        w, v = np.linalg.eigh(np.linalg.pinv(m))
        return v @ np.diag(np.sqrt(np.maximum(w, 0))) @ v.T

    u, s, _ = np.linalg.svd(inv_sqrt(sxx) @ sxy @ inv_sqrt(syy))
    means = a1.mean(axis=1, keepdims=True)
    dirns = u.T @ (a1 - means) + means
    p, _ = np.linalg.qr(dirns.T)
    weights = np.sum(np.abs(p.T @ a1.T), axis=1)
    weights = weights / np.sum(weights)
    return float(np.sum(weights * np.abs(s)[: len(weights)]))


def test_google_pwcca_is_the_official_codes_and_not_only_uncentred_weights():
    """On features with large means (as mean-pooled hidden states) the official weights move
    the score; with X centred and whitened (covariance I, mean 0) both conventions agree,
    so what differs is the directions (no Sxx^-1/2) and the mean added back, not centring."""
    rng = np.random.default_rng(4)
    n, d1, d2 = 400, 6, 9
    x = rng.standard_normal((n, d1)) @ rng.standard_normal((d1, d1)) + 3.0
    y = np.hstack([x @ rng.standard_normal((d1, d1)), rng.standard_normal((n, d2 - d1))])
    y = y + 0.5 * rng.standard_normal((n, d2)) - 2.0
    google = pwcca(x, y, convention="google")
    assert google == pytest.approx(google_pwcca_transcription(x, y), rel=1e-10, abs=1e-12)
    assert pwcca(y, x, convention="google") == pytest.approx(google, rel=1e-10)  # narrower side
    assert abs(google - pwcca(x, y)) > 1e-3
    xc = x - x.mean(axis=0)
    whitened = xc @ np.linalg.inv(np.linalg.cholesky(np.cov(xc.T)).T)
    assert pwcca(whitened, y, convention="google") == pytest.approx(pwcca(whitened, y), abs=1e-10)
