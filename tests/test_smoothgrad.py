"""SmoothGrad and VarGrad: Captum's NoiseTunnel over saliency and gradient at the layer output,
checked against a float64 reference written from their definitions (the same seeded draws)."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench.core.errors import UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing import check_attributor
from attrib_bench.toolkit.captum_inputs import example_seed, seeded
from attrib_bench_plugins.gradient import Gradient, Saliency, SmoothGrad, VarGrad


@pytest.fixture(scope="module")
def float64(tiny_bert):
    """The tiny BERT in float64 and a padded batch of the five helper sentences."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded, trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)


def rows(method, trace) -> torch.Tensor:
    return method.attribute(trace).aggregated_BLN[:, 0]


@pytest.mark.parametrize("base", ["saliency", "gradient"])
@pytest.mark.parametrize("layer", ["embeddings", "word_embeddings"])
def test_one_noiseless_sample_is_the_base_method(float64, base, layer):
    """smoothgrad with samples=1, noise=0 is its base method; vargrad with noise=0 is zero up
    to the rounding of Captum's mean square minus squared mean."""
    _, trace = float64
    plain = {"saliency": Saliency(), "gradient": Gradient()}[base]
    options = {"base": base, "layer": layer, "reduce": "sum"}
    smooth = rows(SmoothGrad().configure({**options, "samples": "1", "noise": "0"}), trace)
    expected = rows(plain.configure({"layer": layer, "reduce": "sum"}), trace)
    torch.testing.assert_close(smooth, expected, rtol=1e-9, atol=1e-12)
    variance = rows(VarGrad().configure({**options, "samples": "3", "noise": "0"}), trace)
    squares = rows(plain.configure({"layer": layer, "reduce": "l2"}), trace) ** 2
    assert (variance.abs() <= 1e-12 * squares).all()  # sum_m φ_m², the scale of its terms


def embedding_output(loaded, inputs) -> torch.Tensor:
    """The embedding module's output (n, d) on one example's inputs."""
    kept = []
    handle = loaded.embeddings.register_forward_hook(lambda _m, _a, output: kept.append(output))
    try:
        with torch.no_grad():
            loaded.model(**inputs)
    finally:
        handle.remove()
    return kept[0][0]


def logits_from(loaded, inputs, output) -> torch.Tensor:
    """The example's logits (C,) with the embedding module's output replaced by ``output``."""
    handle = loaded.embeddings.register_forward_hook(lambda *_: output[None])
    try:
        return loaded.model(**inputs).logits[0]
    finally:
        handle.remove()


def reference(loaded, trace, name, base, samples, noise, reduce):
    """The definition in float64, example by example over its real tokens through the Hugging
    Face model: the layer output a (n, d), σ = noise * (max a - min a), k = samples draws
    ε_j ~ N(0, σ²) (replayed: the example's seed and Captum's one draw of shape (k, n, d),
    float32), φ_j = ∂s/∂a at a + ε_j (times a + ε_j for saliency); the mean over j
    (smoothgrad) or the population variance (vargrad), then ``reduce`` per token."""
    batch = trace.batch
    out = torch.zeros(batch.input_ids_BN.shape, dtype=torch.float64)
    for row in range(len(batch.input_ids_BN)):
        real = batch.attention_mask_BN[row].bool()
        inputs = {k: v[row : row + 1, real] for k, v in batch.model_inputs().items()}
        a = embedding_output(loaded, inputs)
        sigma = noise * (a.max() - a.min()).item()
        with seeded(example_seed(0, trace, row), loaded.device):
            draws = torch.normal(0, torch.tensor(sigma).repeat((samples, *a.shape)))
        phis = []
        for epsilon in draws:
            noisy = (a + epsilon).clone().requires_grad_(True)
            logits = logits_from(loaded, inputs, noisy)
            (grad,) = torch.autograd.grad(logits[trace.target_classes_B[row]], noisy)
            phis.append(grad * noisy.detach() if base == "saliency" else grad)
        phi = torch.stack(phis)
        combined = phi.mean(0) if name == "smoothgrad" else ((phi - phi.mean(0)) ** 2).mean(0)
        if reduce == "l2":
            out[row, real] = combined.norm(dim=-1)
        elif reduce == "sum":
            out[row, real] = combined.sum(dim=-1)
        else:
            out[row, real] = combined.abs().sum(dim=-1)
    return out


@pytest.mark.parametrize(
    ("method", "base", "reduce"),
    [
        (SmoothGrad(), "saliency", "sum"),
        (SmoothGrad(), "gradient", "l2"),
        (VarGrad(), "saliency", "l2"),
        (VarGrad(), "gradient", "abs-sum"),
    ],
    ids=lambda x: getattr(x, "name", x),
)
def test_equals_the_float64_definition(float64, method, base, reduce):
    loaded, trace = float64
    options = {"base": base, "reduce": reduce, "samples": "4", "noise": "0.2"}
    ours = rows(method.configure(options), trace)
    expected = reference(loaded, trace, method.name, base, 4, 0.2, reduce)
    torch.testing.assert_close(ours, expected, rtol=1e-9, atol=1e-12)
    # the noise matters: one noiseless sample is another attribution
    plain = rows(method.configure({**options, "samples": "2", "noise": "0"}), trace)
    assert not torch.allclose(ours, plain)


def test_an_example_alone_gets_its_rows_in_the_batch_and_the_run_seed_draws(float64):
    """Per-example seeds (run seed, example id): rows never depend on the batch; two calls
    agree bit for bit; another run seed draws other noise."""
    loaded, trace = float64
    alone = trace_batch(loaded, one_batch(loaded, examples()[1:2]), set())
    row = [e.id for e in trace.batch.examples].index("1")
    n = int(alone.mask_BN.sum())
    for method in (SmoothGrad(), VarGrad()):
        configured = method.configure({"samples": "3"})
        batched = rows(configured, trace)
        torch.testing.assert_close(rows(configured, alone)[0, :n], batched[row, :n])
        torch.testing.assert_close(rows(configured, trace), batched, rtol=0, atol=0)
        reseeded = trace_batch(loaded, trace.batch, set(), seed=1)
        assert not torch.allclose(rows(configured, reseeded), batched)
        # One noisy copy per pass: Captum draws the noise pass by pass, the same numbers on the
        # CPU where a copy's n * d values are a multiple of 16 (d = 32 here).
        chunked = rows(method.configure({"samples": "3", "chunk_tokens": "1"}), trace)
        torch.testing.assert_close(chunked, batched, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        (SmoothGrad(), {"samples": "0"}, "smoothgrad:samples must be >= 1, got 0"),
        (VarGrad(), {"samples": "1"}, "vargrad:samples must be >= 2, got 1"),
        (SmoothGrad(), {"noise": "-0.1"}, "smoothgrad:noise must be >= 0, got -0.1"),
        (VarGrad(), {"noise": "nan"}, "vargrad:noise must be >= 0, got nan"),
        (VarGrad(), {"chunk_tokens": "0"}, "vargrad:chunk_tokens must be >= 1, got 0"),
        (SmoothGrad(), {"base": "ig"}, "bad value 'ig' for smoothgrad:base; valid choices: "),
    ],
)
def test_out_of_range_parameters_are_one_line_usage_errors(method, options, message):
    with pytest.raises(UsageError) as raised:
        method.configure(options)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("method", [SmoothGrad(), VarGrad()], ids=lambda m: m.name)
def test_the_conformance_kit_accepts_it(method):
    report = check_attributor(method.configure({"samples": "3"}), families=("bert",))
    assert "aggregated" in report.shapes["bert"]
