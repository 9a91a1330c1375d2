"""The runner's contract with plugins and data: bad attributions and scores fail alone, the
reference and the floor are rows, ids are unique, and every outcome reaches the JSON and the
exit code."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from attrib_bench.runner.cache import NO_CACHE_ENV

BAD_PLUGINS = """
    import math

    import numpy as np
    import torch

    import attrib_bench


    class Bad:
        requires = frozenset()

        def __init__(self, name, description, make):
            self.name, self.description, self.make = name, description, make

        def attribute(self, trace):
            mask_BN = trace.mask_BN.float()
            return self.make(mask_BN)


    def nan_at_real(mask_BN):
        rows_BN = mask_BN.clone()
        rows_BN[0, 0] = math.nan
        return attrib_bench.Attribution(aggregated_BLN=rows_BN[:, None, :])


    def padding_scored(mask_BN):
        return attrib_bench.Attribution(aggregated_BLN=torch.ones_like(mask_BN)[:, None, :])


    class Picky:
        name = "picky"
        description = "Raises on one method only"
        needs_reference = False

        def score(self, attribution, context):
            if context.attributor.name == "attention":
                raise RuntimeError("picky dislikes attention")
            shape = (attribution.aggregated_BLN.shape[1], len(context.trace.batch.examples))
            return {"aggregated": np.ones(shape)}


    class Undefined:
        name = "undefined"
        description = "NaN for every example"
        needs_reference = False

        def score(self, attribution, context):
            shape = (attribution.aggregated_BLN.shape[1], len(context.trace.batch.examples))
            return {"aggregated": np.full(shape, np.nan)}


    class WrongShape:
        name = "wrong-shape"
        description = "Returns one score per batch"
        needs_reference = False

        def score(self, attribution, context):
            return {"aggregated": np.ones(3)}


    @attrib_bench.hookimpl
    def attrib_bench_attributors():
        return [
            Bad("two-d", "Returns (B, N)", lambda m: attrib_bench.Attribution(aggregated_BLN=m)),
            Bad("not-attribution", "Returns a tensor", lambda m: m[:, None, :]),
            Bad("nan-at-real", "NaN at a real token", nan_at_real),
            Bad("padding-scored", "Scores padding", padding_scored),
        ]


    @attrib_bench.hookimpl
    def attrib_bench_evaluators():
        return [Picky(), Undefined(), WrongShape()]
"""

#: Texts of very different lengths, so a batch of them is padded.
TEXTS = [
    "a fine film",
    "the plot was thin but the actors carried every long scene with real warmth and wit",
    "dull",
    "an uneven yet often moving portrait of a family",
]


@pytest.fixture
def plugin(tmp_path) -> Path:
    path = tmp_path / "bad_plugins.py"
    path.write_text(textwrap.dedent(BAD_PLUGINS))
    return path


def write_tsv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("idx\tsentence\tlabel\n" + "".join(f"{i}\t{t}\t0\n" for i, t in rows))
    return path


@pytest.fixture
def padded_data(tmp_path) -> Path:
    return write_tsv(tmp_path / "padded.tsv", [(str(i), t) for i, t in enumerate(TEXTS)])


def run_json(run_cli, tmp_path, *args, name="result.json"):
    output = tmp_path / name
    code, out, err = run_cli("run", *args, "--quiet", "--output", output)
    document = json.loads(output.read_text()) if output.is_file() else None
    return code, document, out, err


def test_invalid_attributions_fail_their_method_in_one_line(
    tiny_bert, plugin, padded_data, run_cli, tmp_path, monkeypatch
):
    monkeypatch.delenv(NO_CACHE_ENV)  # the cache code once crashed on a 2-D attribution
    bad = "two-d,not-attribution,nan-at-real,padding-scored"
    code, document, _, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--dataset", padded_data,
        "--attributors", f"{bad},attention", "--plugin", plugin,
    )  # fmt: skip
    assert code == 3, err
    assert "Traceback" not in err
    methods = document["methods"]
    expected = {
        "two-d": "invalid attribution: aggregated_BLN has shape (4, ",
        "not-attribution": "invalid attribution: returned a Tensor, not an attrib_bench.Attrib",
        "nan-at-real": "invalid attribution: aggregated_BLN holds NaN or infinite values at real",
        "padding-scored": "invalid attribution: aggregated_BLN is not zero at padded positions",
    }
    for spec, message in expected.items():
        assert methods[spec]["status"] == "failed"
        assert methods[spec]["error"].startswith(message), methods[spec]["error"]
    assert "expected (B=4, L or 1, N=" in methods["two-d"]["error"]
    for spec in ("attention", "saliency", "random"):
        assert methods[spec]["status"] == "ok"
        assert len(methods[spec]["per_example"]["spearman"]["aggregated"][-1]) == 4


def test_an_evaluator_failing_on_one_method_scores_the_others(tiny_bert, plugin, run_cli, tmp_path):
    code, document, out, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--limit", "4",
        "--attributors", "attention,rollout", "--evaluators", "spearman,picky,wrong-shape",
        "--plugin", plugin,
    )  # fmt: skip
    assert code == 3, err
    assert all(e["status"] == "ok" for e in document["evaluators"].values())
    attention, rollout = document["methods"]["attention"], document["methods"]["rollout"]
    assert attention["evaluators"]["picky"] == {
        "status": "failed",
        "error": "RuntimeError: picky dislikes attention",
    }
    assert "picky" not in attention["scores"] and "spearman" in attention["scores"]
    assert rollout["evaluators"]["picky"]["status"] == "ok"
    assert rollout["scores"]["picky"]["aggregated"][-1]["n"] == 4
    # A score of the wrong shape is caught where it is received, per pair, in one line.
    shape_error = rollout["evaluators"]["wrong-shape"]
    assert shape_error["status"] == "failed"
    assert shape_error["error"] == (
        "ValueError: score() returned aggregated scores of shape (3,); expected (layers, 4)"
    )
    assert "picky failed: RuntimeError: picky dislikes attention" in " ".join(out.split())


def test_a_method_undefined_on_every_example_is_flagged_and_partial(
    tiny_bert, plugin, run_cli, tmp_path
):
    code, document, _, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--limit", "4",
        "--attributors", "attention", "--evaluators", "spearman,undefined", "--plugin", plugin,
    )  # fmt: skip
    assert code == 3, err
    assert "attention: undefined is undefined (NaN) on every example" in " ".join(err.split())
    pair = document["methods"]["attention"]["evaluators"]["undefined"]
    assert pair == {"status": "undefined", "error": "NaN on every example"}
    assert document["methods"]["attention"]["scores"]["undefined"]["aggregated"][-1]["nan"] == 4
    assert document["methods"]["attention"]["evaluators"]["spearman"]["status"] == "ok"


def test_the_unselected_reference_and_floor_are_rows(tiny_bert, run_cli, tmp_path):
    code, document, out, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--limit", "4", "--attributors", "attention"
    )
    assert code == 0, err
    methods = document["methods"]
    assert list(methods) == ["attention", "saliency", "random"]
    assert methods["saliency"]["added_as_reference"] and methods["random"]["added_as_floor"]
    assert methods["saliency"]["scores"]["spearman"]["aggregated"][0]["mean"] == pytest.approx(1)
    caption = " ".join(out.split())
    assert "saliency: added as the reference; random: added as the floor" in caption


def test_duplicate_ids_are_refused_with_the_first_few_named(tiny_bert, run_cli, tmp_path):
    data = write_tsv(
        tmp_path / "dupes.tsv",
        [("1", "good"), ("2", "bad"), ("1", "fine"), ("3", "meh"), ("2", "ok"), ("4", "x")],
    )
    code, _, err = run_cli("run", "--model", tiny_bert, "--dataset", data, "--quiet")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err
    message = " ".join(" ".join(lines).split())
    assert "has 2 duplicate example ids: '1' (2x), '2' (2x); ids come from the 'idx' column" in (
        message
    )


def test_contentless_inputs_are_warned_about_and_counted(tiny_bert, run_cli, tmp_path):
    data = write_tsv(
        tmp_path / "empty.tsv", [("a", "a good film"), ("b", "   "), ("c", "😀😀"), ("d", "bad")]
    )
    code, document, _, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--dataset", data, "--attributors", "attention"
    )
    assert code == 0, err
    assert "2 of 4 inputs have no content token" in " ".join(err.split())
    assert "'b', 'c'" in err
    assert document["provenance"]["dataset"]["contentless"] == 2


@pytest.mark.parametrize("flag", ["--attributors", "--evaluators"])
def test_an_empty_spec_list_is_a_usage_error_not_everything(flag, run_cli, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli("run", flag, " , ", "--quiet")
    assert exit_info.value.code == 2
    assert "expected one or more comma-separated specs, got ' , '" in capsys.readouterr().err


def test_attribute_writes_records_in_dataset_order(tiny_bert, padded_data, run_cli, tmp_path):
    output = tmp_path / "attributions.jsonl"
    code, _, err = run_cli(
        "attribute", "--model", tiny_bert, "--dataset", padded_data, "--batch-size", "2",
        "--attributors", "attention,saliency", "--quiet", "--output", output,
    )  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(r["id"], r["method"]) for r in records] == [
        (str(i), method) for i in range(len(TEXTS)) for method in ("attention", "saliency")
    ]


def test_progress_moves_per_method_within_a_batch(tiny_bert, monkeypatch):
    """One batch of four and two methods: two steps of four, not one step at the batch's end;
    each step's work is the batch's padded tokens (what the time left is estimated from)."""
    from attrib_bench.core import console
    from attrib_bench.runner.engine import attribution_stream, prepare
    from attrib_bench.runner.state import MethodState, RunConfig

    steps: list[int] = []
    works: list[tuple[float, bool]] = []

    class Recorder:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def add_task(self, description: str, total: int, work: float) -> int:
            steps.append(-total)
            works.append((-work, False))
            return 0

        def advance(self, task: int, amount: int, work: float, free: bool = False) -> None:
            steps.append(amount)
            works.append((work, free))

    monkeypatch.setattr(console, "progress", Recorder)
    prepared = prepare(RunConfig(model=str(tiny_bert), limit=4, batch_size=4), quiet=True)
    registry = prepared.registry
    methods = [MethodState(s, registry.attributor(s)) for s in ("attention", "saliency")]
    padded = [batch.input_ids_BN.numel() for batch in prepared.batches]
    for _ in attribution_stream(prepared, methods, seed=0, quiet=True):
        pass
    assert steps == [-8, 0, 4, 4]
    assert prepared.batches.padded_tokens() == padded
    assert works == [(-2 * padded[0], False), (0, True), (padded[0], False), (padded[0], False)]


def test_shipped_configs_write_nothing_into_the_checkout():
    from attrib_bench.runner.config import read_config

    configs = sorted((Path(__file__).parents[1] / "benchmarks").glob("*.toml"))
    assert configs
    for path in configs:
        assert "output" not in read_config(path), path


def test_a_crash_is_an_internal_error_not_a_regression(run_cli, tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    result = tmp_path / "r.json"
    result.write_text("{}")
    monkeypatch.setattr("attrib_bench.results.typed.load_results", crash)
    code, _, err = run_cli("check", result, "--baseline", result)
    assert code == 4
    assert "internal error: RuntimeError: boom (exit 4" in " ".join(err.split())


def test_a_reference_that_is_a_selected_method_or_the_floor_runs_once(tiny_bert, run_cli, tmp_path):
    code, document, _, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--limit", "4",
        "--attributors", "rollout", "--reference", "rollout:residual=0.5",
    )  # fmt: skip
    assert code == 0, err
    assert list(document["methods"]) == ["rollout", "random"]  # the same method after defaults
    code, document, _, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--limit", "4",
        "--attributors", "attention", "--reference", "random", name="floor.json",
    )  # fmt: skip
    assert code == 0, err
    assert list(document["methods"]) == ["attention", "random"]
    assert document["methods"]["random"]["added_as_reference"]


def test_a_batchs_erasures_are_pooled_over_methods_and_evaluators(tiny_bert, monkeypatch):
    """The runner calls every pair's ``plan`` before any ``score``: each batch's erasures, over
    two methods and two evaluators, run in one pass (tiny inputs, far under the token budget),
    where scoring pair by pair runs several; the per-example scores are the same."""
    from attrib_bench.runner.engine import run_benchmark
    from attrib_bench.runner.state import RunConfig
    from attrib_bench.toolkit import erasure
    from attrib_bench_plugins import faithfulness

    passes: list[int] = []
    forward = erasure.forward_erased

    def counted(trace, inputs, *args, **kwargs):
        passes.append(len(inputs["input_ids"]))
        return forward(trace, inputs, *args, **kwargs)

    monkeypatch.setattr(erasure, "forward_erased", counted)
    config = RunConfig(
        model=str(tiny_bert), dataset="default", limit=8, batch_size=4, device="cpu",
        attributors=["attention", "saliency"], evaluators=["comprehensiveness", "sufficiency"],
        floor=False,
    )  # fmt: skip

    def per_example(document):
        return {
            spec: {name: scores["aggregated"] for name, scores in m["per_example"].items()}
            for spec, m in document["methods"].items()
        }

    pooled = per_example(run_benchmark(config, quiet=True, cache=False))
    assert len(passes) == 2  # one a batch
    pooled_rows, passes[:] = sum(passes), []
    for cls in {*faithfulness.Comprehensiveness.__mro__, *faithfulness.Sufficiency.__mro__}:
        if "plan" in vars(cls):
            monkeypatch.delattr(cls, "plan")
    alone = per_example(run_benchmark(config, quiet=True, cache=False))
    assert len(passes) > 2
    assert sum(passes) == pooled_rows  # the same erasures, shared between pairs either way
    assert pooled == alone
