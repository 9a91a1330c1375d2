"""The README's main command: ``attrib-bench run`` on the embedded default, fine-tuning included.

Fine-tuning MiniLM takes 20 s on an idle 2-core machine and minutes on a loaded one, so the
session does it once (``shared_default_model`` in conftest.py, through ``ensure_default_model``,
the function a plain ``run`` calls). Here ``run`` must find that model under the cache key of its
own recipe, and use it without training again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from attrib_bench.model.finetune import FinetuneConfig, default_model_source, read_metadata


@pytest.mark.slow
@pytest.mark.xdist_group("default_model")  # one worker fine-tunes it (conftest.py)
def test_default_run_uses_the_fine_tuned_default_model_and_scores(
    default_model, run_cli, tmp_path, monkeypatch
):
    # What the session's fine-tune was: the documented recipe, on the generated train split.
    metadata = read_metadata(default_model)
    assert metadata["config"] == asdict(
        FinetuneConfig(model=default_model_source(), dataset="default")
    )
    assert (metadata["train_split"], metadata["train_examples"]) == ("train", 2400)
    assert metadata["eval_split"] == "test"  # held out: the split `run` scores by default
    assert metadata["eval_accuracy"] > 0.9  # the generated data is learnable in one epoch

    # `run` computes the same cache key and loads that model: training would raise here.
    monkeypatch.setattr("attrib_bench.model.finetune._train", lambda *a: pytest.fail("retrained"))
    output = tmp_path / "result.json"
    args = ["run", "--limit", "8", "--attributors", "globenc,saliency,random", "--quiet"]
    code, out, err = run_cli(*args, "--output", output)
    assert code == 0, err
    assert "globenc" in out and "spearman vs saliency" in out
    document = json.loads(output.read_text())
    model = document["provenance"]["model"]
    assert Path(model["id"]).parent == Path(os.environ["ATTRIB_BENCH_CACHE"]) / "models"
    assert Path(model["id"]).resolve() == default_model.resolve()
    assert model["type"] == "bert" and not model["fresh_head"]
    assert document["provenance"]["dataset"]["name"] == "default"
    assert document["provenance"]["dataset"]["split"] == "test"
    assert len(document["example_ids"]) == 8
    assert len(document["methods"]["globenc"]["scores"]["spearman"]["aggregated"]) == 6
