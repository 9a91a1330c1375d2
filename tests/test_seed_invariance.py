"""Runs over several models (``run --models``) and the seed-invariance evaluator.

The math against float64 loops written from the definition (scipy's Spearman per pair, Python
sets for the top-k overlap); the run end to end through the CLI: its per-example scores equal
those recomputed from each model's own ``attribute`` output, identical models agree perfectly,
each model's results are cached as a single-model run's, and bad input is one line, exit 2.
"""

from __future__ import annotations

import json
import shutil
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from attrib_bench.core.registry import load_registry
from attrib_bench.runner.cache import NO_CACHE_ENV

QUIET = ("--quiet", "--batch-size", "4")
METHODS = "saliency,globenc,attention"


def _perturbed(source: Path, directory: Path, seed: int) -> Path:
    """A copy of ``source`` with every weight moved by seeded noise: a stand-in seed model."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(source)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(source).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def seeds(tiny_bert, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("seeds")
    return [tiny_bert, *(_perturbed(tiny_bert, root / f"seed{s}", s) for s in (1, 2))]


def _evaluator(spec: str):
    return load_registry().evaluator(spec)


def _loop_spearman(a, b):
    return np.array([spearmanr(a[layer], b[layer]).statistic for layer in range(len(a))])


def _loop_jaccard(a, b, k):
    out = []
    for layer in range(len(a)):
        # top k by score, ties to the earlier position, as the evaluators rank
        top_a = set(sorted(range(a.shape[1]), key=lambda i: (-a[layer, i], i))[:k])
        top_b = set(sorted(range(b.shape[1]), key=lambda i: (-b[layer, i], i))[:k])
        out.append(len(top_a & top_b) / len(top_a | top_b))
    return np.array(out)


@pytest.mark.parametrize("n", [3, 8, 17])
def test_scores_equal_float64_loops_from_the_definition(n):
    rng = np.random.default_rng(n)
    rows = [rng.normal(size=(4, n)) for _ in range(3)]
    rows[2][:, 0] = rows[2][:, 1]  # a tie
    floor = rng.normal(size=(4, n))
    pairs = list(combinations(rows, 2))
    expected = {
        "seed-invariance": np.mean([_loop_spearman(a, b) for a, b in pairs], axis=0),
        "seed-invariance:measure=jaccard,k=3": np.mean(
            [_loop_jaccard(a, b, 3) for a, b in pairs], axis=0
        ),
        "seed-invariance:against=random-init": np.mean(
            [_loop_spearman(a, floor) for a in rows], axis=0
        ),
        "seed-invariance:measure=jaccard,k=5,against=random-init": np.mean(
            [_loop_jaccard(a, floor, 5) for a in rows], axis=0
        ),
    }
    for spec, values in expected.items():
        evaluator = _evaluator(spec)
        given = floor if evaluator.needs_floor else None
        np.testing.assert_allclose(evaluator.score_models(rows, given), values, atol=1e-12)


def test_identical_rows_agree_fully_and_reversed_rows_disagree_fully():
    row = np.array([[0.1, 0.5, 0.2, 0.9, 0.3]])
    spearman = _evaluator("seed-invariance")
    jaccard = _evaluator("seed-invariance:measure=jaccard,k=2")
    assert spearman.score_models([row, row.copy()], None) == pytest.approx([1.0])
    assert spearman.score_models([row, -row], None) == pytest.approx([-1.0])
    assert jaccard.score_models([row, row.copy()], None) == pytest.approx([1.0])
    assert jaccard.score_models([row, -row], None) == pytest.approx([0.0])


def _run(run_cli, tmp_path: Path, name: str, *args) -> dict:
    output = tmp_path / f"{name}.json"
    code, _, err = run_cli("run", *args, "--output", output, *QUIET)
    assert code == 0, err
    return json.loads(output.read_text())


def _attributions(run_cli, tmp_path: Path, model: Path) -> dict:
    output = tmp_path / f"{Path(model).name}.jsonl"
    args = ("--model", model, "--limit", "8", "--attributors", METHODS, *QUIET)
    code, _, err = run_cli("attribute", *args, "--output", output)
    assert code == 0, err
    records = [json.loads(line) for line in output.read_text().splitlines()]
    return {(r["method"], r["id"]): np.array(r["aggregated"]) for r in records}


def test_per_example_scores_are_the_mean_over_model_pairs_of_each_models_rows(
    seeds, run_cli, tmp_path
):
    models = ",".join(map(str, seeds))
    document = _run(
        run_cli, tmp_path, "three", "--models", models, "--limit", "8", "--attributors", METHODS
    )
    rows = [_attributions(run_cli, tmp_path, model) for model in seeds]
    floor_model = document["models"]["floor_model"]
    assert floor_model.startswith("random-init:") and floor_model.endswith("@seed0")
    for spec in METHODS.split(","):
        per_example = document["methods"][spec]["per_example"]
        for index, example_id in enumerate(document["example_ids"]):
            under = [r[(spec, example_id)] for r in rows]
            expected = np.mean([_loop_spearman(a, b) for a, b in combinations(under, 2)], axis=0)
            got = [layer[index] for layer in per_example["seed-invariance"]["aggregated"]]
            np.testing.assert_allclose(got, expected, atol=1e-9)
            expected = np.mean([_loop_jaccard(a, b, 5) for a, b in combinations(under, 2)], axis=0)
            got = [
                layer[index]
                for layer in per_example["seed-invariance:measure=jaccard"]["aggregated"]
            ]
            np.testing.assert_allclose(got, expected, atol=1e-12)
    # The floor is scored, with a CI, beside the seed agreement.
    floor = document["methods"]["globenc"]["scores"]["seed-invariance:against=random-init"]
    assert floor["aggregated"][-1]["ci95"][0] <= floor["aggregated"][-1]["mean"]
    assert document["evaluators"]["seed-invariance:against=random-init"]["status"] == "ok"


def test_two_copies_of_one_model_agree_perfectly_and_beat_the_floor(tiny_bert, run_cli, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(tiny_bert, twin)
    document = _run(
        run_cli,
        tmp_path,
        "twins",
        "--models",
        f"{tiny_bert},{twin}",
        "--limit",
        "8",
        "--attributors",
        METHODS,
    )
    for spec in (*METHODS.split(","), "random"):
        scores = document["methods"][spec]["scores"]
        for kind, layers in scores["seed-invariance"].items():
            assert all(layer["mean"] == pytest.approx(1.0) for layer in layers), (spec, kind)
        assert scores["seed-invariance:measure=jaccard"]["aggregated"][-1]["mean"] == 1.0
    for spec in METHODS.split(","):  # a random init is not the same model
        floor = document["methods"][spec]["scores"]["seed-invariance:against=random-init"]
        assert floor["aggregated"][-1]["mean"] < 0.9, spec
    ranking = document["models"]["ranking"]
    assert ranking["evaluator"] == "spearman"
    assert "saliency" not in ranking["methods"]  # the reference is 1 by construction
    assert ranking["mean"] == pytest.approx(1.0) and ranking["min"] == pytest.approx(1.0)


def test_each_model_is_cached_as_its_own_single_model_run(seeds, run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    first, second = seeds[0], seeds[1]
    limit = ("--limit", "6", "--attributors", METHODS)
    document = _run(
        run_cli,
        tmp_path,
        "pair",
        "--models",
        f"{first},{second}",
        "--evaluators",
        "spearman,seed-invariance",
        *limit,
    )
    alone = _run(run_cli, tmp_path, "alone", "--model", second, "--evaluators", "spearman", *limit)
    assert set(alone["cache"]["hits"].values()) == {6}  # nothing recomputed
    per_model = document["models"]["per_model"][1]["last_layer"]
    for spec, method in alone["methods"].items():
        assert per_model[spec]["spearman"] == method["scores"]["spearman"]["aggregated"][-1]["mean"]
    again = _run(
        run_cli,
        tmp_path,
        "again",
        "--models",
        f"{first},{second}",
        "--evaluators",
        "spearman,seed-invariance",
        *limit,
    )
    assert set(again["cache"]["hits"].values()) == {6}
    assert (
        again["methods"]["globenc"]["per_example"] == document["methods"]["globenc"]["per_example"]
    )


def test_models_in_a_config_file(seeds, run_cli, tmp_path):
    config = tmp_path / "bench.toml"
    names = ", ".join(f'"{m}"' for m in seeds[:2])
    config.write_text(
        f'models = [{names}]\nlimit = 4\nattributors = ["attention"]\n'
        'evaluators = ["seed-invariance:measure=jaccard,k=2"]\n'
    )
    document = _run(run_cli, tmp_path, "configured", "--config", config)
    assert document["config"]["models"] == [str(m) for m in seeds[:2]]
    assert "seed-invariance:measure=jaccard,k=2" in document["evaluators"]
    assert document["models"]["floor_model"] is None  # no evaluator asked for the floor


def test_a_seed_model_fine_tuned_near_chance_is_warned_about(seeds, run_cli, tmp_path):
    """Seed invariance of models that learned nothing says little: the run says which."""
    from attrib_bench.model.finetune import METADATA_FILE

    weak = Path(shutil.copytree(seeds[1], tmp_path / "weak"))
    metadata = {"eval_accuracy": 0.51, "eval_majority_rate": 0.5, "eval_split": "test"}
    (weak / METADATA_FILE).write_text(json.dumps(metadata))
    code, _, err = run_cli(
        "run", "--models", f"{seeds[0]},{weak}", "--limit", "2", "--attributors", "attention",
        "--evaluators", "seed-invariance:measure=jaccard,k=2", *QUIET,
    )  # fmt: skip
    assert code == 0, err
    warned = [line for line in err.splitlines() if "near chance" in line]
    assert len(warned) == 1 and f"--models {weak}: held-out accuracy 0.5100" in warned[0], err


@pytest.mark.parametrize(
    "args, message",
    [
        (("--models", "{a}"), "at least 2"),
        (("--models", "{a},{a}"), "twice"),
        (("--models", "{a},{b}", "--model", "{a}"), "not both"),
        (("--model", "{a}", "--evaluators", "seed-invariance"), "compares models"),
        (("--models", "{a},{b}", "--evaluators", "seed-invariance:k=0"), "at least 1"),
        (("--models", "{a},{b}", "--evaluators", "seed-invariance:measure=kendall"), "choices"),
        (("--models", "{a},{r}"), "share the architecture"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(seeds, tiny_roberta, run_cli, args, message):
    values = {"a": seeds[0], "b": seeds[1], "r": tiny_roberta}
    code, out, err = run_cli("run", *(a.format(**values) for a in args), "--limit", "4", *QUIET)
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], err


def test_models_of_different_depth_are_refused_before_any_work(seeds, tmp_path, run_cli):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(seeds[0])
    config.num_hidden_layers = 2
    shallow = tmp_path / "shallow"
    AutoModelForSequenceClassification.from_config(config).save_pretrained(shallow)
    AutoTokenizer.from_pretrained(seeds[0]).save_pretrained(shallow)
    code, _, err = run_cli("run", "--models", f"{seeds[0]},{shallow}", "--limit", "4", *QUIET)
    assert code == 2 and "3 layers" in err and "of 2" in err, err
    assert "attributing" not in err
