"""The masked fine-tune of ``attrib-bench finetune --masking BETA``: its erasures, its seeding
and cache, the keys of plain fine-tunes unchanged, and the held-out accuracy tolerance."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers import ARCHITECTURES

from attrib_bench.core.errors import UsageError
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model import finetune as finetune_module
from attrib_bench.model.finetune import (
    FinetuneConfig,
    cache_key,
    finetune,
    masked_inputs,
    read_metadata,
)
from attrib_bench.model.load import load_model
from attrib_bench.toolkit.erasure import example_generator

SENTENCES = [
    ("a gripping and beautifully acted film", 1),
    ("dull , lifeless and far too long", 0),
    ("one of the best movies of the year", 1),
    ("a tedious mess with nothing to say", 0),
    ("warm , funny and surprisingly moving", 1),
    ("the plot is thin and the jokes fall flat", 0),
]


@pytest.fixture
def tiny_data(tmp_path) -> str:
    """A train and a dev split of six sentences each (dev: the same sentences)."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = "".join(f"{text}\t{label}\n" for text, label in SENTENCES)
    for split in ("train", "dev"):
        (folder / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
    return str(folder)


def _config(model: Path, data: str, **changes) -> FinetuneConfig:
    return FinetuneConfig(model=str(model), dataset=data, batch_size=3, max_length=16, **changes)


def test_a_plain_fine_tune_keeps_the_key_it_had():
    """Digests computed by the code before ``masking`` existed (commit a6e60ea)."""
    plain = FinetuneConfig(model="hub/some-model", dataset="default")
    assert cache_key(plain, "abc123") == "75870715174b394ca337"
    assert cache_key(FinetuneConfig(**{**plain.__dict__, "reinit_top": 2}), "abc123") == (
        "4098e801e018acd9fbfb"
    )
    masked = {
        cache_key(FinetuneConfig(**{**plain.__dict__, "masking": m}), "abc123")
        for m in (
            0.1,
            0.2,
        )
    }
    assert len(masked) == 2 and "75870715174b394ca337" not in masked


def test_masked_inputs_erase_the_share_of_real_tokens_only(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    data = load_examples("default", "train", limit=8)
    (batch,), _ = make_batches(data.examples, loaded.tokenizer, 8, 32)
    candidates_BN = batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool()
    n_B = candidates_BN.sum(dim=1).double()
    mask_id = loaded.tokenizer.mask_token_id
    counts = []
    generator = example_generator(0, "masking")
    for _ in range(400):
        inputs = masked_inputs(batch, 0.15, loaded.tokenizer, generator)
        erased_BN = inputs["input_ids"] != batch.input_ids_BN
        assert not (erased_BN & ~candidates_BN).any()  # never [CLS], [SEP] or padding
        assert (inputs["input_ids"][erased_BN] == mask_id).all()
        counts.append(erased_BN.sum(dim=1).double())
        # floor or ceil of share * n: stochastic rounding
        assert ((counts[-1] - 0.15 * n_B).abs() < 1).all()
    mean_B = torch.stack(counts).mean(dim=0)
    assert torch.allclose(mean_B, 0.15 * n_B, atol=0.12)  # the expected share is the share
    again = masked_inputs(batch, 0.15, loaded.tokenizer, example_generator(0, "masking"))
    first = masked_inputs(batch, 0.15, loaded.tokenizer, example_generator(0, "masking"))
    assert torch.equal(again["input_ids"], first["input_ids"])  # seeded


def test_masked_inputs_delete_where_the_tokenizer_has_no_mask_token(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    tokenizer = copy.deepcopy(loaded.tokenizer)
    tokenizer.mask_token = None
    assert tokenizer.mask_token_id is None
    data = load_examples("default", "train", limit=4)
    (batch,), _ = make_batches(data.examples, loaded.tokenizer, 4, 32)
    inputs = masked_inputs(batch, 0.5, tokenizer, example_generator(0, "masking"))
    kept_B = inputs["attention_mask"].sum(dim=1)
    real_B = batch.attention_mask_BN.sum(dim=1)
    assert (kept_B < real_B).all()  # shorter: tokens deleted, not replaced
    assert loaded.tokenizer.mask_token_id not in inputs["input_ids"].tolist()


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    return {k: v.clone() for k, v in loaded.model.state_dict().items()}


def test_the_masked_fine_tune_is_seeded_cached_and_records_both_accuracies(
    tiny_bert, tiny_data, tmp_path, monkeypatch
):
    config = _config(tiny_bert, tiny_data, masking=0.3)
    first = finetune(config, quiet=True, architectures=ARCHITECTURES, accuracy_tolerance=1.0)
    metadata = read_metadata(first)
    assert metadata["config"]["masking"] == 0.3
    assert metadata["masking_removal"] == "mask"
    assert metadata["eval_split"] == "dev"
    original = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    data = load_examples(tiny_data, "dev")
    assert metadata["original_eval_accuracy"] == finetune_module._accuracy(original, data, 64, 16)

    def no_training(*args, **kwargs):
        raise AssertionError("a cached fine-tune was trained again")

    monkeypatch.setattr(finetune_module, "_train", no_training)
    assert finetune(config, quiet=True, architectures=ARCHITECTURES) == first  # cached
    monkeypatch.undo()

    monkeypatch.setenv("ATTRIB_BENCH_CACHE", str(tmp_path / "other-cache"))
    again = finetune(config, quiet=True, architectures=ARCHITECTURES, accuracy_tolerance=1.0)
    assert again != first
    trained, retrained = _weights(first), _weights(again)
    assert all(torch.equal(trained[k], retrained[k]) for k in trained)  # seeded
    plain = _weights(
        finetune(_config(tiny_bert, tiny_data), quiet=True, architectures=ARCHITECTURES)
    )
    assert any(not torch.equal(trained[k], plain[k]) for k in trained)  # the masking trained


def test_a_masked_fine_tune_losing_accuracy_is_refused(tiny_bert, tiny_data, monkeypatch, run_cli):
    """The fine-tuned model scores 0.6, the original 0.9 (an injected accuracy): refused with
    one line; accepted, without training again, under a tolerance above the drop."""
    accuracies = iter([0.6, 0.9])  # _build measures the fine-tuned model first
    monkeypatch.setattr(finetune_module, "_accuracy", lambda *args: next(accuracies))
    args = ("finetune", "--model", tiny_bert, "--dataset", tiny_data, "--masking", "0.3")
    code, out, err = run_cli(*args, "--batch-size", "3", "--quiet")
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert "lost 0.3000 accuracy on dev (0.9000 -> 0.6000)" in err
    assert "--accuracy-tolerance" in err

    def no_training(*args, **kwargs):
        raise AssertionError("a cached fine-tune was trained again")

    monkeypatch.setattr(finetune_module, "_train", no_training)
    code, out, err = run_cli(*args, "--batch-size", "3", "--quiet", "--accuracy-tolerance", "0.35")
    assert code == 0, err
    assert "accuracy: 0.6000 on dev (original model: 0.9000)" in out
    with pytest.raises(UsageError, match=r"more than the tolerance 0\.02"):
        config = FinetuneConfig(str(tiny_bert), tiny_data, None, batch_size=3, masking=0.3)
        finetune(config, architectures=ARCHITECTURES)


@pytest.mark.parametrize("masking", ["1", "-0.1"])
def test_a_masking_outside_the_unit_interval_is_one_line(tiny_bert, run_cli, masking):
    code, _, err = run_cli("finetune", "--model", tiny_bert, "--masking", masking, "--quiet")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "--masking must lie in [0, 1)" in err


def test_an_eraser_folders_val_split_is_the_held_out_one(tmp_path):
    """ERASER folders name their held-out split ``val``: a fine-tune on ``test`` (HateXplain
    here ships no train split) measures its accuracy there, so the tolerance can be checked."""
    import json

    folder = tmp_path / "eraser"
    folder.mkdir()
    documents, splits = [], {"test": [], "val": []}
    for i, (text, label) in enumerate(SENTENCES):
        documents.append(json.dumps({"docid": f"d{i}", "document": text}) + "\n")
        annotation = {"annotation_id": f"d{i}", "classification": "POS" if label else "NEG"}
        splits["test" if i < 3 else "val"].append(json.dumps({**annotation, "evidences": [[]]}))
    (folder / "docs.jsonl").write_text("".join(documents))
    for split, lines in splits.items():
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    config = FinetuneConfig(model="unused", dataset=str(folder), split="test")
    held_out = finetune_module._eval_data(config, "test")
    assert held_out is not None and held_out.split == "val"
    assert [e.id for e in held_out.examples] == ["d3", "d4", "d5"]
