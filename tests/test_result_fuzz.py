"""Seeded fuzz of the result JSON: ``check`` and ``report`` answer a bad file with one line.

A valid document is mutated at random places (wrong types, missing or unexpected keys, strings
among scores, lists of the wrong length, null, NaN, infinity, huge integers); every mutant must
either work or raise ``UsageError`` with a one-line message, never any other exception.
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from test_check import document

from attrib_bench.core.errors import UsageError
from attrib_bench.reports.gate import gate_markdown
from attrib_bench.reports.html import render_html
from attrib_bench.reports.markdown import render_markdown
from attrib_bench.results.compare import compare
from attrib_bench.results.typed import load_results

MUTANTS = 300
#: Replacement values: each is the wrong type or an out-of-range value somewhere.
WRONG = [
    None,
    "x",
    "0.5",
    "",
    "a\nb",
    0,
    -1,
    2.5,
    True,
    [],
    {},
    [None],
    [1, 2, 3],
    {"a": 1},
    {"aggregated": []},
    math.nan,
    math.inf,
    10**400,
]


def valid(directory: Path) -> dict[str, Any]:
    """A result with every part check and report read: layers, both kinds, cache, provenance."""
    doc = document({"a": [0.1, 0.5, None, 0.9], "b:x=1": [0.3, 0.2, 0.4, None]})
    for spec, method in doc["methods"].items():
        rows = method["per_example"]["spearman"]["aggregated"][0]
        layer = {"layer": 1, "mean": 0.4, "std": 0.1, "ci95": [0.1, 0.7], "n": 3, "nan": 1}
        method["scores"]["spearman"] = {
            "aggregated": [layer, {**layer, "layer": 2}],
            "local": [layer, {**layer, "layer": 2, "mean": None, "ci95": [None, None]}],
        }
        method["per_example"]["spearman"] = {"aggregated": [rows, rows], "local": [rows, rows]}
        method["peak_memory_mb"] = 1.5
        method["added_as_floor"] = spec == "a"
    doc["evaluator_info"]["spearman"].update(description="d", needs_reference=True)
    doc["provenance"].update(
        packages={"torch": "2.0", "captum": None},
        python="3.11",
        seed=0,
        hardware={"device": "cpu", "cpu_count": 2},
    )
    doc["provenance"]["dataset"].update(truncated=0, max_length=128)
    doc["cache"] = {
        "dir": str(directory),  # empty: the report finds no entries there
        "methods": {"a": "0" * 32, "b:x=1": "1" * 32},
        "reference": "2" * 32,
        "examples": {example: f"{i:032x}" for i, example in enumerate(doc["example_ids"])},
        "hits": {"a": 0, "b:x=1": 4},
    }
    doc["finetune"] = {"epochs": 1}
    return doc


def places(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path into the document: keys of objects, indices of arrays."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += places(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += places(item, (*path, index))
    return found


def mutate(doc: dict[str, Any], rng: random.Random) -> str:
    """Change one random place in ``doc``; returns what was done, for the failure message."""
    path = rng.choice(places(doc)[1:])
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    key, target = path[-1], parent[path[-1]]
    choice = rng.random()
    if choice < 0.25 and isinstance(parent, dict):
        del parent[key]
        return f"deleted {path}"
    if choice < 0.4 and isinstance(target, dict):
        added = rng.choice(["extra", "aggregated", "status", "n", "x\ny"])
        target[added] = rng.choice(WRONG)
        return f"added {added!r} to {path}"
    if choice < 0.55 and isinstance(target, list):
        if target and rng.random() < 0.5:
            target.pop(rng.randrange(len(target)))
        else:
            target.append(rng.choice([*target, *WRONG]) if target else rng.choice(WRONG))
        return f"resized {path}"
    parent[key] = rng.choice(WRONG)
    return f"set {path} = {parent[key]!r}"


def answers(action, *args) -> None:
    """Runs ``action``: it may succeed or raise a one-line UsageError, nothing else."""
    try:
        result = action(*args)
        if hasattr(result, "markdown"):
            gate_markdown(result)
    except UsageError as error:
        message = str(error)
        assert message and "\n" not in message, message


@pytest.mark.parametrize("seed", range(3))
def test_mutated_results_give_a_usage_error_or_an_answer(tmp_path, seed):
    rng = random.Random(seed)
    base = valid(tmp_path)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(base))
    outcomes = {"usage error": 0, "loaded": 0}
    for index in range(MUTANTS // 3):
        mutant = copy.deepcopy(base)
        done = [mutate(mutant, rng) for _ in range(rng.randint(1, 3))]
        path = tmp_path / "mutant.json"
        path.write_text(json.dumps(mutant))
        try:
            loaded = load_results(path)
        except UsageError as error:
            assert "\n" not in str(error) and str(path) in str(error), (done, str(error))
            outcomes["usage error"] += 1
            continue
        except Exception as error:  # the assertion below says which mutation broke what
            pytest.fail(f"load_results: {type(error).__name__}: {error} after {done}")
        outcomes["loaded"] += 1
        steps = [
            (compare, loaded, load_results(good)),
            (compare, load_results(good), loaded),
            (render_markdown, loaded),
        ]
        if index % 5 == 0:  # the plots are the slow part
            steps.append((render_html, loaded))
        for action, *args in steps:
            try:
                answers(action, *args)
            except AssertionError:
                raise
            except Exception as error:
                pytest.fail(f"{action.__name__}: {type(error).__name__}: {error} after {done}")
    # Both branches ran: the fuzz neither rejects everything nor never hits the validation.
    # Most mutants are refused (the schema wants every key a run writes), 7 to 16 in 100 load.
    assert min(outcomes.values()) > MUTANTS // 60, outcomes


def test_mutants_exit_2_with_one_line_through_the_cli(run_cli, tmp_path):
    rng = random.Random(7)
    base = valid(tmp_path)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(base))
    for _ in range(15):
        mutant = copy.deepcopy(base)
        done = mutate(mutant, rng)
        path = tmp_path / "mutant.json"
        path.write_text(json.dumps(mutant))
        for args in (("check", path, "--baseline", good), ("report", path)):
            code, _, err = run_cli(*args)
            assert code in (0, 1, 2), (done, args[0], err)
            if code == 2:
                assert err.startswith("error:") and err.strip().count("\n") == 0, (done, err)
