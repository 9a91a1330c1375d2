"""``attrib-bench evaluate``: attributions from a file score as the run that computed them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attrib_bench.core.registry import load_registry
from attrib_bench.runner.engine import prepare
from attrib_bench.runner.outside import FileAttributor, read_file
from attrib_bench.runner.state import RunConfig

DATA = ("--dataset", "default", "--limit", "4", "--quiet")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def attributed(tiny_bert, tmp_path_factory) -> Path:
    """``attribute`` output of saliency and rollout on four default examples."""
    from attrib_bench.cli import main

    output = tmp_path_factory.mktemp("attributed") / "mine.jsonl"
    methods = ("--attributors", "saliency,rollout")
    code = main(["attribute", "--model", str(tiny_bert), *DATA, *methods, "--output", str(output)])
    assert code == 0
    return output


def _evaluate(run_cli, model: Path, path: Path, out: Path, *extra: str) -> dict:
    code, _, err = run_cli(
        "evaluate", "--model", model, *DATA, "--attributions", path, "--output", out, *extra
    )
    assert code == 0, err
    return json.loads(out.read_text())


def test_evaluate_scores_an_attribute_file_as_run_did(tiny_bert, attributed, run_cli, tmp_path):
    evaluators = ("--evaluators", "comprehensiveness,sufficiency,spearman")
    run_json = tmp_path / "run.json"
    code, _, err = run_cli(
        "run", "--model", tiny_bert, *DATA, "--attributors", "saliency,rollout", *evaluators,
        "--no-floor", "--no-cache", "--output", run_json,
    )  # fmt: skip
    assert code == 0, err
    ran = json.loads(run_json.read_text())
    scored = _evaluate(run_cli, tiny_bert, attributed, tmp_path / "ev.json", *evaluators)
    for spec in ("saliency", "rollout"):
        per_example = scored["methods"][f"mine/{spec}"]["per_example"]
        assert per_example == ran["methods"][spec]["per_example"]
        assert set(per_example) == {"comprehensiveness", "sufficiency", "spearman"}
    assert scored["methods"]["saliency"]["added_as_reference"]  # run for spearman
    assert scored["provenance"]["attributions"]["format"] == "attribute"
    # A normal result: the gate and the report take it.
    code, _, err = run_cli("check", tmp_path / "ev.json", "--baseline", tmp_path / "ev.json")
    assert code == 0, err
    code, out, err = run_cli("report", tmp_path / "ev.json", "--markdown")
    assert code == 0, err
    assert "mine/rollout" in out


def test_every_format_gives_the_same_numbers_from_the_same_scores(
    tiny_bert, attributed, run_cli, tmp_path
):
    rows = [r for r in _records(attributed) if r["method"] == "rollout"]
    by_id = {r["id"]: r for r in rows}
    last = {r["id"]: r["aggregated"][-1] for r in rows}  # one row per example
    generic = _write_jsonl(
        tmp_path / "generic.jsonl",
        [{"id": i, "tokens": by_id[i]["tokens"], "scores": s} for i, s in last.items()],
    )
    config = RunConfig(model=str(tiny_bert), dataset="default", limit=4)
    examples = prepare(config, quiet=True).data.examples
    texts = {e.id: e.text for e in examples}
    by_text = _write_jsonl(
        tmp_path / "by_text.jsonl",
        [{"text": texts[i], "tokens": by_id[i]["tokens"], "scores": s} for i, s in last.items()],
    )
    as_dict = tmp_path / "captum_dict.pt"
    torch.save({i: torch.tensor(s) for i, s in last.items()}, as_dict)
    as_list = tmp_path / "captum_list.pt"  # (1, N, D) per example, in dataset order, D summed
    torch.save(
        [torch.stack([torch.tensor(last[e.id]), torch.zeros(len(last[e.id]))], -1)[None]
         for e in examples],
        as_list,
    )  # fmt: skip
    layered = _write_jsonl(
        tmp_path / "layered.jsonl",
        [{"id": r["id"], "tokens": r["tokens"], "scores": r["aggregated"]} for r in rows],
    )

    wanted = _evaluate(run_cli, tiny_bert, attributed, tmp_path / "own.json", "--method", "rollout")
    assert list(wanted["methods"]) == ["mine"]  # no reference evaluator: no reference run
    assert set(wanted["evaluators"]) == {"comprehensiveness", "sufficiency"}
    own = wanted["methods"]["mine"]["per_example"]
    expected = {name: [kinds["aggregated"][-1]] for name, kinds in own.items()}
    for path, extra in (
        (generic, ()),
        (by_text, ()),
        (as_dict, ()),
        (as_list, ("--reduce", "sum")),
    ):
        document = _evaluate(run_cli, tiny_bert, path, tmp_path / f"{path.stem}.json", *extra)
        per_example = document["methods"][path.stem]["per_example"]
        assert {n: [k["aggregated"][-1]] for n, k in per_example.items()} == expected, path
    every_layer = _evaluate(run_cli, tiny_bert, layered, tmp_path / "layered.json")
    assert every_layer["methods"]["layered"]["per_example"] == {
        name: {"aggregated": kinds["aggregated"]} for name, kinds in own.items()
    }


def test_eraser_word_scores_spread_to_every_sub_token(tiny_bert, tmp_path):
    config = RunConfig(model=str(tiny_bert), dataset="default", limit=1)
    prepared = prepare(config, quiet=True)
    example = prepared.data.examples[0]
    tokens = prepared.batches[0].tokens[0]
    # The hand check below is for this sentence: "cookbook" is two sub-tokens.
    assert example.text == "the critics regretted the cookbook last weekend ."
    assert tokens == [
        "[CLS]", "the", "critics", "regretted", "the", "cook", "##book", "last", "weekend",
        ".", "[SEP]",
    ]  # fmt: skip
    words = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    path = _write_jsonl(
        tmp_path / "eraser.jsonl",
        [
            {
                "annotation_id": example.id,
                "rationales": [{"docid": "d", "soft_rationale_predictions": words}],
                "classification": "POS",
            }
        ],
    )
    (method,) = read_file(path, "eraser", prepared.data.examples, None, "l2").values()
    attributor = FileAttributor("eraser", method, path)
    attributor.check(prepared)
    spread = attributor.rows[example.id].aggregated_LN
    np.testing.assert_array_equal(spread, [[0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 0]])


def _one_line_error(run_cli, model: Path, path: Path, *extra: str) -> str:
    code, _, err = run_cli("evaluate", "--model", model, *DATA, "--attributions", path, *extra)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_bad_files_fail_with_one_line(tiny_bert, attributed, run_cli, tmp_path):
    rows = [r for r in _records(attributed) if r["method"] == "saliency"]
    wrong = [dict(r) for r in rows]
    first = wrong[0]
    first["tokens"] = [*first["tokens"][:2], "banana", *first["tokens"][3:]]
    err = _one_line_error(run_cli, tiny_bert, _write_jsonl(tmp_path / "wrong.jsonl", wrong))
    assert repr(first["id"]) in err and "token 2 is 'banana'" in err

    missing = _write_jsonl(tmp_path / "missing.jsonl", rows[1:])
    err = _one_line_error(run_cli, tiny_bert, missing)
    assert f"{missing}: example {rows[0]['id']!r} of saliency: no attributions (by id)" in err

    unknown = _write_jsonl(tmp_path / "unknown.jsonl", [{"foo": 1}])
    assert "unknown attributions format" in _one_line_error(run_cli, tiny_bert, unknown)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\xff\xfe\x00binary")
    assert "neither JSONL nor a torch.save file" in _one_line_error(run_cli, tiny_bert, garbage)


def test_file_methods_never_shadow_a_registered_attributor(tiny_bert, attributed, run_cli):
    assert "saliency" in load_registry([]).attributors
    code, _, err = run_cli(
        "evaluate", "--model", tiny_bert, *DATA, "--attributions", attributed,
        "--method", "saliency", "--name", "saliency",
    )  # fmt: skip
    assert code == 2 and "is a registered attributor" in err


def test_the_class_scored_is_the_one_the_file_explains(tiny_bert, run_cli, tmp_path):
    """An attribute file's method keeps its own target; a generic file's ``target`` wins."""
    gold = ("--attributors", "saliency:target=gold")
    own = tmp_path / "gold.jsonl"
    assert run_cli("attribute", "--model", tiny_bert, *DATA, *gold, "--output", own)[0] == 0
    run_json = tmp_path / "run.json"
    code, _, err = run_cli(
        "run", "--model", tiny_bert, *DATA, *gold, "--evaluators", "comprehensiveness",
        "--no-floor", "--no-cache", "--output", run_json,
    )  # fmt: skip
    assert code == 0, err
    wanted = json.loads(run_json.read_text())["methods"]["saliency:target=gold"]["per_example"]
    evaluators = ("--evaluators", "comprehensiveness")
    scored = _evaluate(run_cli, tiny_bert, own, tmp_path / "own.json", *evaluators)
    assert scored["methods"]["gold"]["per_example"] == wanted

    config = RunConfig(model=str(tiny_bert), dataset="default", limit=4)
    labels = {e.id: e.label for e in prepare(config, quiet=True).data.examples}
    rows = _records(own)
    records = [{"id": r["id"], "tokens": r["tokens"], "scores": r["aggregated"]} for r in rows]
    targeted = _write_jsonl(
        tmp_path / "targeted.jsonl", [{**r, "target": labels[r["id"]]} for r in records]
    )
    untargeted = _write_jsonl(tmp_path / "untargeted.jsonl", records)
    document = _evaluate(run_cli, tiny_bert, targeted, tmp_path / "t.json", *evaluators)
    assert document["methods"]["targeted"]["per_example"] == wanted
    document = _evaluate(run_cli, tiny_bert, untargeted, tmp_path / "u.json", *evaluators)
    assert document["methods"]["untargeted"]["per_example"] != wanted  # the predicted class


def _generic(attributed: Path) -> list[dict]:
    """The saliency rows of ``attributed`` as generic records."""
    rows = [r for r in _records(attributed) if r["method"] == "saliency"]
    return [{"id": r["id"], "tokens": r["tokens"], "scores": r["aggregated"][-1]} for r in rows]


def _eraser(attributed: Path, soft) -> list[dict]:
    ids = [r["id"] for r in _records(attributed) if r["method"] == "saliency"]
    return [{"annotation_id": i, "rationales": [{"soft_rationale_predictions": soft}]} for i in ids]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("target -1", "target must be a class index >= 0, got -1"),
        ("target true", "target must be a class index >= 0, got True"),
        ("target 2", "has target 2, but the model has 2 classes"),
        ("nan score", "a score is not a finite number"),
        ("inf score", "a score is not a finite number"),
        ("null score", "a score is not a finite number"),
        ("ragged layers", "rows of unequal length"),
        ("more layers", "holds 2 aggregated and no local rows, the first example 1 and no"),
        ("duplicate id", "appears twice"),
        ("huge number", "scores are not numbers"),
        ("eraser rationales", "rationales must be a list of objects"),
        ("eraser strings", "scores are not numbers"),
        ("eraser ragged", "scores are not numbers"),
        ("eraser scalar", "scores must be a list of numbers"),
        ("eraser nested", "scores must be a list of numbers"),
        ("empty file", "is empty"),
    ],
)
def test_malformed_scores_and_targets_fail_with_one_line(
    tiny_bert, attributed, run_cli, tmp_path, case, expected
):
    """Bad values in a file are one line, exit 2, before any pass: never a traceback, a failed
    method (exit 3), nor a silently wrong class (a negative index wraps around)."""
    records = _generic(attributed)
    first = records[0]
    if case.startswith("target"):
        records = [{**r, "target": 0} for r in records]
        records[0]["target"] = {"target -1": -1, "target true": True, "target 2": 2}[case]
    elif case == "huge number":  # an integer no float holds
        first["scores"] = [10**400, *first["scores"][1:]]
    elif case.endswith(" score"):
        first["scores"] = list(first["scores"])
        first["scores"][1] = {"nan score": float("nan"), "inf score": float("inf")}.get(case)
    elif case == "eraser rationales":
        records = [{**r, "rationales": ["x"]} for r in _eraser(attributed, [1.0])]
    elif case == "ragged layers":
        first["scores"] = [first["scores"], first["scores"][:-1]]
    elif case == "more layers":  # in a batch of its own: scored without a word, before
        first["scores"] = [first["scores"], first["scores"]]
    elif case == "duplicate id":
        records.append(dict(first))
    elif case.startswith("eraser"):
        soft = {
            "eraser strings": ["high", "low"],
            "eraser ragged": [[1.0], [1.0, 2.0]],
            "eraser scalar": 0.5,
            "eraser nested": [[1.0, 2.0], [3.0, 4.0]],
        }[case]
        records = _eraser(attributed, soft)
    else:
        records = []
    path = _write_jsonl(tmp_path / "bad.jsonl", records)
    err = _one_line_error(run_cli, tiny_bert, path, "--batch-size", "1")
    assert expected in err
    assert str(path) in err  # the path as given, never only the stem the method is named by
    if case not in ("empty file", "ragged layers") and not case.startswith("eraser"):
        assert repr(first["id"]) in err or "line 1" in err  # names the example


def test_the_progress_bar_says_scoring_not_attributing(tiny_bert, attributed, run_cli, tmp_path):
    """``evaluate`` computes no attributions: its bar names what it does."""
    code, _, err = run_cli(
        "evaluate", "--model", tiny_bert, "--dataset", "default", "--limit", "2",
        "--attributions", attributed, "--method", "saliency", "--output", tmp_path / "ev.json",
    )  # fmt: skip
    assert code == 0, err
    assert "scoring" in err and "attributing" not in err


def test_method_that_failed_in_the_file_is_named_as_failed(
    tiny_bert, attributed, run_cli, tmp_path
):
    records = [*_records(attributed), {"method": "lime", "error": "RuntimeError: out of memory"}]
    path = _write_jsonl(tmp_path / "failed.jsonl", records)
    code, _, err = run_cli(
        "evaluate", "--model", tiny_bert, *DATA, "--attributions", path, "--method", "lime"
    )
    assert code == 2 and "lime failed when the file was written: RuntimeError" in err, err


def test_the_run_target_of_an_attribute_file_is_scored(tiny_bert, run_cli, tmp_path):
    """``attribute --target`` is recorded, and ``evaluate`` scores that target (it scored the
    predicted class before); a different ``--target`` is refused."""
    gold = ("--target", "score=gold", "--attributors", "saliency")
    path = tmp_path / "gold.jsonl"
    assert run_cli("attribute", "--model", tiny_bert, *DATA, *gold, "--output", path)[0] == 0
    assert {r["target"] for r in _records(path)} == {"position=first,score=gold"}
    run_json = tmp_path / "run.json"
    evaluators = ("--evaluators", "comprehensiveness,sufficiency")
    code, _, err = run_cli(
        "run", "--model", tiny_bert, *DATA, *gold, *evaluators, "--no-floor", "--no-cache",
        "--output", run_json,
    )  # fmt: skip
    assert code == 0, err
    ran = json.loads(run_json.read_text())
    predicted = tmp_path / "predicted.json"
    assert run_cli("run", "--model", tiny_bert, *DATA, "--attributors", "saliency", *evaluators,
                   "--no-floor", "--no-cache", "--output", predicted)[0] == 0  # fmt: skip
    # The tiny model predicts another class than the gold one for some example: the check bites.
    assert (
        json.loads(predicted.read_text())["methods"]["saliency"]["per_example"]
        != (ran["methods"]["saliency"]["per_example"])
    )
    scored = _evaluate(run_cli, tiny_bert, path, tmp_path / "ev.json", *evaluators)
    assert scored["methods"]["gold"]["per_example"] == ran["methods"]["saliency"]["per_example"]
    assert scored["target"]["spec"] == "position=first,score=gold"
    code, _, err = run_cli(
        "evaluate", "--model", tiny_bert, *DATA, "--attributions", path, "--target",
        "score=predicted",
    )  # fmt: skip
    assert code == 2 and "explains target position=first,score=gold" in err, err


def test_an_evaluator_that_re_runs_the_method_fails_on_file_scores(
    tiny_bert, attributed, run_cli, tmp_path
):
    """``sanity`` re-runs the method on a randomised model: the file's rows again would score
    a perfect 1.0 (exit 0, before). It fails with its reason, the others still score."""
    code, _, err = run_cli(
        "evaluate", "--model", tiny_bert, *DATA, "--attributions", attributed,
        "--method", "saliency", "--evaluators", "sanity,comprehensiveness",
        "--output", tmp_path / "ev.json",
    )  # fmt: skip
    assert code == 3, err
    assert "re-runs the method" in err
    document = json.loads((tmp_path / "ev.json").read_text())
    assert document["evaluators"]["sanity"]["status"] == "failed"
    assert "comprehensiveness" in document["methods"]["mine"]["per_example"]


def test_records_of_different_runs_are_refused(tiny_bert, run_cli, tmp_path):
    """Two ``attribute`` files at different targets (or seeds), concatenated: one evaluation
    scores one target, so line 1's would be applied to all (exit 0, before)."""
    lines = []
    for target in ("score=gold", "score=predicted"):
        path = tmp_path / f"{target}.jsonl"
        code, _, err = run_cli(
            "attribute", "--model", tiny_bert, *DATA, "--attributors", "saliency",
            "--target", target, "--output", path,
        )  # fmt: skip
        assert code == 0, err
        lines += path.read_text().splitlines(keepends=True)[:2]
    both = tmp_path / "both.jsonl"
    both.write_text("".join(lines))
    assert "holds records of different runs" in _one_line_error(run_cli, tiny_bert, both)


def test_a_method_that_failed_midway_is_dropped_and_the_run_is_partial(
    tiny_bert, attributed, run_cli, tmp_path
):
    """A method that failed after some batches left rows and an error line: it is not scored
    (it made evaluate stop with 'no attributions', before), the others are, exit 3."""
    partial = [{**r, "method": "lime"} for r in _records(attributed) if r["method"] == "saliency"][
        :2
    ]
    error = {"method": "lime", "error": "RuntimeError: out of memory"}
    path = _write_jsonl(tmp_path / "midway.jsonl", [*_records(attributed), *partial, error])
    out = tmp_path / "ev.json"
    code, _, err = run_cli(
        "evaluate", "--model", tiny_bert, *DATA, "--attributions", path, "--output", out
    )
    assert code == 3, err
    document = json.loads(out.read_text())
    assert set(document["methods"]) == {"midway/saliency", "midway/rollout"}
    assert document["provenance"]["attributions"]["failed"] == {"lime": error["error"]}


def test_the_seed_of_an_attribute_file_is_adopted(tiny_bert, run_cli, tmp_path):
    """soft-comprehensiveness samples masks from the seed: evaluate without --seed scores as
    the run with the file's seed did (it used seed 0, before); another --seed is refused."""
    seeded = ("--seed", "3", "--attributors", "saliency")
    path = tmp_path / "seeded.jsonl"
    assert run_cli("attribute", "--model", tiny_bert, *DATA, *seeded, "--output", path)[0] == 0
    evaluators = ("--evaluators", "soft-comprehensiveness")
    run_json = tmp_path / "run.json"
    code, _, err = run_cli(
        "run", "--model", tiny_bert, *DATA, *seeded, *evaluators, "--no-floor", "--no-cache",
        "--output", run_json,
    )  # fmt: skip
    assert code == 0, err
    ran = json.loads(run_json.read_text())["methods"]["saliency"]["per_example"]
    scored = _evaluate(run_cli, tiny_bert, path, tmp_path / "ev.json", *evaluators)
    assert scored["methods"]["seeded"]["per_example"] == ran
    code, _, err = run_cli(
        "evaluate", "--model", tiny_bert, *DATA, "--attributions", path, "--seed", "0"
    )
    assert code == 2 and "was written with --seed 3" in err, err


@pytest.mark.parametrize("command", ["run", "attribute", "evaluate"])
def test_bad_seeds_and_outputs_are_one_line_before_the_work(
    tiny_bert, attributed, run_cli, tmp_path, command
):
    """A negative or huge seed failed after the whole run (exit 4), as did an output that is a
    directory or cannot be written."""
    given = ("--attributions", attributed) if command == "evaluate" else ()
    base = (command, "--model", tiny_bert, *DATA, *given)
    for seed in ("-1", str(10**20)):
        code, _, err = run_cli(*base, "--seed", seed, "--output", tmp_path / "x.json")
        assert code == 2 and "--seed must be a whole number" in err, err
    code, _, err = run_cli(*base, "--output", tmp_path)
    assert code == 2 and "is a directory" in err, err
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(*base, "--output", blocker / "x.json")
    assert code == 2 and "cannot make the folder" in err, err
