"""Gradient methods: our saliency equals a direct Captum computation and plain autograd."""

from __future__ import annotations

import pytest
import torch
from captum.attr import InputXGradient, IntegratedGradients
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.budget import per_pass
from attrib_bench_plugins.gradient import Gradient, Saliency
from attrib_bench_plugins.gradient import IntegratedGradients as OurIG


@pytest.fixture(scope="module")
def setup(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    batch = one_batch(loaded, examples())
    return loaded, trace_batch(loaded, batch, Saliency.requires)


def from_embedding_output(loaded, batch):
    """f(E): the classifier's logits with the embedding module's output replaced by E."""
    embeddings = loaded.model.base_model.embeddings

    def forward(embedding_output):
        # Captum's IG stacks the path steps along the batch: tile the other inputs to match.
        repeats = embedding_output.shape[0] // batch.input_ids_BN.shape[0]
        inputs = {k: v.repeat(repeats, 1) for k, v in batch.model_inputs().items()}
        handle = embeddings.register_forward_hook(lambda *_: embedding_output)
        try:
            return loaded.model(**inputs).logits
        finally:
            handle.remove()

    with torch.no_grad():
        start = embeddings(input_ids=batch.input_ids_BN, token_type_ids=batch.token_type_ids_BN)
    return forward, start


def test_saliency_equals_captum_input_x_gradient(setup):
    loaded, trace = setup
    forward, start = from_embedding_output(loaded, trace.batch)
    target = trace.predicted_B
    direct = InputXGradient(forward).attribute(start, target=target).norm(dim=-1)
    ours = Saliency().attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours[mask], direct[mask], rtol=1e-5, atol=1e-7)
    assert ours[~mask].abs().max() == 0


def test_gradient_equals_autograd(setup):
    loaded, trace = setup
    forward, start = from_embedding_output(loaded, trace.batch)
    start = start.clone().requires_grad_(True)
    logits = forward(start)
    logits.gather(1, trace.predicted_B[:, None]).sum().backward()
    expected = start.grad.norm(dim=-1)
    ours = Gradient().attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours[mask], expected[mask], rtol=1e-5, atol=1e-7)
    # the two methods must differ: gradient is not gradient x input
    assert not torch.allclose(ours, Saliency().attribute(trace).aggregated_BLN[:, 0])


def test_gold_target_and_signed_sum(setup):
    loaded, trace = setup
    forward, start = from_embedding_output(loaded, trace.batch)
    gold = trace.batch.labels
    direct = InputXGradient(forward).attribute(start, target=gold).sum(dim=-1)
    ours = Saliency().configure({"target": "gold", "reduce": "sum"}).attribute(trace)
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours.aggregated_BLN[:, 0][mask], direct[mask], rtol=1e-5, atol=1e-7)


def pad_baseline(loaded, batch) -> torch.Tensor:
    """The [PAD] baseline's token ids: special tokens kept, every other token [PAD]."""
    pad = loaded.tokenizer.pad_token_id
    return torch.where(
        batch.special_tokens_mask_BN.bool(),
        batch.input_ids_BN,
        torch.full_like(batch.input_ids_BN, pad),
    )


def test_integrated_gradients_equals_captum_on_embedding_output(tiny_model):
    loaded = load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    forward, start = from_embedding_output(loaded, trace.batch)
    batch = trace.batch
    with torch.no_grad():  # the baseline's tokens stay at the real input's positions
        baseline = loaded.model.base_model.embeddings(
            input_ids=pad_baseline(loaded, batch),
            token_type_ids=batch.token_type_ids_BN,
            position_ids=loaded.adapter.position_ids(batch.input_ids_BN),
        )
    direct, delta = IntegratedGradients(forward).attribute(
        start,
        baselines=baseline,
        target=trace.predicted_B,
        n_steps=8,
        return_convergence_delta=True,
    )
    ours = OurIG().configure({"steps": "8"}).attribute(trace).aggregated_BLN[:, 0]
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours[mask], direct.norm(dim=-1)[mask], rtol=1e-4, atol=1e-6)
    assert delta.abs().max() < 0.05  # completeness holds approximately at 8 steps


def test_integrated_gradients_baseline_keeps_the_kept_tokens_embeddings(tiny_model):
    """RoBERTa numbers positions over non-pad tokens: the baseline's [PAD]s must not move the
    final special token, so every token the baseline keeps is embedded as in the input."""
    loaded = load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    batch = trace.batch
    baseline_ids = pad_baseline(loaded, batch)
    embedded = {}
    handle = loaded.adapter.embeddings.register_forward_hook(
        lambda _module, _args, kwargs, output: embedded.setdefault(
            tuple(kwargs["input_ids"].flatten().tolist()), output.detach()
        ),
        with_kwargs=True,
    )
    try:
        OurIG().configure({"steps": "2"}).attribute(trace)
    finally:
        handle.remove()
    for row in range(len(batch.input_ids_BN)):  # each example's path over its real tokens
        real_N = batch.attention_mask_BN[row].bool()
        ids, base = batch.input_ids_BN[row, real_N], baseline_ids[row, real_N]
        original, baseline = embedded[tuple(ids.tolist())], embedded[tuple(base.tolist())]
        kept = base == ids  # the special tokens
        assert kept.sum() >= 2
        torch.testing.assert_close(baseline[0, kept], original[0, kept])


# ---- layer= and reduce= options, DeepLift, GradientSHAP -------------------------------------


def float64_setup(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded, trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)


def layer_gradient(loaded, trace, layer):
    """d(predicted logit)/d(layer output) and the layer output, by plain autograd, float64."""
    kept = {}

    def hook(_module, _args, output):
        output.retain_grad()
        kept["out"] = output

    handle = layer.register_forward_hook(hook)
    loaded.model.requires_grad_(True)  # load_model freezes the weights; the reference does not
    try:
        logits = loaded.model(**trace.batch.model_inputs()).logits
        logits.gather(1, trace.predicted_B[:, None]).sum().backward()
    finally:
        handle.remove()
        loaded.model.requires_grad_(False)
    return kept["out"].grad.detach(), kept["out"].detach()


@pytest.mark.parametrize("layer", ["embeddings", "word_embeddings"])
@pytest.mark.parametrize("reduce", ["l2", "sum", "abs-sum"])
def test_layer_and_reduce_options_equal_autograd(tiny_bert, layer, reduce):
    loaded, trace = float64_setup(tiny_bert)
    module = loaded.embeddings if layer == "embeddings" else loaded.model.get_input_embeddings()
    grad, activation = layer_gradient(loaded, trace, module)
    options = {"layer": layer, "reduce": reduce, "target": "predicted"}
    mask = trace.mask_BN.bool()
    for method, per_dim in ((Gradient(), grad), (Saliency(), grad * activation)):
        expected = torch.zeros(per_dim.shape[:2], dtype=torch.float64)
        for b in range(per_dim.shape[0]):  # the reduction from its definition, token by token
            for i in range(per_dim.shape[1]):
                v = per_dim[b, i].tolist()
                if reduce == "l2":
                    expected[b, i] = sum(x * x for x in v) ** 0.5
                elif reduce == "sum":
                    expected[b, i] = sum(v)
                else:
                    expected[b, i] = sum(abs(x) for x in v)
        ours = method.configure(options).attribute(trace).aggregated_BLN[:, 0]
        torch.testing.assert_close(ours[mask], expected[mask], rtol=1e-9, atol=1e-12)


def test_defaults_are_todays_behaviour():
    for method in (Saliency(), Gradient(), OurIG()):
        assert method.params["layer"] == "embeddings" and method.params["reduce"] == "l2"


def test_word_embeddings_layer_equals_captum(tiny_bert):
    from captum.attr import LayerGradientXActivation, LayerIntegratedGradients

    from attrib_bench.toolkit.captum_inputs import scored_forward as _forward

    loaded, trace = float64_setup(tiny_bert)
    batch, words = trace.batch, loaded.model.get_input_embeddings()
    args = (batch.attention_mask_BN, trace.target_positions_B, batch.token_type_ids_BN)
    direct = LayerGradientXActivation(_forward(loaded), words).attribute(
        batch.input_ids_BN, target=trace.predicted_B, additional_forward_args=args
    )
    ours = Saliency().configure({"layer": "word_embeddings", "reduce": "sum"}).attribute(trace)
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours.aggregated_BLN[:, 0][mask], direct.sum(-1)[mask])
    ig = LayerIntegratedGradients(_forward(loaded), words).attribute(
        batch.input_ids_BN,
        baselines=pad_baseline(loaded, batch),
        target=trace.predicted_B,
        additional_forward_args=(*args, loaded.position_ids(batch.input_ids_BN)),
        n_steps=4,
    )
    ours = OurIG().configure({"layer": "word_embeddings", "steps": "4"}).attribute(trace)
    torch.testing.assert_close(ours.aggregated_BLN[:, 0][mask], ig.norm(dim=-1)[mask])


def test_deeplift_without_known_nonlinearities_is_gradient_times_delta(tiny_roberta):
    """RoBERTa's head calls torch.tanh: Captum's DeepLift then has no rescale rule to apply,
    and its attribution is the gradient at the input times (input - baseline) at the layer."""
    from attrib_bench_plugins.gradient import DeepLift

    loaded, trace = float64_setup(tiny_roberta)
    batch = trace.batch
    grad, activation = layer_gradient(loaded, trace, loaded.embeddings)
    with torch.no_grad():
        base = loaded.embeddings(
            input_ids=pad_baseline(loaded, batch),
            position_ids=loaded.position_ids(batch.input_ids_BN),
        )
    expected = (grad * (activation - base)).sum(-1)
    ours = DeepLift().configure({"reduce": "sum", "target": "predicted"}).attribute(trace)
    mask = trace.mask_BN.bool()
    torch.testing.assert_close(ours.aggregated_BLN[:, 0][mask], expected[mask])


def test_deeplift_runs_on_bert_and_rescales_the_pooler(tiny_bert):
    """BERT's pooler is an nn.Tanh: Captum rescales it, so the result differs from
    gradient x delta but stays finite and nonzero."""
    from attrib_bench_plugins.gradient import DeepLift

    _, trace = float64_setup(tiny_bert)
    scores = DeepLift().attribute(trace).aggregated_BLN[:, 0]
    assert torch.isfinite(scores).all() and (scores[trace.mask_BN.bool()] != 0).any()


def test_gradient_shap_is_seeded_and_batch_independent(tiny_bert):
    from attrib_bench_plugins.gradient import GradientShap

    loaded, trace = float64_setup(tiny_bert)
    method = GradientShap().configure({"samples": "4"})
    first = method.attribute(trace).aggregated_BLN
    torch.testing.assert_close(first, method.attribute(trace).aggregated_BLN, rtol=0, atol=0)
    alone = trace_batch(loaded, one_batch(loaded, examples()[1:2]), set())
    n, row = int(alone.mask_BN.sum()), [e.id for e in trace.batch.examples].index("1")
    torch.testing.assert_close(method.attribute(alone).aggregated_BLN[0, 0, :n], first[row, 0, :n])
    other = method.configure({"seed": "1"}).attribute(trace).aggregated_BLN
    assert not torch.allclose(first, other)


# ---- shared forward+backward pass (saliency, gradient) and IG's internal batches --------------


def captum_layer_gradient_x_activation(loaded, trace, layer, multiply_by_inputs):
    """Captum's own forward and backward pass for saliency (or, not multiplied, gradient)."""
    from captum.attr import LayerGradientXActivation

    from attrib_bench.toolkit.captum_inputs import captum_arguments, scored_forward

    method = LayerGradientXActivation(
        scored_forward(loaded), layer, multiply_by_inputs=multiply_by_inputs
    )
    return method.attribute(
        trace.batch.input_ids_BN,
        **captum_arguments(trace, trace.target_classes_B, trace.target_foils_B),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("score", ["predicted", "contrastive"])
def test_the_traces_pass_equals_one_captum_call_per_method(tiny_bert, dtype, score):
    from attrib_bench.core.target import Target

    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.to(dtype)
    target = Target.parse(f"score={score}")
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires, target=target)
    tolerance = {"rtol": 1e-12, "atol": 1e-14} if dtype == torch.float64 else {}
    for layer in ("embeddings", "word_embeddings"):
        module = loaded.embeddings if layer == "embeddings" else loaded.model.get_input_embeddings()
        for method, multiply in ((Saliency(), True), (Gradient(), False), (Saliency(), True)):
            ours = method.configure({"layer": layer}).per_dimension(
                trace, trace.target_classes_B, trace.target_foils_B
            )
            expected = captum_layer_gradient_x_activation(loaded, trace, module, multiply)
            torch.testing.assert_close(ours, expected, **tolerance, msg=(layer, method.name))


def counted_passes(loaded, monkeypatch):
    """Record the batch size of every forward pass of the model and count the backward passes
    (Captum differentiates with torch.autograd.grad)."""
    forwards, backwards = [], []
    loaded.model.register_forward_pre_hook(
        lambda _m, args, kwargs: forwards.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    grad = torch.autograd.grad

    def counting_grad(*args, **kwargs):
        backwards.append(1)
        return grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", counting_grad)
    return forwards, backwards


def test_saliency_and_gradient_backpropagate_once_through_the_traces_pass(tiny_bert, monkeypatch):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    forwards, backwards = counted_passes(loaded, monkeypatch)
    trace, fresh, other = (
        trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires) for _ in "abc"
    )
    assert (len(forwards), len(backwards)) == (3, 0)
    saliency = Saliency().attribute(trace).aggregated_BLN
    gradient = Gradient().configure({"reduce": "sum"}).attribute(trace).aggregated_BLN
    assert (len(forwards), len(backwards)) == (3, 1)  # no forward pass of their own
    # the other layer's gradient comes from the same pass; another explained class is another
    # gradient: its own backward pass
    Gradient().configure({"layer": "word_embeddings"}).attribute(trace)
    assert (len(forwards), len(backwards)) == (3, 1)
    Saliency().configure({"target": "gold"}).attribute(trace)
    assert (len(forwards), len(backwards)) == (3, 2)
    # each alone, on a fresh trace, works and gives the same result
    assert torch.equal(Saliency().attribute(fresh).aggregated_BLN, saliency)
    alone = Gradient().configure({"reduce": "sum"}).attribute(other).aggregated_BLN
    assert torch.equal(alone, gradient)
    assert (len(forwards), len(backwards)) == (3, 4)
    # once released, the graph is gone and a gradient method says what it needs
    trace.release_graph()
    with pytest.raises(RuntimeError, match="embedding_graph"):
        Gradient().configure({"target": "gold", "layer": "word_embeddings"}).attribute(trace)


def test_weights_are_frozen_and_gradients_reach_only_the_inputs(tiny_bert):
    """load_model freezes the weights: the gradient methods' and IG's backward passes give no
    weight gradients, and autograd keeps no tensors for them."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    assert not any(p.requires_grad for p in loaded.model.parameters())
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)
    Saliency().attribute(trace)
    OurIG().configure({"steps": "2"}).attribute(trace)
    assert all(p.grad is None for p in loaded.model.parameters())


def test_saliency_and_gradient_are_each_charged_the_shared_pass(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)
    Saliency().attribute(trace)
    (key,) = trace.shared
    trace.accessed = set()
    Gradient().attribute(trace)
    assert trace.accessed == {key}  # the runner charges the memo's time to every reader


def test_integrated_gradients_passes_hold_no_padding_and_at_most_the_token_budget(tiny_bert):
    """Each example's path runs over its real tokens in passes of at most ``chunk_tokens``
    tokens, whatever the batch's size."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), set())
    batch, steps = trace.batch, 7
    lengths = batch.attention_mask_BN.sum(dim=1).tolist()
    shapes = []
    loaded.model.register_forward_pre_hook(
        lambda _m, _args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    for tokens in (2048, 3 * max(lengths)):
        shapes.clear()
        OurIG().configure({"steps": str(steps), "chunk_tokens": str(tokens)}).attribute(trace)
        for n in lengths:  # the input's and the baseline's layer outputs, then the path steps
            assert shapes[:2] == [(1, n), (1, n)]
            size = per_pass(steps, n, tokens)
            passes = -(-steps // size)
            expected = [(size, n)] * (passes - 1) + [(steps - size * (passes - 1), n)]
            assert shapes[2 : 2 + passes] == expected
            assert all(rows * n <= tokens for rows, _ in expected)
            del shapes[: 2 + passes]
        assert not shapes
    assert per_pass(50, 40, 16 * 53) == 17  # 21 fit: three passes of 17, 17 and 16
    assert per_pass(50, 40, 16) == 1  # one step at least


def test_integrated_gradients_internal_batches_change_only_the_summation_order(tiny_bert):
    _, trace = float64_setup(tiny_bert)
    steps = 9
    whole = str(steps * trace.batch.input_ids_BN.shape[1])
    ours = OurIG().configure({"steps": str(steps), "reduce": "sum", "chunk_tokens": "1"})
    step_by_step = ours.per_dimension(trace, trace.predicted_B, None)
    one_pass = ours.configure({"chunk_tokens": whole}).per_dimension(trace, trace.predicted_B, None)
    torch.testing.assert_close(step_by_step, one_pass, rtol=1e-12, atol=1e-14)
    # and the padded batch in one Captum call gives the same numbers on the real tokens
    from captum.attr import LayerIntegratedGradients

    from attrib_bench.toolkit.captum_inputs import captum_arguments, scored_forward

    batch = trace.batch
    loaded = trace.loaded
    padded = LayerIntegratedGradients(scored_forward(loaded), loaded.embeddings).attribute(
        batch.input_ids_BN,
        baselines=pad_baseline(loaded, batch),
        **captum_arguments(trace, trace.predicted_B, None, loaded.position_ids(batch.input_ids_BN)),
        n_steps=steps,
    )
    mask = batch.attention_mask_BN.bool()
    torch.testing.assert_close(one_pass[mask], padded[mask], rtol=1e-10, atol=1e-12)
    assert not one_pass[~mask].any()


def test_integrated_gradients_chunk_tokens_is_validated():
    from attrib_bench import UsageError

    with pytest.raises(UsageError, match="chunk_tokens must be >= 1, got 0"):
        OurIG().configure({"chunk_tokens": "0"})
    assert OurIG().params["chunk_tokens"] == 2048
