"""Model families as plugins: specs from plugin files, clashes, capability checks, live weights."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch
from test_plugins import assert_one_line_error, write_module

import attrib_bench
from attrib_bench import EvalContext, UsageError
from attrib_bench.core.adapter import EncoderAdapter, unmet_needs
from attrib_bench.core.architecture_spec import ArchitectureSpec
from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.gradient import Saliency
from attrib_bench_plugins.sanity import ModelRandomization

#: A RoBERTa descendant transformers knows and attrib-bench does not: what a third party adds.
DATA2VEC_FAMILY = """
    import attrib_bench
    from attrib_bench.core.architecture_spec import ArchitectureSpec


    @attrib_bench.hookimpl
    def attrib_bench_architectures():
        return [ArchitectureSpec(model_types=("data2vec-text",), positions="after_padding")]
"""

#: Megatron-BERT: BERT's layout with pre-LN blocks (the norms sit before each sublayer).
MEGATRON_FAMILY = """
    import attrib_bench
    from attrib_bench.core.architecture_spec import ArchitectureSpec


    @attrib_bench.hookimpl
    def attrib_bench_architectures():
        return [
            ArchitectureSpec(
                model_types=("megatron-bert",),
                ln1="attention.ln",
                ln2="ln",
                final_norm="encoder.ln",
                block="pre-ln",
            )
        ]
"""

ANOTHER_BERT = """
    import attrib_bench
    from attrib_bench.core.architecture_spec import ArchitectureSpec


    @attrib_bench.hookimpl
    def attrib_bench_architectures():
        return [ArchitectureSpec(model_types=("bert",))]
"""


@pytest.fixture(scope="module")
def data2vec(tiny_roberta, tmp_path_factory) -> Path:
    """tiny_roberta's weights in a Data2VecText classifier: same numbers, unknown model type."""
    from transformers import (
        AutoTokenizer,
        Data2VecTextConfig,
        Data2VecTextForSequenceClassification,
        RobertaForSequenceClassification,
    )

    roberta = RobertaForSequenceClassification.from_pretrained(tiny_roberta)
    settings = roberta.config.to_dict()
    for key in ("model_type", "architectures", "transformers_version"):
        settings.pop(key, None)
    model = Data2VecTextForSequenceClassification(Data2VecTextConfig(**settings))
    state = {k.replace("roberta.", "data2vec_text.", 1): v for k, v in roberta.state_dict().items()}
    model.load_state_dict(state)
    directory = tmp_path_factory.mktemp("data2vec")
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(tiny_roberta).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def megatron(tiny_bert, tmp_path_factory) -> Path:
    from transformers import (
        AutoTokenizer,
        MegatronBertConfig,
        MegatronBertForSequenceClassification,
    )

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    config = MegatronBertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=128,
    )
    directory = tmp_path_factory.mktemp("megatron")
    MegatronBertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def attribute_records(run_cli, model: Path, output: Path, *args: str) -> tuple[int, list, str]:
    code, _, err = run_cli(
        "attribute", "--model", model, "--limit", "4", "--quiet", "--output", output, *args
    )
    records = [json.loads(line) for line in output.read_text().splitlines()] if code != 2 else []
    return code, records, err


def test_a_family_from_a_plugin_file_runs_like_the_family_it_copies(
    tiny_roberta, data2vec, run_cli, tmp_path
):
    """globenc reads the spec's modules, integrated gradients its RoBERTa-style positions.

    Without the spec, globenc fails alone with one line and integrated gradients still runs.
    """
    methods = ("--attributors", "globenc,integrated-gradients:steps=4")
    code, written, err = attribute_records(run_cli, data2vec, tmp_path / "x.jsonl", *methods)
    assert code == 3, err
    assert " ".join(err.split()).startswith(
        "warning: globenc failed and is dropped: globenc cannot run on model type "
        "'data2vec-text': it reads model internals, and no architecture adapter serves"
    )
    assert {r["method"] for r in written} == {"integrated-gradients:steps=4", "globenc"}
    plugin = write_module(tmp_path / "data2vec_family.py", DATA2VEC_FAMILY)
    code, copied, err = attribute_records(
        run_cli, data2vec, tmp_path / "copy.jsonl", *methods, "--plugin", plugin
    )
    assert code == 0, err
    code, original, err = attribute_records(
        run_cli, tiny_roberta, tmp_path / "orig.jsonl", *methods
    )
    assert code == 0, err
    assert len(copied) == len(original) == 8
    for mine, theirs in zip(copied, original, strict=True):
        assert (mine["id"], mine["method"], mine["tokens"]) == (
            theirs["id"],
            theirs["method"],
            theirs["tokens"],
        )
        np.testing.assert_allclose(mine["aggregated"], theirs["aggregated"], rtol=1e-5, atol=1e-7)


def test_max_length_takes_the_padding_offset_from_the_spec(data2vec):
    spec = ArchitectureSpec(model_types=("data2vec-text",), positions="after_padding")
    loaded = load_model(str(data2vec), "cpu", architectures={"data2vec-text": spec})
    config = loaded.model.config
    # 130 position embeddings, of which RoBERTa's numbering skips pad + 1 = 1.
    assert (config.max_position_embeddings, config.pad_token_id) == (130, 0)
    assert loaded.max_length == 129


def test_a_pre_ln_family_from_a_plugin_file_runs_the_norm_family(megatron, run_cli, tmp_path):
    """Megatron-BERT's spec names its pre-LN norms and final norm: GlobEnc decomposes it as it
    does GPT-2 (docs/math/attention-family-pre-ln.md), beside the other methods."""
    plugin = write_module(tmp_path / "megatron_family.py", MEGATRON_FAMILY)
    code, records, err = attribute_records(
        run_cli,
        megatron,
        tmp_path / "out.jsonl",
        "--attributors",
        "globenc,effective-attention,saliency",
        "--plugin",
        plugin,
    )
    assert code == 0, err
    ran = [r["method"] for r in records]
    assert ran.count("globenc") == ran.count("effective-attention") == ran.count("saliency") == 4


def test_the_line_names_every_capability_that_differs():
    llama_like = ArchitectureSpec(model_types=("llama",), block="pre-ln", norm="rmsnorm")
    model = SimpleNamespace(config=SimpleNamespace(model_type="llama", num_attention_heads=2))
    picky = SimpleNamespace(
        name="picky",
        description="needs a post-LN LayerNorm family",
        requires=frozenset({"attentions"}),
        needs={"block": "post-ln", "norm": "layernorm"},
        attribute=lambda trace: None,
    )
    assert unmet_needs(picky, EncoderAdapter(model, llama_like)) == (
        "picky cannot run on model type 'llama': it needs post-LN blocks, LayerNorm; "
        "the adapter offers pre-LN blocks, RMSNorm"
    )
    bert_like = ArchitectureSpec(model_types=("bert",))
    assert unmet_needs(picky, EncoderAdapter(model, bert_like)) is None


def test_two_plugins_serving_one_model_type_name_both(run_cli, tmp_path):
    plugin = write_module(tmp_path / "another_bert.py", ANOTHER_BERT)
    code, out, err = run_cli("list", "--plugin", plugin)
    assert_one_line_error(
        code,
        out,
        err,
        "model type 'bert'",
        "(architectures = attrib_bench_plugins.architectures)",
        f"file {plugin}",
    )


@pytest.mark.parametrize(
    ("returned", "needles"),
    [
        ('ArchitectureSpec(model_types=("x",), block="sandwich")', ["block='sandwich'", "pre-ln"]),
        ('ArchitectureSpec(model_types="x")', ["model_types must be a non-empty tuple"]),
        (
            'ArchitectureSpec(model_types=("x",), shared_layer="yes")',
            ["shared_layer must be True or False, got 'yes'"],
        ),
        ('"bert"', ["'bert'", "not an", "ArchitectureSpec"]),
    ],
)
def test_bad_architectures_are_usage_errors(returned, needles, tmp_path):
    source = f"""
        import attrib_bench
        from attrib_bench.core.architecture_spec import ArchitectureSpec


        @attrib_bench.hookimpl
        def attrib_bench_architectures():
            return [{returned}]
    """
    plugin = write_module(tmp_path / "bad_family.py", source)
    with pytest.raises(UsageError) as raised:
        load_registry([plugin])
    for needle in [f"file {plugin}", *needles]:
        assert needle in str(raised.value)


@pytest.mark.parametrize("groups", [{"num_hidden_groups": 2}, {"inner_group_num": 2}])
def test_an_albert_with_several_shared_layers_is_refused(groups):
    """ALBERT's spec hooks one shared layer: with two (in two groups, or two in the group) the
    captures would not be one per layer."""
    from transformers import AlbertConfig, AlbertForSequenceClassification

    config = AlbertConfig(
        vocab_size=50,
        embedding_size=8,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        **groups,
    )
    adapter = EncoderAdapter(
        AlbertForSequenceClassification(config), load_registry().architecture_specs()["albert"]
    )
    with pytest.raises(UsageError, match="this model has 2 AlbertLayer modules"):
        _ = adapter.layers


def test_list_shows_each_family_and_the_attributors_it_can_run(run_cli, tmp_path, monkeypatch):
    """``list --json`` and the table: per family its model types, capabilities, plugin, and the
    attributors whose needs it offers, by the runner's own check."""
    plugin = write_module(tmp_path / "megatron_family.py", MEGATRON_FAMILY)
    code, out, err = run_cli("list", "--json", "--plugin", plugin)
    assert code == 0, err
    families = {tuple(f["model_types"]): f for f in json.loads(out)["architectures"]}
    builtin = f"attrib-bench {attrib_bench.__version__} (architectures = "
    for model_types in [
        ("albert",),
        ("bert", "electra"),
        ("distilbert",),
        ("roberta", "xlm-roberta", "camembert"),
    ]:
        assert families[model_types]["plugin"].startswith(builtin), model_types
    registry = load_registry([plugin])
    assert families[("distilbert",)]["attributors"] == sorted(registry.attributors)
    megatron = families[("megatron-bert",)]
    assert megatron["plugin"] == f"file {plugin}"
    assert megatron["capabilities"] == {
        "block": "pre-ln",
        "norm": "layernorm",
        "qkv": "separate",
        "heads": "multi-head",
        "mask": "bidirectional",
        "positions": "absolute",
    }
    model = SimpleNamespace(
        config=SimpleNamespace(model_type="megatron-bert", num_attention_heads=2)
    )
    adapter = EncoderAdapter(model, registry.architecture_specs()["megatron-bert"])
    assert megatron["attributors"] == [
        name
        for name, reg in sorted(registry.attributors.items())
        if not unmet_needs(reg.obj, adapter)
    ]
    assert {"attention", "effective-attention", "globenc"} <= set(megatron["attributors"])
    assert "effective-attention" not in families[("gpt2",)]["attributors"]
    monkeypatch.setenv("COLUMNS", "250")
    code, out, err = run_cli("list", "--plugin", plugin)
    assert code == 0, err
    assert "architectures" in out
    lines = out.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("│ megatron-bert ")]
    assert re.search(r"│ block=pre-ln,.*│ alti, atman, attcat, attention,.*│ file", lines[start])
    cells = []  # the row's lines: long cells fold onto more lines, never cut
    for line in lines[start:]:
        columns = [cell.strip() for cell in line.split("│")[1:-1]]
        if not columns or (cells and columns[0]):
            break
        cells.append(columns)
    assert "".join(row[-1] for row in cells) == f"file{plugin}"


def test_unknown_needs_are_usage_errors(tmp_path):
    source = """
        import attrib_bench
        from attrib_bench_plugins.baselines import RandomAttributor


        class Picky(RandomAttributor):
            name = "picky"
            needs = {"block": "middle-ln"}


        @attrib_bench.hookimpl
        def attrib_bench_attributors():
            return [Picky()]
    """
    plugin = write_module(tmp_path / "picky.py", source)
    expected = r"'picky' from file .*: bad `needs`: block='middle-ln' is not one of post-ln"
    with pytest.raises(UsageError, match=expected):
        load_registry([plugin])


def test_layer_params_follow_dtype_and_in_place_changes(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    adapter = loaded.adapter
    assert adapter.layer_params(0).value_weight_HDE.dtype == torch.float32
    loaded.model.double()
    params = adapter.layer_params(0)
    assert params.value_weight_HDE.dtype == params.ln2.weight_D.dtype == torch.float64
    value = adapter.module(0, "value")
    with torch.no_grad():
        value.weight.normal_()
        adapter.module(0, "attention_output").weight.zero_()
    params = adapter.layer_params(0)
    head_dim = params.head_dim
    assert params.num_heads > 1
    torch.testing.assert_close(
        params.value_weight_HDE[1], value.weight.T[:, head_dim : 2 * head_dim]
    )
    assert (params.output_weight_HED == 0).all()


def test_a_copy_with_another_model_gets_that_models_modules(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.adapter.layer_params(0)
    other = copy.deepcopy(loaded.model)
    replaced = dataclasses.replace(loaded, model=other)
    assert replaced.adapter.layers[0] is other.bert.encoder.layer[0]
    assert replaced.adapter.embeddings is other.bert.embeddings


def test_sanity_randomises_a_copy_after_the_adapter_was_used(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trained = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)
    attribution = Saliency().attribute(trace)  # reads trace.adapter.embeddings
    sanity = ModelRandomization().configure({"steps": "2"})
    scores = sanity.score(attribution, EvalContext(trace, None, 0, Saliency()))["aggregated"]
    assert (scores < 0.99).any()
    for name, value in loaded.model.state_dict().items():
        assert torch.equal(value, trained[name]), name
