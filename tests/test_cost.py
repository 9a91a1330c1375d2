"""Cost columns (seconds and peak memory per method), the random floor, opt-in evaluators."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from attrib_bench.memory import PeakMemory, standalone_megabytes, tensor_megabytes


def test_peak_memory_sees_an_allocation_freed_before_the_end():
    with PeakMemory(torch.device("cpu")) as peak:
        block = torch.ones(64, 2**20 // 4)  # 64 MB, touched
        block.add_(1)
        del block
    assert 48 < peak.megabytes < 200


def test_tensor_megabytes_and_the_standalone_charge():
    one_mb = torch.zeros(2**20 // 4)
    assert tensor_megabytes({"a": [one_mb, (one_mb,)], "b": "text"}) == pytest.approx(2.0)
    trace = SimpleNamespace(
        attentions=(one_mb, one_mb),
        hidden_states=(),
        values=(),
        pre_ln1=(one_mb,),
        pre_ln2=(one_mb,),
        shared={"old": [one_mb], "new": one_mb},
        accessed={"old", "new"},
    )
    # 0.5 own + 2 attention tensors + 2 pre-LN tensors + "old" (computed by another method)
    assert standalone_megabytes(
        trace, {"attentions", "pre_layernorm"}, 0.5, computed_before={"old"}
    ) == pytest.approx(5.5)


def run(run_cli, tmp_path, *args):
    output = tmp_path / "result.json"
    code, out, err = run_cli("run", *args, "--limit", "4", "--quiet", "--output", output)
    assert code == 0, err
    return json.loads(output.read_text()), out


def test_cost_columns_and_the_random_floor(tiny_bert, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    document, out = run(run_cli, tmp_path, "--model", tiny_bert, "--attributors", "attention")
    assert list(document["methods"]) == ["attention", "random"]
    assert document["methods"]["random"]["added_as_floor"] is True
    assert document["methods"]["attention"]["added_as_floor"] is False
    attention = document["methods"]["attention"]
    assert attention["peak_memory_mb"] > 0 and attention["seconds_per_example"] > 0
    assert "peak MB" in out and "s/ex" in out and "random: added as the floor" in out
    # Only spearman runs by default: the costly evaluators are opt-in.
    assert set(document["evaluators"]) == {"spearman"}
    assert document["evaluator_info"]["spearman"] == {
        "description": document["evaluator_info"]["spearman"]["description"],
        "needs_reference": True,
        "higher_is_better": True,
    }


def test_selected_random_is_not_marked_added(tiny_bert, run_cli, tmp_path):
    document, out = run(
        run_cli, tmp_path, "--model", tiny_bert, "--attributors", "random,attention"
    )
    assert list(document["methods"]) == ["random", "attention"]
    assert not any(m["added_as_floor"] for m in document["methods"].values())
    assert "added as the floor" not in out


def test_lower_is_better_evaluators_sort_ascending(tiny_bert, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    document, out = run(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--attributors",
        "saliency,attention",
        "--evaluators",
        "sufficiency:ratios=0.5",
    )
    assert "sufficiency:ratios=0.5 (aggregated, lower is better)" in out
    means = {
        spec: m["scores"]["sufficiency:ratios=0.5"]["aggregated"][0]["mean"]
        for spec, m in document["methods"].items()
    }
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│ ")]
    assert rows == sorted(means, key=means.get)
