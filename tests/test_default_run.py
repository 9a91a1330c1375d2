"""The README's main command: ``attrib-bench run`` on the embedded default, fine-tuning included."""

from __future__ import annotations

import json

import pytest

from attrib_bench.model.finetune import read_metadata


@pytest.mark.slow
def test_default_run_fine_tunes_minilm_once_and_scores(run_cli, tmp_path, monkeypatch):
    output = tmp_path / "result.json"
    args = ["run", "--limit", "8", "--attributors", "globenc,saliency,random", "--quiet"]
    code, out, err = run_cli(*args, "--output", output)
    assert code == 0, err
    assert "globenc" in out and "spearman vs saliency" in out
    document = json.loads(output.read_text())
    model = document["provenance"]["model"]
    assert model["type"] == "bert" and not model["fresh_head"]
    assert document["provenance"]["dataset"]["name"] == "default"
    assert document["provenance"]["dataset"]["split"] == "test"
    metadata = read_metadata(model["id"])
    assert metadata["eval_accuracy"] > 0.9  # the generated data is learnable in one epoch
    assert len(document["methods"]["globenc"]["scores"]["spearman"]["aggregated"]) == 6

    # A second run reuses the cached model: training would raise here.
    monkeypatch.setattr("attrib_bench.model.finetune._train", lambda *a: pytest.fail("retrained"))
    code, _, err = run_cli(*args, "--output", tmp_path / "again.json")
    assert code == 0, err
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["provenance"]["model"]["weights_sha256"] == model["weights_sha256"]
