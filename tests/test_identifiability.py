"""The identifiability analysis: protocol pieces and the command end to end on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from scipy import stats

from attrib_bench.analyses.identifiability import (
    IdentifiabilityConfig,
    fold_splits,
    identification_rate,
    summarize_rates,
    train_map,
)


def test_identification_rate_counts_own_nearest_neighbours():
    inputs = [torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])]
    # token 0 lands nearest to itself, token 1 nearest to token 2's input, token 2 to itself
    predicted = [torch.tensor([[1.0, 1.0], [1.0, 9.0], [0.0, 9.0]])]
    assert identification_rate(predicted, inputs, "l2") == 2 / 3
    assert identification_rate(inputs, inputs, "l2") == 1.0


def test_cosine_ignores_scale():
    inputs = [torch.tensor([[1.0, 0.0], [0.0, 1.0]])]
    scaled = [torch.tensor([[100.0, 1.0], [0.5, 50.0]])]
    assert identification_rate(scaled, inputs, "cosine") == 1.0


def test_learned_linear_map_recovers_a_linear_transform():
    torch.manual_seed(0)
    targets = torch.randn(600, 8)
    mixing = torch.linalg.qr(torch.randn(8, 8)).Q  # well conditioned: converges in few steps
    states = targets @ mixing
    config = IdentifiabilityConfig(model="unused", max_epochs=60, patience=10, batch_size=100)
    model, loss = train_map(
        "linear-l2", (states[:400], targets[:400]), (states[400:], targets[400:]), 3e-2, config
    )
    assert loss < 1e-2
    with torch.no_grad():
        predicted = [model(states[400 + 10 * k : 410 + 10 * k]) for k in range(20)]
    inputs = [targets[400 + 10 * k : 410 + 10 * k] for k in range(20)]
    assert identification_rate(predicted, inputs, "l2") == 1.0


def test_command_end_to_end(tiny_bert, run_cli, tmp_path):
    code, out, err = run_cli(
        "identifiability",
        "--model",
        tiny_bert,
        "--dataset",
        "default",
        "--limit",
        "30",
        "--folds",
        "2",
        "--learning-rates",
        "1e-3",
        "--max-epochs",
        "3",
        "--patience",
        "2",
        "--hta-limit",
        "2",
        "--output-dir",
        tmp_path,
    )
    assert code == 0, err
    report = json.loads((tmp_path / "identifiability.json").read_text())
    rates = report["identifiability"]
    assert set(rates) == {
        "naive-l2",
        "naive-cosine",
        "linear-l2",
        "linear-cosine",
        "mlp-l2",
        "mlp-cosine",
    }
    assert len(rates["naive-l2"]) == 4  # embeddings plus three layers
    assert rates["naive-l2"][0]["mean"] == 1.0 and rates["naive-cosine"][0]["mean"] == 1.0
    assert all(row["folds"] == 2 for row in rates["mlp-cosine"])
    hta = report["hta"]
    assert len(hta["own_contribution"]) == 3
    assert all(0 < v < 1 for v in hta["own_contribution"])
    assert (tmp_path / "identifiability.png").stat().st_size > 1000
    assert "naive-l2" in out


def test_bad_folds_is_a_usage_error(tiny_bert, run_cli, tmp_path):
    code, _, err = run_cli(
        "identifiability", "--model", tiny_bert, "--folds", "0", "--output-dir", tmp_path
    )
    assert code == 2 and "--folds" in err


@pytest.mark.parametrize(("count", "folds"), [(408, 10), (31, 4), (20, 7)])
def test_kfold_tests_every_sentence_once(count, folds):
    """A true K-fold partition: the test folds are disjoint, cover every sentence, and differ in
    size by at most one; in each fold train, validation and test are a partition, with
    validation 15/85 of the non-test sentences (70/15/15 where a test fold is 15%)."""
    splits = fold_splits(count, folds, "kfold", seed=3)
    tests = [set(test) for _, _, test in splits]
    assert len(splits) == folds
    assert set().union(*tests) == set(range(count))
    assert sum(len(t) for t in tests) == count
    assert max(map(len, tests)) - min(map(len, tests)) <= 1
    for train, validation, test in splits:
        assert sorted(train + validation + test) == list(range(count))
        assert abs(len(validation) - 0.15 / 0.85 * (count - len(test))) <= 1
    assert splits == fold_splits(count, folds, "kfold", seed=3)
    assert splits != fold_splits(count, folds, "kfold", seed=4)


def test_repeated_splits_are_independent_70_15_15_draws():
    splits = fold_splits(100, 3, "repeated", seed=0)
    assert [tuple(map(len, split)) for split in splits] == [(70, 15, 15)] * 3
    assert len({tuple(test) for _, _, test in splits}) == 3
    assert set(splits[0][2]) & set(splits[1][2])  # test sets may overlap


def test_rates_carry_a_t_interval_over_folds():
    values = [0.61, 0.64, 0.58, 0.66, 0.6]
    (row,) = summarize_rates({"linear-l2": [values]})["linear-l2"]
    low, high = stats.t.interval(0.95, len(values) - 1, loc=row["mean"], scale=stats.sem(values))
    assert row["ci95"] == pytest.approx([low, high], rel=1e-12)
    assert row["folds"] == 5


def test_kfold_with_one_fold_is_a_usage_error(tiny_bert, run_cli, tmp_path):
    code, _, err = run_cli(
        "identifiability", "--model", tiny_bert, "--folds", "1", "--output-dir", tmp_path
    )
    assert code == 2 and "--fold-scheme kfold needs --folds of at least 2" in err


@pytest.mark.parametrize("search", ["every-fold", "first-fold"])
def test_first_fold_rate_search_reuses_the_first_choice(monkeypatch, search):
    """``first-fold`` trains the whole grid on fold 0 only; every later fold trains one map per
    layer and kind, at fold 0's choice, and fold 0 itself is the same under both searches."""
    from attrib_bench.analyses import identifiability as module

    calls = []
    real = module.train_map

    def spy(name, train, validation, rate, config):
        calls.append(rate)
        return real(name, train, validation, rate, config)

    monkeypatch.setattr(module, "train_map", spy)
    generator = torch.Generator().manual_seed(0)
    sentences = [torch.randn(2, 5, 4, generator=generator) for _ in range(12)]
    config = IdentifiabilityConfig(
        model="unused",
        folds=3,
        learning_rates=(1e-1, 1e-3),
        rate_search=search,
        max_epochs=3,
        patience=1,
        hidden_units=8,
    )
    result = module.identifiability(None, sentences, config)
    layers, maps = 2, len(module.MAPS)
    expected = layers * maps * (3 * 2 if search == "every-fold" else 2 + 2)
    assert len(calls) == expected
    chosen = result["learning_rates_chosen"]
    if search == "first-fold":
        assert all(len(set(by_fold)) == 1 for by_layer in chosen.values() for by_fold in by_layer)
    other = module.identifiability(
        None, sentences, IdentifiabilityConfig(**{**config.__dict__, "rate_search": "every-fold"})
    )
    for name, per_layer in result["rates"].items():
        assert [rates[0] for rates in per_layer] == [r[0] for r in other["rates"][name]]


def test_hta_time_left_weighs_pairs_by_their_length(monkeypatch):
    """HTA takes the sentences longest first and a pair of n tokens costs about n^2 (n passes
    over n tokens): after the first of a 40-token and three 20-token pairs, the time left is
    the three short pairs' 3 x 400 units at the first's rate, not three of its own duration."""
    import io

    from rich.console import Console

    from attrib_bench.analyses import identifiability as module
    from attrib_bench.core.console import Progress

    now = [0.0]
    buffer = io.StringIO()
    progress = Progress(console=Console(file=buffer, width=200), clock=lambda: now[0], every=0)
    monkeypatch.setattr(module.console, "progress", lambda: progress)

    def contributions(loaded, x_ND, norm, targets):
        n = x_ND.shape[0]
        now[0] += n * n / 100  # 16 s for 40 tokens, 4 s for 20
        return torch.rand(2, n, n)

    monkeypatch.setattr(module, "contributions", contributions)
    sentences = [torch.zeros(3, n, 4) for n in (40, 20, 20, 20)]
    config = IdentifiabilityConfig(model="unused", hta_limit=4)
    module.hta_analysis(type("Loaded", (), {"device": "cpu"})(), sentences, config)
    lines = buffer.getvalue().splitlines()
    assert lines[1] == "HTA (sum): 1/4 (25%), 16s elapsed, ~12s left", lines
    assert lines[-1].startswith("HTA (sum): 4/4 (100%), 28s elapsed"), lines
