"""benchmarks/method_cost.py on a tiny model: the rows it writes carry measured numbers, and the
time budget turns a method that cannot finish into an "over budget" row instead of a hang."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import SHARED_DATA

from attrib_bench.runner.memory import tensor_megabytes

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "method_cost.py"

pytestmark = pytest.mark.skipif(
    not (SHARED_DATA / "eraser_movies").is_dir(), reason="../shared/data/eraser_movies absent"
)


def _script():
    """The script as a module (registered first: its dataclass looks its module up)."""
    spec = importlib.util.spec_from_file_location("method_cost_script", SCRIPT)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_have_positive_costs_and_the_table_lists_them(tiny_bert, tmp_path):
    output = tmp_path / "cost.json"
    argv = ["--model", str(tiny_bert), "--lengths", "32", "--methods", "attention,saliency"]
    argv += ["--device", "cpu", "--repeats", "2"]
    assert _script().main([*argv, "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert set(report["forward"]["32"]) == {"1", "4"}
    rows = {row["method"]: row for row in report["rows"]}
    assert set(rows) == {"attention", "saliency"}
    for row in rows.values():
        assert (row["status"], row["n"], row["examples"], row["repeats"]) == ("ok", 32, 4, 2)
        for key in ("trace_s_per_example", "attribute_s_per_example", "ratio_to_forward"):
            assert row[key] > 0
        assert row["peak_mb"] == max(row["trace_peak_mb"], row["attribute_peak_mb"])
    # Attention's attribute step holds at least the attention matrices it reads (L, B, H, n, n),
    # counted as the leaderboard counts them, whatever the kernel's high-water mark says.
    config = json.loads((tiny_bert / "config.json").read_text())
    matrices = (config["num_hidden_layers"], 4, config["num_attention_heads"], 32, 32)
    assert rows["attention"]["attribute_peak_mb"] >= tensor_megabytes(torch.empty(matrices)) > 0
    table = output.with_suffix(".md").read_text()
    assert "| attention | 32 |" in table and "| saliency | 32 |" in table


def test_a_method_past_the_budget_is_reported_not_dropped(tiny_bert, tmp_path, capsys):
    output = tmp_path / "cost.json"
    argv = ["--model", str(tiny_bert), "--lengths", "128", "--methods", "occlusion,nosuch"]
    assert _script().main([*argv, "--max-seconds", "0.01", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    (row,) = report["rows"]
    assert (row["method"], row["status"]) == ("occlusion", "over budget")
    assert report["skipped"] == {"nosuch": "not registered"}
    assert report["default_run_rule"] == {"under": [], "not_under": ["occlusion"]}
    assert "note: skipping nosuch" in capsys.readouterr().out


def test_bad_batch_size_is_one_line_and_exit_2(capsys):
    assert _script().main(["--lengths", "32", "--batch-size", "64=2"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
