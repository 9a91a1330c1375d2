"""``abpc``: AttnLRP's faithfulness protocol, the area between the LeRF and MoRF curves of the
target logit, checked against curves built by hand in float64 on the tiny BERT."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench import Attribution, EvalContext
from attrib_bench.core.target import Target
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.faithfulness import ABPC
from attrib_bench_plugins.gradient import Saliency

RATIOS = tuple(i / 10 for i in range(11))


@pytest.fixture(scope="module")
def bert64(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def words(trace) -> np.ndarray:
    """(B,) how many real non-special tokens each example has."""
    batch = trace.batch
    return (batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool()).sum(1).numpy()


def traced(loaded, target: Target | None = None):
    kwargs = {} if target is None else {"target": target}
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires, **kwargs)
    return trace, Saliency().attribute(trace)


def abpc(trace, attribution, **params) -> np.ndarray:
    evaluator = ABPC().configure({k: str(v) for k, v in params.items()})
    return evaluator.score(attribution, EvalContext(trace, None, 0))["aggregated"][0]


def by_hand(trace, attribution, zeroed: str = "word") -> list[float]:
    """Each example alone on its real tokens (no padding): the ``zeroed`` embeddings of the
    k = ceil(ratio * n) highest-scored words (MoRF) and, apart, the k lowest-scored (LeRF)
    set to 0 ("word": the word embeddings, passed as ``inputs_embeds``, to which BERT adds
    the position and token-type embeddings; "output": the embedding module's output), the
    logit of the class (minus the foil's) read, and the trapezoid area under LeRF - MoRF."""
    model, batch = trace.loaded.model, trace.batch
    classes = trace.target_classes_B.tolist()
    foils = None if trace.target_foils_B is None else trace.target_foils_B.tolist()

    def f(ids: torch.Tensor, types: torch.Tensor | None, erased: list[int], row: int) -> float:
        extra = {} if types is None else {"token_type_ids": types[None]}
        with torch.no_grad():
            if zeroed == "word":
                embeds = model.get_input_embeddings()(ids[None]).clone()
                embeds[0, erased] = 0.0
                logits = model(inputs_embeds=embeds, **extra).logits[0]
            else:
                keep = torch.ones(len(ids), 1, dtype=torch.float64)
                keep[erased] = 0.0
                hook = model.bert.embeddings.register_forward_hook(lambda m, a, out: out * keep)
                try:
                    logits = model(input_ids=ids[None], **extra).logits[0]
                finally:
                    hook.remove()
        value = float(logits[classes[row]])
        return value - float(logits[foils[row]]) if foils is not None else value

    out = []
    for row, n in enumerate(batch.lengths):
        ids = batch.input_ids_BN[row, :n]
        types = None if batch.token_type_ids_BN is None else batch.token_type_ids_BN[row, :n]
        scores = attribution.aggregated_BLN[row, -1, :n].tolist()
        words = [i for i in range(n) if not batch.special_tokens_mask_BN[row, i]]
        most = sorted(words, key=lambda i: (-scores[i], i))
        least = sorted(words, key=lambda i: (scores[i], i))
        gaps = []
        for ratio in RATIOS:
            k = math.ceil(ratio * len(words) - 1e-9)
            gaps.append(f(ids, types, least[:k], row) - f(ids, types, most[:k], row))
        area = sum((gaps[i] + gaps[i + 1]) / 2 * (RATIOS[i + 1] - RATIOS[i]) for i in range(10))
        out.append(area / (RATIOS[-1] - RATIOS[0]))
    return out


def test_abpc_is_the_area_between_the_logit_curves_by_hand(bert64):
    """Float64: the default (``removal=zero-word``) against word embeddings zeroed by hand."""
    trace, attribution = traced(bert64)
    ours = abpc(trace, attribution)
    expected = by_hand(trace, attribution)
    np.testing.assert_allclose(ours, expected, rtol=1e-9, atol=1e-14)
    # "bad" has one word: both curves erase it from ratio 0.1 on, so its area is 0; the other
    # examples' curves differ (the tiny random model's logits move by about 1e-5).
    one = words(trace) == 1
    assert one.sum() == 1 and np.array(expected)[one] == 0.0
    assert np.abs(np.array(expected)[~one]).min() > 1e-7


def test_zero_removal_zeroes_the_embedding_output_not_the_word_embedding(bert64):
    """``removal=zero`` erases BERT's embedding output (after the position and token-type
    embeddings and the LayerNorm): by hand, and not what the protocol's ``zero-word`` does."""
    trace, attribution = traced(bert64)
    ours = abpc(trace, attribution, removal="zero")
    expected = by_hand(trace, attribution, zeroed="output")
    np.testing.assert_allclose(ours, expected, rtol=1e-9, atol=1e-14)
    assert not np.allclose(ours, abpc(trace, attribution), rtol=1e-2, atol=0)


def test_reversing_the_ranking_negates_the_value_exactly(tiny_bert):
    """MoRF of the negated scores is LeRF of the scores (no ties): the same erasures, so the
    same cached logits, and the area changes sign bit for bit."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace, attribution = traced(loaded)
    batch = trace.batch
    candidates = (batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool())[:, None]
    for row in range(len(batch.examples)):
        chosen = attribution.aggregated_BLN[row, -1][candidates[row, 0]]
        assert len(torch.unique(chosen)) == len(chosen)  # no ties among the candidates
    reverse = Attribution(aggregated_BLN=-attribution.aggregated_BLN)
    forward, backward = abpc(trace, attribution), abpc(trace, reverse)
    np.testing.assert_array_equal(backward, -forward)
    assert np.isfinite(forward).all() and (forward[words(trace) > 1] != 0).all()
    # A single point of the curve away from the ends is enough to tell them apart.
    one = abpc(trace, attribution, ratios="0/0.5")
    np.testing.assert_array_equal(abpc(trace, reverse, ratios="0/0.5"), -one)


@pytest.mark.parametrize(
    "target",
    [Target(score="contrastive"), Target(score="contrastive", class_="gold")],
    ids=str,
)
def test_a_contrastive_target_reads_the_logit_difference(bert64, target):
    """logit(y) - logit(foil) after each erasure, by hand; not the logit of y alone."""
    trace, attribution = traced(bert64, target)
    assert trace.target_foils_B is not None
    ours = abpc(trace, attribution)
    np.testing.assert_allclose(ours, by_hand(trace, attribution), rtol=1e-9, atol=1e-14)
    plain = trace_batch(bert64, trace.batch, set(), target=Target("first"))
    alone = abpc(plain, attribution)
    assert not np.allclose(ours, alone, rtol=1e-2, atol=0)


def test_the_value_is_the_logit_not_a_probability():
    """The toy model of tests/test_faithfulness.py: class 1's logit is z, the weights of the
    tokens present (A 2, B 1, C 0). Ranked A > B > C, at ratios 0, 0.5, 1 (k = 0, 2, 3):
    MoRF z = 3, 0, 0 and LeRF z = 3, 2, 0, so the area is (0 + 2) / 4 + (2 + 0) / 4 = 1."""
    from test_faithfulness import SCORES, toy_trace

    _, attribution, context = toy_trace(SCORES)
    evaluator = ABPC().configure({"ratios": "0/0.5/1", "removal": "mask"})
    assert evaluator.score(attribution, context)["aggregated"][0, 0] == pytest.approx(1.0)
    assert ABPC.higher_is_better and ABPC.family == "faithfulness"
