"""A fine-tune that ends near chance is warned about, by ``finetune`` and ``finetune --seeds``.

Near chance: held-out accuracy below the held-out split's majority-class rate plus
``CHANCE_MARGIN`` (attrib_bench.model.finetune). ``run --models`` says so too
(test_seed_invariance).
"""

from __future__ import annotations

import pytest

from attrib_bench.model import finetune as finetune_module
from attrib_bench.model.finetune import CHANCE_MARGIN, near_chance


@pytest.mark.parametrize(
    ("accuracy", "rate", "near"),
    [
        (0.51, 0.5, True),
        (0.5 + CHANCE_MARGIN - 0.001, 0.5, True),
        (0.5 + CHANCE_MARGIN, 0.5, False),
        (0.9, 0.5, False),
        (0.6, 0.58, True),  # an unbalanced split: 0.6 is barely above always answering 0
        (0.26, 0.25, True),
        (None, 0.5, False),  # no held-out split
        (0.51, None, False),  # metadata written before the rate was recorded
    ],
)
def test_near_chance_is_within_the_margin_of_the_majority_class_rate(accuracy, rate, near):
    metadata = {"eval_accuracy": accuracy, "eval_majority_rate": rate, "eval_split": "test"}
    reason = near_chance(metadata)
    assert (reason is not None) == near
    if near:
        assert f"held-out accuracy {accuracy:.4f} on test is near chance" in reason
        assert f"majority class alone scores {rate:.4f}" in reason


def test_finetune_seeds_warns_about_each_seed_near_chance(tiny_bert, run_cli, monkeypatch):
    """Both seeds end at 0.51 on a binary task: each is named (before: accuracy 0.51, silence)."""
    monkeypatch.setattr(finetune_module, "_accuracy", lambda *args: 0.51)
    common = ("finetune", "--model", tiny_bert, "--dataset", "default", "--limit", "16")
    code, out, err = run_cli(*common, "--batch-size", "16", "--quiet", "--seeds", "0,1")
    assert code == 0, err
    assert out.count("accuracy: 0.5100 on test") == 2, out
    warned = [line for line in err.splitlines() if "near chance" in line]
    assert len(warned) == 2, err
    for seed, line in zip((0, 1), warned, strict=True):
        # the default data's test split: 306 of 600 sentences are negative
        assert f"seed {seed}: held-out accuracy 0.5100 on test is near chance" in line
        assert "majority class alone scores 0.5100" in line
    code, _, err = run_cli(*common, "--batch-size", "16", "--quiet", "--seeds", "0,1")
    assert code == 0 and err.count("near chance") == 2, err  # cached models too
