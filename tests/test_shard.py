"""Sharded runs on independent machines: ``run --shard i/N`` takes one contiguous slice of the
run's length-sorted batches, and ``merge`` joins the shards into the result of the unsharded run,
in dataset order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHARED_DATA

from attrib_bench.core.errors import UsageError
from attrib_bench.results import Result

#: Seeded methods and evaluators (seeded per example id) beside deterministic ones.
ATTRIBUTORS = ["attention", "saliency", "random", "gradient-shap:samples=4,baselines=2,stdevs=0.1"]
EVALUATORS = ["spearman", "comprehensiveness:ratios=0.2/0.5", "soft-comprehensiveness"]


def run_args(tiny_bert: Path, output: Path, *extra: str) -> list[str]:
    return [
        "run", "--model", str(tiny_bert), "--dataset", "default", "--limit", "6",
        "--attributors", ",".join(ATTRIBUTORS), "--evaluators", ",".join(EVALUATORS),
        "--batch-size", "2", "--no-cache", "--quiet", "--output", str(output), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tiny_bert, tmp_path_factory) -> dict[str, Path]:
    """The full run over six examples in three batches of two, its two shards (the second from a
    config file, so the file's ``shard`` key is read as the flag is), and shard 2/2 with another
    seed."""
    from attrib_bench.cli import main

    folder = tmp_path_factory.mktemp("shard")
    config = folder / "second.toml"
    config.write_text(
        f'model = "{tiny_bert}"\ndataset = "default"\nlimit = 6\nbatch_size = 2\nshard = "2/2"\n'
        f"attributors = {json.dumps(ATTRIBUTORS)}\nevaluators = {json.dumps(EVALUATORS)}\n"
    )
    outputs = {name: folder / f"{name}.json" for name in ("whole", "first", "second", "seed1")}
    commands = {
        "whole": run_args(tiny_bert, outputs["whole"]),
        "first": run_args(tiny_bert, outputs["first"], "--shard", "1/2"),
        "second": ["run", "--config", str(config), "--no-cache", "--quiet",
                   "--output", str(outputs["second"])],
        "seed1": run_args(tiny_bert, outputs["seed1"], "--shard", "2/2", "--seed", "1"),
    }  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTRIB_BENCH_CACHE", str(folder / "cache"))  # never the user's cache
        for name, command in commands.items():
            assert main(command) == 0, name
    return outputs


def test_merging_two_shards_gives_the_full_run(runs, run_cli, tmp_path):
    whole = Result.load(runs["whole"])
    first, second = Result.load(runs["first"]), Result.load(runs["second"])
    assert (first.config["shard"], second.config["shard"]) == ("1/2", "2/2")  # recorded
    # Whole batches: [0, 1) and [1, 3) of the three; each shard's examples in dataset order.
    assert sorted(first.example_ids + second.example_ids) == sorted(whole.example_ids)
    assert (len(first.example_ids), len(second.example_ids)) == (2, 4)
    for shard in (first, second):
        positions = [whole.example_ids.index(i) for i in shard.example_ids]
        assert shard.provenance["dataset"]["positions"] == positions == sorted(positions)
    # Seeds are per example, never per shard: each shard's numbers are the full run's.
    for shard in (first, second):
        rows = [whole.example_ids.index(i) for i in shard.example_ids]
        for spec, method in whole.methods.items():
            for evaluator, kinds in method.per_example.items():
                for kind, layers in kinds.items():
                    mine = shard.methods[spec].per_example[evaluator][kind]
                    assert mine == [[layer[r] for r in rows] for layer in layers], (spec, kind)
    merged_path = tmp_path / "all.json"
    code, out, err = run_cli("merge", runs["second"], runs["first"], "--output", merged_path)
    assert code == 0, err
    assert out.strip() == f"merged 2 results (6 examples) into {merged_path}"
    merged = Result.load(merged_path)
    assert merged.example_ids == whole.example_ids  # shard order, whatever the given order
    for spec, method in whole.methods.items():
        assert merged.methods[spec].per_example == method.per_example, spec
        assert merged.methods[spec].scores == method.scores, spec  # statistics recomputed
        assert merged.methods[spec].evaluators == method.evaluators, spec
    assert merged.paired == whole.paired
    agreement = whole.evaluator_agreement  # between every two evaluators, recomputed
    assert len(agreement.pairs["aggregated"]) == 3
    assert merged.evaluator_agreement.to_json() == agreement.to_json()
    assert merged.config == whole.config  # shard null again: the unsharded run's settings
    assert merged.provenance["dataset"] == whole.provenance["dataset"]  # fingerprint included
    assert merged.provenance["code"] == whole.provenance["code"]
    assert [p["shard"] for p in merged.extra["merged_from"]] == ["1/2", "2/2"]
    code, out, err = run_cli("check", merged_path, "--baseline", runs["whole"])
    assert code == 0 and "Config changes" not in out, out + err
    code, out, _ = run_cli("check", runs["first"], "--baseline", runs["whole"])
    assert code == 1 and "4 baseline example(s) missing" in out  # a shard is not the whole
    assert '`shard`: `null` → `"1/2"`' in out
    code, out, err = run_cli("report", merged_path, "--markdown")
    assert code == 0 and "attention" in out, err


def test_three_shards_hold_the_full_runs_batches(tiny_bert):
    """Seven examples in four batches of two: the shards hold batches [0, 1), [1, 2), [2, 4)
    (floor(i * 4 / 3)), each batch exactly as the full run batches it, so every number is the
    full run's at any batch size."""
    from attrib_bench.runner.engine import prepare
    from attrib_bench.runner.state import RunConfig

    def batches(shard: str | None, limit: int = 7) -> tuple[list[list[str]], list[str]]:
        config = RunConfig(
            model=str(tiny_bert), dataset="default", limit=limit, batch_size=2, shard=shard
        )
        prepared = prepare(config, quiet=True)
        return [[e.id for e in b.examples] for b in prepared.batches], [
            e.id for e in prepared.data.examples
        ]

    everything, order = batches(None)
    shards = [batches(f"{i}/3") for i in (1, 2, 3)]
    assert [batched for batched, _ in shards] == [everything[0:1], everything[1:2], everything[2:4]]
    for _, examples in shards:  # dataset order within a shard
        assert examples == [i for i in order if i in examples]
    assert sorted(i for _, examples in shards for i in examples) == sorted(order)
    with pytest.raises(UsageError, match=r"shard 1/3 holds no example: the data makes 1 batch"):
        batches("1/3", limit=2)


@pytest.mark.parametrize("value", ["0/2", "3/2", "a/b", "1/0", "2", "1/-1", "1/2/3"])
def test_a_bad_shard_is_one_line_and_exit_2(value, tiny_bert, run_cli, tmp_path):
    code, _, err = run_cli(*run_args(tiny_bert, tmp_path / "r.json", "--shard", value))
    assert code == 2
    assert err.strip().count("\n") == 0 and "--shard must be i/N" in err, err
    assert repr(value) in err


def test_an_empty_shard_is_exit_2(tiny_bert, run_cli, tmp_path):
    args = run_args(tiny_bert, tmp_path / "r.json", "--shard", "1/4")
    code, _, err = run_cli(*[("3" if a == "6" else a) for a in args])  # --limit 3: [0, 0)
    assert code == 2 and "shard 1/4 holds no example" in err, err
    assert not (tmp_path / "r.json").exists()


def test_a_config_file_shard_must_be_a_string(tmp_path, run_cli):
    config = tmp_path / "bench.toml"
    config.write_text("shard = 2\n")
    code, _, err = run_cli("run", "--config", config)
    assert code == 2 and "shard must be a string, got 2" in err, err


def edited(path: Path, folder: Path, name: str, change) -> Path:
    """A copy of a result with one change made to its document."""
    document = json.loads(path.read_text())
    change(document)
    copy = folder / name
    copy.write_text(json.dumps(document))
    return copy


def test_merge_refuses_what_is_not_one_run(runs, run_cli, tmp_path):
    first, second, whole = runs["first"], runs["second"], runs["whole"]
    out = tmp_path / "all.json"

    def refused(*parts: Path) -> str:
        code, _, err = run_cli("merge", *parts, "--output", out)
        assert code == 2 and err.strip().count("\n") == 0, err
        assert not out.exists()
        return err

    duplicate = Result.load(first).example_ids[0]
    assert f"example id {duplicate!r} is in parts 1 and 2" in refused(first, first)
    assert "seed is 0 in part 1 and 1 in part 2" in refused(first, runs["seed1"])
    assert "shard(s) 2/2 missing" in refused(first)
    assert "results that are not shards (parts 2)" in refused(first, whole)
    other_model = edited(
        second, tmp_path, "model.json",
        lambda d: d["provenance"]["model"].update(weights_sha256="0" * 64),
    )  # fmt: skip
    assert "different model weights" in refused(first, other_model)
    other_code = edited(second, tmp_path, "code.json", lambda d: d["provenance"].update(code="x"))
    assert "different code" in refused(first, other_code)
    other_data = edited(
        second, tmp_path, "data.json",
        lambda d: d["provenance"]["dataset"].update(fingerprint="0" * 64),
    )  # fmt: skip
    assert "different data (dataset fingerprint)" in refused(first, other_data)
    moved = edited(
        second, tmp_path, "moved.json",
        lambda d: d["provenance"]["dataset"].update(positions=[0, 1, 2, 3]),
    )  # fmt: skip
    assert "positions (provenance.dataset.positions) do not cover" in refused(first, moved)
    thirds = edited(second, tmp_path, "thirds.json", lambda d: d["config"].update(shard="2/3"))
    assert "shards of different counts: 1/2, 2/3" in refused(first, thirds)
    no_ids = edited(second, tmp_path, "no_ids.json", lambda d: d.pop("example_ids"))
    assert "part 2 has no example_ids" in refused(first, no_ids)  # an IndexError before
    assert "does not exist" in refused(first, tmp_path / "missing.json")
    not_result = tmp_path / "other.json"
    not_result.write_text('{"schema": "something else"}')
    assert "is not an attrib-bench result" in refused(first, not_result)


def test_the_api_takes_a_shard(tiny_bert):
    import attrib_bench

    settings = {"model": str(tiny_bert), "dataset": "default", "limit": 5, "cache": False}
    settings |= {"attributors": ["attention"], "evaluators": ["spearman"], "agreement_k": 0}
    settings |= {"batch_size": 2}
    halves = [attrib_bench.run(shard=f"{i}/2", **settings) for i in (1, 2)]
    assert [half.config["shard"] for half in halves] == ["1/2", "2/2"]
    ids = [half.example_ids for half in halves]
    assert (len(ids[0]), len(ids[1])) == (2, 3)  # batches [0, 1) and [1, 3) of three
    assert sorted(ids[0] + ids[1]) == [f"default-test-{i}" for i in range(5)]
    with pytest.raises(UsageError, match="--shard must be i/N"):
        attrib_bench.run(shard="0/2", **settings)


def test_attribute_shards_hold_the_unsharded_files_records(tiny_bert, run_cli, tmp_path):
    """``attribute --shard i/N`` on independent machines: the two files hold, between them,
    every record of the unsharded file (the seeded methods' too), none twice."""

    def attribute(name: str, *extra: str) -> Path:
        output = tmp_path / f"{name}.jsonl"
        args = run_args(tiny_bert, output, *extra)
        args[0] = "attribute"
        evaluators = args.index("--evaluators")
        del args[evaluators : evaluators + 2]  # attribute runs no evaluator, caches nothing
        args.remove("--no-cache")
        code, _, err = run_cli(*args)
        assert code == 0, err
        return output

    def records(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines()]

    whole = attribute("whole")
    parts = [attribute(f"part-{i}", "--shard", f"{i}/2") for i in (1, 2)]
    first, second = records(parts[0]), records(parts[1])
    assert first and second
    assert {r["id"] for r in first}.isdisjoint({r["id"] for r in second})

    def key(record: dict) -> tuple[str, str]:
        return record["id"], record["method"]

    assert sorted(first + second, key=key) == sorted(records(whole), key=key)
    # The concatenation, in shard order, scores as the unsharded file does.
    joined = tmp_path / "joined.jsonl"
    joined.write_text(parts[0].read_text() + parts[1].read_text())
    scored = {}
    for path in (whole, joined):
        out = path.with_suffix(".json")
        code, _, err = run_cli(
            "evaluate", "--model", tiny_bert, "--dataset", "default", "--limit", "6",
            "--attributions", path, "--method", "attention", "--evaluators", "spearman",
            "--batch-size", "2", "--quiet", "--output", out,
        )  # fmt: skip
        assert code == 0, err
        scored[path.stem] = json.loads(out.read_text())["methods"][path.stem]["per_example"]
    assert scored["joined"] == scored["whole"]
    assert len(scored["whole"]["spearman"]["aggregated"][-1]) == 6


def test_shards_of_a_corpus_level_score_merge_to_the_full_run(tiny_bert, run_cli, tmp_path):
    """ERASER's macro IOU F1 is a statistic of the corpus, not a mean over examples: a shard
    keeps its examples' precision and recall (``per_example_parts``), and ``merge`` aggregates
    the union as the run does (before, merge refused it, and so did every torchrun run)."""
    args = [
        "--model", tiny_bert, "--dataset", SHARED_DATA / "hatexplain_eraser", "--limit", "8",
        "--attributors", "attention,saliency", "--evaluators", "iou-f1,spearman",
        "--batch-size", "2", "--max-length", "24", "--no-cache", "--quiet",
    ]  # fmt: skip
    outputs = {name: tmp_path / f"{name}.json" for name in ("whole", "first", "second")}
    for name, shard in (
        ("whole", ()),
        ("first", ("--shard", "1/2")),
        ("second", ("--shard", "2/2")),
    ):
        code, _, err = run_cli("run", *args, *shard, "--output", outputs[name])
        assert code == 0, err
    merged = tmp_path / "merged.json"
    code, _, err = run_cli("merge", outputs["second"], outputs["first"], "--output", merged)
    assert code == 0, err
    whole, joined = json.loads(outputs["whole"].read_text()), json.loads(merged.read_text())
    for spec, method in whole["methods"].items():
        for key in ("scores", "per_example", "per_example_parts"):
            assert joined["methods"][spec][key] == method[key], (spec, key)
    attention = whole["methods"]["attention"]
    macro = attention["scores"]["iou-f1"]["aggregated"][-1]
    per_example_f1 = [
        v for v in attention["per_example"]["iou-f1"]["aggregated"][-1] if v is not None
    ]
    assert macro["n"] >= 3 and macro["mean"] != pytest.approx(
        sum(per_example_f1) / len(per_example_f1)
    )
    assert set(attention["per_example_parts"]["iou-f1"]["aggregated"]) == {"precision", "recall"}
    # The share of rationale words truncation cut off is the whole run's (it was lost: null).
    lost = {name: d["provenance"]["dataset"]["rationale_words_lost"] for name, d in
            (("whole", whole), ("joined", joined))}  # fmt: skip
    assert 0 < lost["whole"] < 1 and lost["joined"] == lost["whole"]
    # Parts are checked like the per-example scores: one value per example id.
    short = json.loads(outputs["first"].read_text())
    short["methods"]["attention"]["per_example_parts"]["iou-f1"]["aggregated"]["recall"][0].pop()
    outputs["first"].write_text(json.dumps(short))
    code, _, err = run_cli("merge", outputs["first"], outputs["second"], "--output", merged)
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "per_example_parts['iou-f1'].aggregated['recall'][0] must be an array of 4" in err
    # A shard written before results kept the parts cannot be aggregated: refused, not averaged.
    older = json.loads(outputs["first"].read_text())
    for method in older["methods"].values():
        method.pop("per_example_parts", None)
    outputs["first"].write_text(json.dumps(older))
    code, _, err = run_cli("merge", outputs["first"], outputs["second"], "--output", merged)
    assert code == 2 and "cannot merge iou-f1: a corpus-level score needs per-example parts" in err


def test_shards_of_different_batch_sizes_are_refused(tiny_bert, run_cli, tmp_path):
    """Shard i is a slice of the batches, so shards at different batch sizes need not partition
    the data (here: 1/2 at batch 2 holds examples 0-3 of 6, 2/2 at batch 3 examples 3-5)."""
    parts = []
    for shard, size in (("1/2", "2"), ("2/2", "3")):
        args = run_args(tiny_bert, tmp_path / f"{size}.json", "--shard", shard)
        args[args.index("--batch-size") + 1] = size
        code, _, err = run_cli(*args)
        assert code == 0, err
        parts.append(tmp_path / f"{size}.json")
    code, _, err = run_cli("merge", *parts, "--output", tmp_path / "all.json")
    assert code == 2 and "batch_size" in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "all.json").exists()


def test_a_merge_with_a_failed_method_exits_3_as_the_run_would(runs, run_cli, tmp_path):
    """A method that failed in one shard failed in the whole: exit 3, as a full run that
    failed would (merge said 0, before)."""

    def fail(document: dict) -> None:
        method = next(iter(document["methods"].values()))
        method.update(status="failed", error="RuntimeError: out of memory")

    broken = edited(runs["second"], tmp_path, "broken.json", fail)
    out = tmp_path / "all.json"
    code, _, err = run_cli("merge", runs["first"], broken, "--output", out)
    assert code == 3, err
    code, _, err = run_cli("merge", runs["first"], runs["second"], "--output", out)
    assert code == 0, err


@pytest.mark.parametrize("rank", ["0", "1"])
@pytest.mark.parametrize("command", ["attribute", "evaluate"])
def test_attribute_and_evaluate_refuse_a_launcher(
    tiny_bert, run_cli, tmp_path, monkeypatch, rank, command
):
    """Under torchrun every process would run the whole job and write one file: refused,
    rank 0 alone saying why (each ran it all, before)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    args = (command, "--model", tiny_bert, "--limit", "2", "--output", tmp_path / "x")
    if command == "evaluate":
        (tmp_path / "x").write_text("")  # a file that exists: the launcher is what is refused
        args += ("--attributions", tmp_path / "x")
    if rank == "0":
        code, _, err = run_cli(*args)
        assert code == 2 and "runs in one process" in err, err
    else:
        with pytest.raises(SystemExit) as exited:
            run_cli(*args)
        assert exited.value.code == 2
