"""AtMan (``atman``): equal to a float64 reference that transcribes the official code's attention
manipulation (GPT-Neo's ``_attn`` with ``manipulate_attention_scores``: shift by the row
minimum of the unscaled scores, multiply the suppressed columns, mask, scale, softmax) and its
conceptual suppression, run copy by copy through each family's eager attention; the factors of
a clean copy change no logit; the conformance kit; a family it cannot reach is one line."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import ARCHITECTURES, examples, load_float64, one_batch

from attrib_bench.core.attention_kernels import EAGER, attention_implementation
from attrib_bench.core.errors import UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.testing import check_attributor
from attrib_bench_plugins.atman import AtMan, suppressing

MODULES = {
    "bert": "transformers.models.bert.modeling_bert",
    "llama": "transformers.models.llama.modeling_llama",
    "gpt2": "transformers.models.gpt2.modeling_gpt2",
}


@pytest.fixture(scope="module", params=["bert", "llama", "gpt2"])
def family64(request, tiny_bert, tmp_path_factory):
    return request.param, load_float64(request.param, tiny_bert, tmp_path_factory)


def official_configs(embeddings_ND: torch.Tensor, factor: float, threshold: float | None):
    """ConceptualSuppression.modify_configs, loop for loop: per suppressed token, the indices
    and factors of the copy."""
    n = embeddings_ND.shape[0]
    a = embeddings_ND / embeddings_ND.norm(dim=1, keepdim=True).clamp(min=1e-8)
    similarity = (a @ a.T).clip(-1, 1)
    configs = []
    for index in range(n):
        indices, factors = [index], [factor]
        if threshold is not None:
            for other in range(n):
                cosine = float(similarity[index, other])
                if other != index and cosine >= threshold:
                    indices.append(other)
                    keep = 0 <= cosine <= 1
                    factors.append((1 - factor) * (1 - cosine) + factor if keep else 1.0)
        configs.append((indices, factors))
    return configs


def official_attention(factors_N: torch.Tensor, causal: bool):
    """The official ``_attn`` on one copy, from the model's own query, key and value."""

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        n = query.shape[-2]
        weights = query @ key.transpose(-1, -2)
        weights = weights - weights.min(-1).values.unsqueeze(3)
        weights = weights * factors_N
        keep = torch.ones(n, n, dtype=torch.bool).tril() if causal else torch.ones(n, n).bool()
        weights = weights.masked_fill(~keep, -10000.0)
        weights = weights / math.sqrt(query.shape[-1])
        weights = torch.where(keep, weights, torch.tensor(-1e9, dtype=weights.dtype))
        weights[weights < -10000.0] = -10000.0
        probabilities = weights.softmax(dim=-1)
        return (probabilities @ value).transpose(1, 2).contiguous(), probabilities

    return attention


def reference_row(family: str, loaded, ids_N, position: int, label: int, params: dict):
    """One example's relevances from the official procedure, copy by copy, in float64: the
    target's cross-entropy under suppression minus without (the paper's sign)."""
    module = __import__(MODULES[family], fromlist=["eager_attention_forward"])
    threshold = params["threshold"] if params["conceptual"] else None
    embeddings = loaded.model.get_input_embeddings()(ids_N).double()
    configs = official_configs(embeddings, params["factor"], threshold)
    n = len(ids_N)

    def loss(factors_N: torch.Tensor) -> float:
        original = module.eager_attention_forward
        module.eager_attention_forward = official_attention(factors_N, family != "bert")
        try:
            with attention_implementation(loaded.model, EAGER), torch.no_grad():
                logits = loaded.model(input_ids=ids_N[None]).logits[0]
        finally:
            module.eager_attention_forward = original
        logits = logits[position] if family != "bert" else logits
        return float(torch.nn.functional.cross_entropy(logits[None], torch.tensor([label])))

    clean = loss(torch.ones(n, dtype=torch.float64))
    row = []
    for indices, factors in configs:
        factors_N = torch.ones(n, dtype=torch.float64)
        factors_N[indices] = torch.tensor(factors, dtype=torch.float64)
        row.append(loss(factors_N) - clean)
    return torch.tensor(row, dtype=torch.float64)


@pytest.mark.parametrize(
    "settings",
    [{}, {"conceptual": "false"}, {"threshold": "0.2", "factor": "0.0"}],
    ids=["official", "alone", "many-neighbours"],
)
def test_atman_equals_the_official_procedure(family64, settings):
    family, loaded = family64
    texts = ["the film the film was good", "a dull , dull movie", "fine"]
    trace = trace_batch(loaded, one_batch(loaded, examples(texts)), frozenset())
    method = AtMan().configure(settings)
    rows_BN = method.attribute(trace).aggregated_BLN[:, 0]
    for row in range(len(texts)):
        real_N = trace.batch.attention_mask_BN[row].bool()
        position = int(real_N[: trace.target_positions_B[row]].sum())
        label = int(trace.target_classes_B[row])
        ids_N = trace.batch.input_ids_BN[row][real_N]
        expected = reference_row(family, loaded, ids_N, position, label, method.params)
        torch.testing.assert_close(rows_BN[row][real_N].double(), expected, rtol=1e-7, atol=1e-9)


def test_a_repeated_token_is_suppressed_with_its_twin(tiny_bert):
    """Conceptual suppression: a token's copy elsewhere (cosine 1) is suppressed by f too, so
    the two get the same relevance; without it they differ."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples(["good film , good"])), frozenset())
    ids_N = trace.batch.input_ids_BN[0]
    twins = (ids_N == ids_N[1]).nonzero()[:, 0]
    assert len(twins) == 2
    with_ = AtMan().attribute(trace).aggregated_BLN[0, 0, twins]
    alone = AtMan().configure({"conceptual": "false"}).attribute(trace).aggregated_BLN[0, 0, twins]
    torch.testing.assert_close(with_[0], with_[1])
    assert not torch.allclose(alone[0], alone[1])


def test_unsuppressed_copies_change_no_logit(family64):
    """With every factor 1 the registered attention is the model's own, padding included."""
    family, loaded = family64
    batch = one_batch(loaded, examples())
    with torch.no_grad():
        plain = loaded.model(**batch.model_inputs()).logits
        with suppressing(loaded.model) as record:
            record["factors"] = torch.ones(batch.input_ids_BN.shape, dtype=torch.float64)
            suppressed = loaded.model(**batch.model_inputs()).logits
    real = batch.attention_mask_BN.bool()
    if loaded.is_language_model:
        plain, suppressed = plain[real], suppressed[real]
    # LLaMA's own eager attention takes its softmax in float32 even in a float64 model.
    tolerance = 1e-6 if family == "llama" else 1e-10
    torch.testing.assert_close(suppressed, plain, rtol=tolerance, atol=tolerance)


def test_the_kit_accepts_atman():
    check_attributor(AtMan(), families=("bert", "roberta"))


def test_an_attention_atman_cannot_reach_is_one_line(tiny_bert, monkeypatch):
    """A family whose attention bypasses transformers' attention interface would be explained
    unsuppressed (every relevance 0): refused instead, naming the method and the model type."""
    import attrib_bench_plugins.atman as atman

    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), frozenset())
    monkeypatch.setattr(atman, "IMPLEMENTATION", "sdpa")  # the kernel that ignores factors
    with pytest.raises(UsageError, match=r"^atman: the attention of bert does not go through"):
        AtMan().attribute(trace)


@pytest.mark.parametrize(
    "settings", [{"factor": "1"}, {"threshold": "1.5"}, {"chunk_tokens": "0"}, {"score": "prob"}]
)
def test_out_of_range_settings_are_refused(settings):
    with pytest.raises(UsageError):
        AtMan().configure(settings)
