"""The LRP family (``cp-lrp``, ``attnlrp``): CP-LRP conserves the explained logit exactly on
bias-free encoders and decoders; both equal a float64 reference that re-runs BERT by hand with
each rule written out; the rules change no forward value and leave the model as it was."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch, save_tiny_decoder

from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing import check_attributor
from attrib_bench.toolkit.lrp_rules import IDENTITY_EPSILON, rules
from attrib_bench_plugins.gradient import CPLRP, AttnLRP


def _load64(directory):
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


@pytest.fixture(scope="module")
def bert64(tiny_bert):
    return _load64(tiny_bert)


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2"])
def test_cp_lrp_conserves_the_logit_on_a_bias_free_model(family, tiny_bert, tmp_path):
    """With every bias and the position and segment embeddings zero, nothing absorbs relevance:
    the relevances at the embedding output sum to the explained logit."""
    directory = tiny_bert if family == "bert" else save_tiny_decoder(tmp_path, family)
    loaded = _load64(directory)
    with torch.no_grad():
        for name, parameter in loaded.model.named_parameters():
            absorbs = ("bias", "position_embeddings", "token_type", "wpe")
            if any(part in name for part in absorbs):
                parameter.zero_()
    both = CPLRP.requires | AttnLRP.requires  # cp's pass is the traced one, attn's its own
    trace = trace_batch(loaded, one_batch(loaded, examples()), both)
    logits_B = trace.logits_BC.gather(1, trace.target_classes_B[:, None])[:, 0].double()
    cp = CPLRP().configure({"layer": "embeddings"}).attribute(trace).aggregated_BLN[:, 0]
    # LLaMA's RMSNorm normalises in float32 even in a float64 model.
    rtol = 1e-6 if family == "llama" else 1e-9
    torch.testing.assert_close(cp.double().sum(dim=-1), logits_B, rtol=rtol, atol=1e-12)
    attn = AttnLRP().configure({"layer": "embeddings"}).attribute(trace).aggregated_BLN[:, 0]
    assert not torch.allclose(attn, cp)  # the softmax's relevance is not held constant there


def _constant_scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """x forward; its gradient times ``factor`` backward."""
    return x.detach() + (x - x.detach()) * factor


def _identity_rule(fn, x: torch.Tensor) -> torch.Tensor:
    """fn(x) forward; the gradient times fn(x) / (x + eps) backward."""
    ratio = (fn(x) / (x + IDENTITY_EPSILON)).detach()
    return fn(x).detach() + (x - x.detach()) * ratio


def _norm(x: torch.Tensor, module) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    std = ((x - mean) ** 2).mean(dim=-1, keepdim=True).add(module.eps).sqrt()
    return (x - mean) / std.detach() * module.weight + module.bias


def reference_bert(model, ids_N: torch.Tensor, label: int, variant: str) -> torch.Tensor:
    """BERT re-run by hand on one unpadded example with the variant's rules written out; the
    relevance at the word embeddings, summed per token."""
    bert, n = model.bert, len(ids_N)
    words = bert.embeddings.word_embeddings(ids_N).detach().requires_grad_()
    x = words + bert.embeddings.position_embeddings(torch.arange(n))
    x = _norm(
        x + bert.embeddings.token_type_embeddings(torch.zeros_like(ids_N)),
        bert.embeddings.LayerNorm,
    )
    for layer in bert.encoder.layer:
        attention = layer.attention.self
        heads, size = attention.num_attention_heads, attention.attention_head_size

        def split(t: torch.Tensor, heads: int = heads, size: int = size) -> torch.Tensor:
            return t.view(n, heads, size).transpose(0, 1)

        q, k, v = split(attention.query(x)), split(attention.key(x)), split(attention.value(x))
        if variant == "cp":
            q, k = q.detach(), k.detach()
        else:
            q, k, v = _constant_scale(q, 0.25), _constant_scale(k, 0.25), _constant_scale(v, 0.5)
        probabilities = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(size), dim=-1)
        context = (probabilities @ v).transpose(0, 1).reshape(n, heads * size)
        x = _norm(layer.attention.output.dense(context) + x, layer.attention.output.LayerNorm)
        hidden = _identity_rule(torch.nn.functional.gelu, layer.intermediate.dense(x))
        x = _norm(layer.output.dense(hidden) + x, layer.output.LayerNorm)
    pooled = _identity_rule(torch.tanh, bert.pooler.dense(x[0]))
    (gradient,) = torch.autograd.grad(model.classifier(pooled)[label], words)
    return (gradient * words).sum(dim=-1).detach()


@pytest.mark.parametrize("method", [CPLRP(), AttnLRP()], ids=lambda m: m.name)
def test_each_variant_equals_bert_rerun_by_hand(bert64, method):
    trace = trace_batch(bert64, one_batch(bert64, examples()), method.requires)
    rows_BN = method.attribute(trace).aggregated_BLN[:, 0]
    for row in range(len(trace.batch.examples)):
        real_N = trace.batch.attention_mask_BN[row].bool()
        label = int(trace.target_classes_B[row])
        expected = reference_bert(
            bert64.model, trace.batch.input_ids_BN[row][real_N], label, method.variant
        )
        got = rows_BN[row][real_N].double()
        torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-10 * expected.abs().max())


def test_the_rules_change_no_forward_value_and_are_undone(bert64):
    batch = one_batch(bert64, examples())
    model = bert64.model
    implementation = model.config._attn_implementation
    with torch.no_grad():
        plain = model(**batch.model_inputs()).logits
        for variant in ("cp", "attn"):
            with rules(model, variant):
                ruled = model(**batch.model_inputs()).logits
            torch.testing.assert_close(ruled, plain, rtol=1e-12, atol=1e-12)
    assert model.config._attn_implementation == implementation
    assert not any("forward" in vars(module) for module in model.modules())


@pytest.mark.parametrize("method", [CPLRP(), AttnLRP()], ids=lambda m: m.name)
def test_the_kit_accepts_each_variant(method):
    check_attributor(method, families=("bert", "roberta"))


def test_a_model_the_rules_cannot_reach_is_one_line(bert64, monkeypatch):
    """A family whose attention bypasses transformers' attention interface would get plain
    gradient x input through its attention: refused, naming the method and the model type."""
    from attrib_bench import UsageError

    monkeypatch.setattr(type(bert64.model), "set_attn_implementation", lambda self, name: None)
    trace = trace_batch(bert64, one_batch(bert64, examples()), CPLRP.requires)
    with pytest.raises(UsageError, match=r"^cp-lrp: bert does not run its attention through"):
        CPLRP().attribute(trace)


def _forward_calls(model, run) -> int:
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        run()
    finally:
        handle.remove()
    return len(calls)


@pytest.mark.parametrize("method", [CPLRP(), AttnLRP()], ids=lambda m: m.name)
def test_alone_the_rules_pass_is_the_traced_pass(bert64, method):
    """Run alone, an LRP method costs the traced forward pass and one backward pass: the pass
    under the rules is the trace's. Beside a method that needs the plain graph it gets a pass
    of its own, with the same relevances."""
    batch = one_batch(bert64, examples())
    traces = {}

    def alone() -> None:
        traces["alone"] = trace_batch(bert64, batch, method.requires)
        traces["rows"] = method.attribute(traces["alone"]).aggregated_BLN

    assert _forward_calls(bert64.model, alone) == 1
    both = method.requires | {"embedding_graph"}
    beside = lambda: traces.setdefault("beside", trace_batch(bert64, batch, both))  # noqa: E731
    assert _forward_calls(bert64.model, beside) == 2
    rows = method.attribute(traces["beside"]).aggregated_BLN
    torch.testing.assert_close(rows, traces["rows"], rtol=1e-12, atol=1e-14)


def test_a_pass_the_rules_break_fails_the_lrp_method_only(bert64, monkeypatch):
    """A forward pass that raises under the rules takes the LRP method down with one line; the
    trace, and every other method of the batch, still gets its plain pass."""
    from attrib_bench import UsageError
    from attrib_bench.toolkit import lrp_rules

    def broken(*_args, **_kwargs):
        raise RuntimeError("kernel not available")

    monkeypatch.setattr(lrp_rules, "_layer_norm", broken)
    batch = one_batch(bert64, examples())
    trace = trace_batch(bert64, batch, CPLRP.requires | {"attentions"})
    assert len(trace.attentions) == bert64.model.config.num_hidden_layers
    with pytest.raises(UsageError, match=r"^cp-lrp: the forward pass under the rules failed"):
        CPLRP().attribute(trace)
    alone = trace_batch(bert64, batch, CPLRP.requires)  # the shared pass falls back to plain
    torch.testing.assert_close(alone.logits_BC, trace.logits_BC, rtol=1e-12, atol=1e-12)
    with pytest.raises(UsageError, match=r"^cp-lrp: the forward pass under the rules failed"):
        CPLRP().attribute(alone)
