"""The attention x gradient methods (``gae``, ``grad-sam``, ``attention-x-gradient``): equal to
float64 references written from their definitions, with each example run alone through Hugging
Face's modules, on an encoder and two decoders; one backward pass shared by every method that
explains the same score; and the conformance kit."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, examples, load_float64, one_batch

from attrib_bench.core.attention_kernels import EAGER, attention_implementation
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing import check_attributor
from attrib_bench.toolkit import graph_gradients as graph_gradients_module
from attrib_bench_plugins.attention_gradient import (
    AttCAT,
    AttentionXGradient,
    GenericAttentionExplainability,
    GradSAM,
)

REQUIRES = frozenset({"attentions", "hidden_states", "embedding_graph"})
METHODS = (GenericAttentionExplainability(), GradSAM(), AttentionXGradient(), AttCAT())


@pytest.fixture(scope="module", params=["bert", "llama", "gpt2"])
def loaded64(request, tiny_bert, tmp_path_factory):
    return load_float64(request.param, tiny_bert, tmp_path_factory)


def attentions_and_gradients(loaded, ids_N: torch.Tensor, position: int, label: int):
    """One unpadded example's attention probabilities and the gradient of the explained logit
    at them, layer by layer, (H, n, n) each, and each layer's input hidden states and the
    gradient at them, (n, D) each, from the model called directly."""
    lookup = loaded.model.get_input_embeddings()  # frozen weights: start the graph there
    handle = lookup.register_forward_hook(lambda _m, _i, output: output.requires_grad_())
    try:
        with attention_implementation(loaded.model, EAGER):
            out = loaded.model(
                input_ids=ids_N[None], output_attentions=True, output_hidden_states=True
            )
    finally:
        handle.remove()
    logits = out.logits[0] if loaded.is_language_model else out.logits
    logit = logits[position, label] if loaded.is_language_model else logits[0, label]
    layers = len(out.attentions)
    inputs = (*out.attentions, *out.hidden_states[:layers])
    gradients = torch.autograd.grad(logit, inputs)
    return [
        (a[0].detach(), g[0], h[0].detach(), hg[0])
        for a, g, h, hg in zip(
            out.attentions,
            gradients[:layers],
            out.hidden_states[:layers],
            gradients[layers:],
            strict=True,
        )
    ]


def reference_rows(loaded, trace) -> dict[str, list[torch.Tensor]]:
    """Per method, each example's final row over its real tokens, from the definitions."""
    batch, out = trace.batch, {m.name: [] for m in METHODS}
    for row in range(len(batch.examples)):
        real_N = batch.attention_mask_BN[row].bool()
        ids_N = batch.input_ids_BN[row][real_N]
        position = int(real_N[: int(trace.target_positions_B[row])].sum())
        label = int(trace.logits_BC[row].argmax())
        layers = attentions_and_gradients(loaded, ids_N, position, label)
        n = len(ids_N)
        relevance = torch.eye(n, dtype=torch.float64)
        sam = torch.zeros(n, dtype=torch.float64)
        cat = torch.zeros(n, dtype=torch.float64)
        for attention, gradient, hidden, hidden_gradient in layers:
            heads = attention.shape[0]
            cam = sum((gradient[h] * attention[h]).clamp(min=0) for h in range(heads)) / heads
            relevance = relevance + cam @ relevance
            for h in range(heads):
                sam += (attention[h] * gradient[h].clamp(min=0)).sum(dim=0)
            received = attention.mean(dim=0).mean(dim=0)  # official: heads, then query rows
            cat += (hidden_gradient * hidden).sum(dim=-1) * received
        sam /= len(layers) * layers[0][0].shape[0] * n
        attention, gradient = layers[-1][:2]
        last = (attention * gradient).mean(dim=0)[position]
        out["gae"].append(relevance[position])
        out["grad-sam"].append(sam)
        out["attention-x-gradient"].append(last)
        out["attcat"].append(cat)
    return out


def test_each_method_equals_its_definition(loaded64):
    trace = trace_batch(loaded64, one_batch(loaded64, examples()), REQUIRES)
    expected = reference_rows(loaded64, trace)
    # LlamaRMSNorm normalises in float32 even in a float64 model, so a float64 rounding
    # difference between the padded batch and the example alone can reach float32's.
    rtol = 1e-6 if loaded64.model.config.model_type == "llama" else 1e-9
    for method in METHODS:
        rows_BN = method.attribute(trace).aggregated_BLN[:, -1]
        for row, reference in enumerate(expected[method.name]):
            real_N = trace.batch.attention_mask_BN[row].bool()
            got = rows_BN[row][real_N]
            torch.testing.assert_close(got, reference, rtol=rtol, atol=rtol * reference.abs().max())
            assert reference.abs().max() > 0  # the reference is not vacuous


@pytest.fixture
def counted_backward(tiny_bert, monkeypatch):
    """A traced batch of the tiny BERT and the list that grows by one per backward pass
    ``graph_gradients`` runs."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), REQUIRES)
    calls: list[int] = []
    grad = torch.autograd.grad

    def counted(*args, **kwargs):
        calls.append(1)
        return grad(*args, **kwargs)

    monkeypatch.setattr(graph_gradients_module.torch.autograd, "grad", counted)
    return trace, calls


def test_the_methods_share_one_backward_pass_per_explained_score(counted_backward):
    trace, calls = counted_backward
    for method in METHODS:
        method.attribute(trace)
    assert len(calls) == 1
    GradSAM().configure({"target": "gold"}).attribute(trace)  # another score: its own pass
    assert len(calls) == 2


def test_the_aggregated_rows_are_what_each_method_says(tiny_bert):
    """gae: its local rows are the head-mean weights, its aggregate their rollout from I;
    grad-sam: the running mean of the local rows; attention-x-gradient: the local rows."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), REQUIRES)
    sam = GradSAM().attribute(trace)
    means = sam.local_BLN.cumsum(dim=1) / torch.arange(1, sam.local_BLN.shape[1] + 1)[:, None]
    torch.testing.assert_close(sam.aggregated_BLN, means)
    axg = AttentionXGradient().attribute(trace)
    assert torch.equal(axg.aggregated_BLN, axg.local_BLN)
    gae = GenericAttentionExplainability().attribute(trace)
    assert torch.all(gae.aggregated_BLN[:, 0] >= gae.local_BLN[:, 0])  # I + Ā^1, Ā^1 >= 0


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_the_kit_accepts_each_method(method):
    check_attributor(method, families=("bert",))


def test_saliency_and_gradient_share_the_same_backward_pass(counted_backward):
    """The embedding-layer gradient methods read the same memoised gradients: with the four
    attention x gradient methods, one call in all, at either layer."""
    from attrib_bench_plugins.gradient import Gradient, Saliency

    trace, calls = counted_backward
    for method in (*METHODS, Saliency(), Gradient().configure({"layer": "word_embeddings"})):
        method.attribute(trace)
    assert len(calls) == 1


def test_saliency_alone_holds_no_attention_gradients(counted_backward):
    """A trace that keeps attentions for the attention family: saliency differentiates at the
    embedding layers only; a later attention x gradient method runs its own pass."""
    from attrib_bench_plugins.gradient import Saliency

    trace, calls = counted_backward
    Saliency().attribute(trace)
    held = [v for k, v in trace.shared.items() if k.startswith("graph-gradients/")]
    assert len(held) == 1 and held[0].attentions == () and held[0].hidden_states == ()
    GenericAttentionExplainability().attribute(trace)
    assert len(calls) == 2
