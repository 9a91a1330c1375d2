"""Trace fields from plugins: registered with a hook, captured for one pass, read with need()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch
from test_plugins import assert_one_line_error, write_module

import attrib_bench
from attrib_bench import TraceField, UsageError
from attrib_bench.core.registry import BUILTIN_SOURCE, load_registry
from attrib_bench.core.trace_fields import TRACE_FIELDS
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch

ROOT = Path(__file__).resolve().parents[1]
FIELD_PLUGIN = ROOT / "tests" / "plugin_fixtures" / "trace_field_plugin.py"
START, END = "# --8<-- [start:example]\n", "# --8<-- [end:example]"

#: The same field name as the fixture's: a second plugin registering it.
SECOND_FFN = """
    import attrib_bench


    @attrib_bench.hookimpl
    def attrib_bench_trace_fields():
        return [attrib_bench.TraceField("ffn_activations", "again", modules="output.dense")]
"""

#: A plugin reusing a built-in field's name.
BUILTIN_NAME = """
    import attrib_bench


    @attrib_bench.hookimpl
    def attrib_bench_trace_fields():
        return [attrib_bench.TraceField("values", "mine", modules="attention.self.value")]
"""

#: An attributor that misspells the fixture's field.
MISSPELLED = """
    import attrib_bench
    from attrib_bench_plugins.baselines import RandomAttributor


    class Misspelled(RandomAttributor):
        name = "misspelled"
        requires = frozenset({"ffn_activation"})


    @attrib_bench.hookimpl
    def attrib_bench_attributors():
        return [Misspelled()]
"""


@pytest.fixture(scope="module")
def loaded_bert(tiny_bert):
    return load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)


def hook_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def manual(model: torch.nn.Module, modules, keep: str, inputs: dict) -> list[torch.Tensor]:
    """What the modules produce (or take) in a plain forward pass, by hand-made hooks."""
    kept: list[torch.Tensor] = []
    if keep == "output":
        handles = [m.register_forward_hook(lambda _m, _i, out: kept.append(out)) for m in modules]
    else:
        handles = [m.register_forward_pre_hook(lambda _m, a: kept.append(a[0])) for m in modules]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return kept


def test_docs_trace_field_example_is_the_tested_file():
    source = FIELD_PLUGIN.read_text()
    assert source.startswith(START) and source.rstrip().endswith(END)
    page = (ROOT / "docs" / "plugins.md").read_text()
    section = page[page.index("## Trace fields") :]
    include = '--8<-- "tests/plugin_fixtures/trace_field_plugin.py:example"'
    assert f"```python\n{include}\n```" in section  # pymdownx.snippets includes the file


def test_the_example_field_runs_through_the_cli(tiny_bert, run_cli, tmp_path):
    """ffn-norm's rows are the norms of each layer's `intermediate` output, hooked by hand here
    on each example alone (no padding)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from attrib_bench.data.load import load_examples

    code, out, err = run_cli("list", "--json", "--plugin", FIELD_PLUGIN)
    assert code == 0, err
    assert "ffn-norm" in {a["name"] for a in json.loads(out)["attributors"]}

    output = tmp_path / "ffn.jsonl"
    code, _, err = run_cli(
        "attribute",
        *("--model", tiny_bert, "--limit", "4", "--batch-size", "4", "--quiet"),
        *("--plugin", FIELD_PLUGIN, "--attributors", "ffn-norm", "--output", output),
    )
    assert code == 0, err
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_bert, attn_implementation="eager"
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    texts = {e.id: e.text for e in load_examples("default", limit=4).examples}
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(texts)
    intermediates = [layer.intermediate for layer in model.bert.encoder.layer]
    for record in records:
        encoded = dict(tokenizer(texts[record["id"]], return_tensors="pt"))
        expected = [
            a[0].norm(dim=-1).tolist() for a in manual(model, intermediates, "output", encoded)
        ]
        assert record["method"] == "ffn-norm" and len(record["aggregated"]) == 3
        for row, wanted in zip(record["aggregated"], expected, strict=True):
            assert row == pytest.approx(wanted, rel=1e-5, abs=1e-5)


def test_plugin_fields_are_what_a_manual_hook_sees(loaded_bert):
    """A path inside each layer and a function of the adapter; outputs and inputs; exactly."""
    head = TraceField(
        "classifier_input",
        "(B, D): what the classification head takes",
        modules=lambda adapter: [adapter.model.classifier] * 2,  # one hook per distinct module
        keep="input",
        collect=lambda kept: kept[0] if len(kept) == 1 else kept,
    )
    attention = TraceField("self_attention", "", modules="attention.self")  # returns a tuple
    fields = {**load_registry([FIELD_PLUGIN]).trace_field_specs(), head.name: head}
    fields[attention.name] = attention
    batch = one_batch(loaded_bert, examples())
    trace = trace_batch(loaded_bert, batch, set(fields) - TRACE_FIELDS, fields=fields)
    model, inputs = loaded_bert.model, batch.model_inputs()
    intermediates = [layer.intermediate for layer in model.bert.encoder.layer]
    expected = manual(model, intermediates, "output", inputs)
    assert len(trace.need("ffn_activations")) == 3
    for mine, theirs in zip(trace.need("ffn_activations"), expected, strict=True):
        assert torch.equal(mine, theirs)
    (pooled,) = manual(model, [model.classifier], "input", inputs)
    assert torch.equal(trace.need("classifier_input"), pooled)
    selves = [layer.attention.self for layer in model.bert.encoder.layer]
    by_hand = manual(model, selves, "output", inputs)
    for mine, theirs in zip(trace.need("self_attention"), by_hand, strict=True):
        assert isinstance(mine, tuple) and torch.equal(mine[0], theirs[0])
    # Every plugin field asked for, the built-in plugins' (decompx's) among them.
    assert set(trace.plugin_fields) == set(fields) - TRACE_FIELDS
    assert {"ffn_activations", "classifier_input", "self_attention"} <= set(trace.plugin_fields)
    assert trace.values == () and trace.hidden_states == ()  # built-ins only when required
    # What an evaluator that traces again (a randomised copy) passes on.
    again = trace_batch(loaded_bert, batch, {"ffn_activations"}, fields=trace.field_specs)
    assert torch.equal(again.need("ffn_activations")[0], expected[0])


def test_a_kept_call_reruns_the_layer(loaded_bert):
    """What value zeroing needs: a layer's arguments, to run it again on changed inputs."""
    calls = TraceField("layer_calls", "", modules=lambda adapter: adapter.layers, keep="call")
    batch = one_batch(loaded_bert, examples())
    trace = trace_batch(
        loaded_bert, batch, {"layer_calls", "hidden_states"}, fields={"layer_calls": calls}
    )
    args, kwargs = trace.need("layer_calls")[1]
    assert torch.equal(args[0], trace.hidden_states[1])
    with torch.no_grad():
        out = loaded_bert.adapter.layers[1](*args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(out, trace.hidden_states[2], rtol=0, atol=0)


class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.linear(x), [self.linear(x) * 2]


def test_what_a_hook_keeps_is_detached_and_a_keyword_input_counts():
    from attrib_bench.model.trace import _keep

    pair, x = Pair(), torch.ones(1, 2, requires_grad=True)
    kept: dict[str, list] = {"output": [], "input": [], "call": []}
    handles = [_keep(pair, keep, into) for keep, into in kept.items()]
    pair(x=x)  # no positional argument: "input" is the first keyword's
    for handle in handles:
        handle.remove()
    (output,), (first,), ((args, kwargs),) = kept["output"], kept["input"], kept["call"]
    assert isinstance(output, tuple) and isinstance(output[1], list)
    assert not output[0].requires_grad and not output[1][0].requires_grad
    assert torch.equal(first, x) and not first.requires_grad
    assert args == () and torch.equal(kwargs["x"], x) and not kwargs["x"].requires_grad


def test_an_uncaptured_plugin_field_is_a_clear_error(loaded_bert):
    fields = load_registry([FIELD_PLUGIN]).trace_field_specs()
    trace = trace_batch(loaded_bert, one_batch(loaded_bert, examples()), set(), fields=fields)
    with pytest.raises(RuntimeError, match=r"'ffn_activations' was not captured.*requires"):
        trace.need("ffn_activations")


def test_need_pre_layernorm_is_the_pair_of_norm_inputs(loaded_bert):
    batch = one_batch(loaded_bert, examples())
    trace = trace_batch(loaded_bert, batch, {"pre_layernorm"})
    pre_ln1, pre_ln2 = trace.need("pre_layernorm")
    assert pre_ln1 == trace.pre_ln1 and pre_ln2 == trace.pre_ln2 and len(pre_ln1) == 3
    with pytest.raises(RuntimeError, match="'pre_layernorm' was not captured"):
        trace_batch(loaded_bert, batch, set()).need("pre_layernorm")


def test_hooks_are_removed_after_a_trace_also_when_it_raises(loaded_bert):
    model = loaded_bert.model
    fields = load_registry([FIELD_PLUGIN]).trace_field_specs()
    batch = one_batch(loaded_bert, examples())
    every = {*TRACE_FIELDS, "ffn_activations"}
    trace_batch(loaded_bert, batch, every, fields=fields)  # transformers may add its own hooks
    before = hook_count(model)
    trace_batch(loaded_bert, batch, every, fields=fields)
    assert hook_count(model) == before

    def fail(*_):
        raise ValueError("forward pass failed")

    breaker = model.bert.encoder.layer[1].register_forward_pre_hook(fail)
    try:
        with pytest.raises(ValueError, match="forward pass failed"):
            trace_batch(loaded_bert, batch, every, fields=fields)
    finally:
        breaker.remove()
    assert hook_count(model) == before
    # A field whose path is missing in a later layer: the hooks already added go too.
    odd = TraceField("odd", "", modules="intermediate")
    last = model.bert.encoder.layer[2]
    intermediate = last.intermediate
    del last.intermediate
    try:
        with pytest.raises(UsageError, match="'odd': encoder layer 2 has no module 'intermediate'"):
            trace_batch(loaded_bert, batch, {"values", "odd"}, fields={"odd": odd})
    finally:
        last.intermediate = intermediate
    assert hook_count(model) == before


def test_registry_holds_the_builtins_then_the_plugin_fields():
    registry = load_registry([FIELD_PLUGIN])
    assert {n for n, r in registry.trace_fields.items() if r.source == BUILTIN_SOURCE} == {
        "attentions",
        "hidden_states",
        "values",
        "pre_layernorm",
        "embedding_graph",
        "cp_lrp_graph",
        "attn_lrp_graph",
    }
    assert registry.trace_fields["ffn_activations"].source == f"file {FIELD_PLUGIN}"
    assert registry.attributor("ffn-norm").requires == {"ffn_activations"}
    assert attrib_bench.TraceField is TraceField


def test_an_unknown_field_is_still_a_one_line_error(tiny_bert, loaded_bert, run_cli, tmp_path):
    plugin = write_module(tmp_path / "misspelled.py", MISSPELLED)
    code, out, err = run_cli(
        "attribute",
        *("--model", tiny_bert, "--limit", "2", "--quiet", "--output", tmp_path / "o.jsonl"),
        *("--plugin", FIELD_PLUGIN, "--plugin", plugin, "--attributors", "misspelled"),
    )
    assert_one_line_error(
        code, out, err, "'misspelled'", "['ffn_activation']", "attentions", "ffn_activations,"
    )
    with pytest.raises(UsageError, match=r"unknown trace fields \['ffn_activations'\]"):
        trace_batch(loaded_bert, None, {"ffn_activations"})  # not registered here
    fields = load_registry([FIELD_PLUGIN]).trace_field_specs()
    with pytest.raises(UsageError, match=r"\['ffn_activation'\]; valid: .*, ffn_activations,"):
        trace_batch(loaded_bert, None, {"ffn_activation"}, fields=fields)


def test_two_plugins_registering_one_field_name_both(run_cli, tmp_path):
    plugin = write_module(tmp_path / "second_ffn.py", SECOND_FFN)
    code, out, err = run_cli("list", "--plugin", FIELD_PLUGIN, "--plugin", plugin)
    assert_one_line_error(
        code, out, err, "trace field 'ffn_activations'", f"file {FIELD_PLUGIN}", f"file {plugin}"
    )


def test_a_plugin_field_cannot_take_a_builtin_name(run_cli, tmp_path):
    plugin = write_module(tmp_path / "builtin_name.py", BUILTIN_NAME)
    code, out, err = run_cli("list", "--plugin", plugin)
    assert_one_line_error(code, out, err, f"file {plugin}", "'values'", "built in")


@pytest.mark.parametrize(
    ("returned", "needles"),
    [
        ('TraceField("x", "", modules="intermediate", keep="middle")', ["keep='middle'"]),
        ('TraceField("x", "")', ["modules must be a dotted path"]),
        ('TraceField("", "", modules="intermediate")', ["non-empty string"]),
        ('"ffn_activations"', ["'ffn_activations'", "not an attrib_bench.TraceField"]),
    ],
)
def test_bad_trace_fields_are_usage_errors(returned, needles, tmp_path):
    source = f"""
        import attrib_bench
        from attrib_bench import TraceField


        @attrib_bench.hookimpl
        def attrib_bench_trace_fields():
            return [{returned}]
    """
    plugin = write_module(tmp_path / "bad_field.py", source)
    with pytest.raises(UsageError) as raised:
        load_registry([plugin])
    for needle in [f"file {plugin}", *needles]:
        assert needle in str(raised.value)
