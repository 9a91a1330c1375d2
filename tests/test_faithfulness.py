"""Faithfulness evaluators: the masking function, hand-computed metrics, removal strategies."""

from __future__ import annotations

import math
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench import Attribution, EvalContext, UsageError
from attrib_bench.core.interfaces import Batch, Example
from attrib_bench.core.target import Target
from attrib_bench.core.trace import Trace
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.erasure import CACHE_KEY, erase
from attrib_bench.toolkit.ranking import erasure_mask, ratio_k, top_k_mask
from attrib_bench_plugins.faithfulness import (
    Comprehensiveness,
    Deletion,
    Insertion,
    LogOdds,
    MaskedAccuracy,
    Sufficiency,
    curve_area,
    log_odds,
)
from attrib_bench_plugins.gradient import Saliency

CLS, SEP, PAD, MASK = 101, 102, 0, 103
A, B, C = 1, 2, 3
#: The toy model's evidence: token A adds 2 to the class-1 logit, B adds 1, C nothing.
WEIGHTS = {A: 2.0, B: 1.0}
BIAS0 = 0.5  # the class-0 logit, so p(1) = sigmoid(z - 0.5) with z the evidence present


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class Evidence(torch.nn.Module):
    """logits = [0.5, sum of the weights of the tokens present]; counts its forward calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.rows = 0

    def forward(self, input_ids, attention_mask, token_type_ids=None, position_ids=None):
        self.calls += 1
        self.rows += input_ids.shape[0]
        present = attention_mask.bool()
        z = sum(w * ((input_ids == t) & present).sum(-1).double() for t, w in WEIGHTS.items())
        return SimpleNamespace(logits=torch.stack([torch.full_like(z, BIAS0), z], dim=-1))


def toy_trace(scores: list[float], label: int = 1, pad: int = 0):
    """[CLS] A B C [SEP] (+ padding) with the given scores; the trace of the toy model."""
    ids = torch.tensor([[CLS, A, B, C, SEP] + [PAD] * pad])
    mask = torch.tensor([[1] * 5 + [0] * pad])
    special = torch.tensor([[1, 0, 0, 0, 1] + [1] * pad])
    batch = Batch([Example("x", "a b c", label=label)], ids, mask, None, special, [])
    model = Evidence()
    tokenizer = SimpleNamespace(mask_token_id=MASK, pad_token_id=PAD, bos_token_id=None)
    loaded = SimpleNamespace(
        model=model,
        tokenizer=tokenizer,
        position_ids=lambda ids: torch.arange(ids.shape[1]).expand_as(ids),
        is_language_model=False,
        fast_attention=nullcontext,  # a toy without attention
    )
    trace = Trace(batch=batch, loaded=loaded, logits_BC=model(ids, mask).logits.float())
    attribution = Attribution(aggregated_BLN=torch.tensor([[scores + [0.0] * pad]]))
    return trace, attribution, EvalContext(trace, None, 0)


# [CLS] and [SEP] get the highest scores: they must never be erased.
SCORES = [5.0, 0.9, 0.5, 0.1, 4.0]


def evaluate(evaluator, **params):
    _, attribution, context = toy_trace(SCORES)
    configured = evaluator.configure({k: str(v) for k, v in params.items()})
    return float(configured.score(attribution, context)["aggregated"][0, 0])


# ----------------------------------------------------------------------- the masking function


@pytest.mark.parametrize(
    ("ratio", "n", "k"),
    [(0.0, 7, 0), (0.1, 5, 1), (0.3, 10, 3), (0.5, 5, 3), (0.6, 3, 2), (0.7, 10, 7), (1.0, 7, 7)],
)
def test_k_is_the_ceiling_of_ratio_times_candidates(ratio, n, k):
    assert ratio_k(ratio, n) == k  # 0.3 * 10 = 3.0000000000000004 must not round up to 4


def test_top_k_skips_special_tokens_and_padding_and_breaks_ties_by_position():
    # positions: [CLS] w1 w2 w3 w4 [SEP] pad; specials and padding hold the largest scores.
    scores = np.array([[100.0, 0.5, 0.9, 0.5, 0.1, 50.0, 99.0]])
    candidates = np.array([[False, True, True, True, True, False, False]])
    for k, expected in [(0, []), (1, [2]), (2, [1, 2]), (3, [1, 2, 3]), (4, [1, 2, 3, 4])]:
        chosen = top_k_mask(scores, candidates, np.array([k]))
        assert np.flatnonzero(chosen[0]).tolist() == expected, k


def test_erasure_on_a_real_batch_masks_exactly_the_top_k_and_never_a_special_token(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    batch = one_batch(loaded, examples())
    special = batch.special_tokens_mask_BN.bool()
    candidates = (batch.attention_mask_BN.bool() & ~special).numpy()
    # Adversarial scores: specials highest, then descending by position among words.
    scores = torch.where(special, 1000.0, -torch.arange(special.shape[1]).double()).numpy()
    for ratio in (0.1, 0.5, 0.9, 1.0):
        removed = erasure_mask(scores, candidates, ratio, "remove")
        masked = erase(batch.model_inputs(), torch.as_tensor(removed), "mask", loaded.tokenizer)
        changed = masked["input_ids"] != batch.input_ids_BN
        assert not (changed & special).any()
        for row in range(len(batch.examples)):
            words = np.flatnonzero(candidates[row])
            k = ratio_k(ratio, len(words))
            # The highest-scoring words are the first k positions, by construction.
            assert np.flatnonzero(changed[row].numpy()).tolist() == words[:k].tolist()
            assert (masked["input_ids"][row][changed[row]] == loaded.tokenizer.mask_token_id).all()
        kept = erasure_mask(scores, candidates, ratio, "keep")
        assert not (kept & removed).any() and ((kept | removed) == candidates).all()


def test_delete_repacks_each_row_like_the_shortened_input_alone(tiny_model):
    """A genuine deletion: the re-packed tokens are numbered afresh, not at their old places."""
    loaded = load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)
    pairs = [Example("0", "a good film", "yes it was"), Example("1", "bad", "no")]
    if loaded.model.config.type_vocab_size == 1:  # the tiny RoBERTa has one segment type
        pairs = [Example(e.id, f"{e.text} {e.text_pair}") for e in pairs]
    batch = one_batch(loaded, pairs)
    candidates = (batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool()).numpy()
    removed = erasure_mask(np.zeros(candidates.shape), candidates, 0.4, "remove")
    # What the evaluators pass: the original input's position ids ride along.
    inputs = {
        **batch.model_inputs(),
        "position_ids": loaded.adapter.position_ids(batch.input_ids_BN),
    }
    packed = erase(inputs, torch.as_tensor(removed), "delete", loaded.tokenizer)
    with torch.no_grad():
        together = loaded.model(**packed).logits
    for row in range(2):
        keep = batch.attention_mask_BN[row].bool() & ~torch.as_tensor(removed[row])
        alone = {k: v[row][keep][None] for k, v in batch.model_inputs().items()}
        length = int(keep.sum())
        assert packed["input_ids"][row][:length].tolist() == alone["input_ids"][0].tolist()
        with torch.no_grad():
            torch.testing.assert_close(together[row], loaded.model(**alone).logits[0])


@pytest.mark.parametrize("removal", ["pad", "mask"])
def test_replacing_tokens_leaves_every_other_embedding_unchanged(tiny_model, removal):
    """RoBERTa numbers positions over non-pad tokens: a [PAD] must not move later tokens."""
    loaded = load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)
    batch = one_batch(loaded, examples())
    embeddings = loaded.adapter.embeddings
    with torch.no_grad():
        original = embeddings(input_ids=batch.input_ids_BN, token_type_ids=batch.token_type_ids_BN)
    seen = []
    handle = embeddings.register_forward_hook(
        lambda _module, _args, kwargs, output: seen.append((kwargs["input_ids"], output)),
        with_kwargs=True,
    )
    trace = trace_batch(loaded, batch, set())
    generator = torch.Generator().manual_seed(0)
    scores = Attribution(
        aggregated_BLN=torch.rand(5, 1, batch.input_ids_BN.shape[1], generator=generator)
    )
    try:
        Comprehensiveness().configure({"removal": removal, "ratios": "0.5"}).erased(
            scores, EvalContext(trace, None, 0)
        )
    finally:
        handle.remove()
    ((ids, erased),) = seen[1:]  # after the trace: one pass, one variant per example, in order
    untouched = ids == batch.input_ids_BN
    assert (~untouched).any(dim=1).all()  # every example had a token replaced
    torch.testing.assert_close(erased[untouched], original[untouched])


def test_zero_removal_ignores_which_token_was_erased(tiny_bert):
    """With the embedding output zeroed, the erased token's identity cannot matter."""
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    batch = one_batch(loaded, examples()[:2])
    other = Batch(
        batch.examples,
        torch.where(batch.special_tokens_mask_BN.bool(), batch.input_ids_BN, 2000),
        batch.attention_mask_BN,
        batch.token_type_ids_BN,
        batch.special_tokens_mask_BN,
        batch.tokens,
    )
    scores = Attribution(aggregated_BLN=torch.rand(2, 1, batch.input_ids_BN.shape[1]))
    results = []
    for b in (batch, other):
        trace = trace_batch(loaded, b, set())
        erased = Comprehensiveness().configure({"removal": "zero", "ratios": "1"})
        results.append(erased.erased(scores, EvalContext(trace, None, 0)))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- hand-computed metrics


@pytest.mark.parametrize("removal", ["mask", "pad", "delete"])
def test_comprehensiveness_by_hand(removal):
    # ratios 0.3 and 0.6 of 3 words: k = 1 (A), then 2 (A, B).
    p = sigmoid(3 - BIAS0)
    expected = p - (sigmoid(1 - BIAS0) + sigmoid(0 - BIAS0)) / 2
    got = evaluate(Comprehensiveness(), ratios="0.3/0.6", removal=removal)
    assert got == pytest.approx(expected)


def test_sufficiency_by_hand():
    # keep only A (z = 2), then A and B (z = 3, the original)
    p = sigmoid(3 - BIAS0)
    assert evaluate(Sufficiency(), ratios="0.3/0.6") == pytest.approx(
        p - (sigmoid(2 - BIAS0) + p) / 2
    )


def test_deletion_and_insertion_areas_by_hand():
    p, none = sigmoid(3 - BIAS0), sigmoid(-BIAS0)
    # deletion at 0, 0.5 (k = 2: A, B gone), 1: p, none, none; trapezoids of width 0.5
    assert evaluate(Deletion(), ratios="0/0.5/1") == pytest.approx(
        (p + none) / 4 + (none + none) / 4
    )
    # insertion: nothing kept, A and B kept, all kept: none, p, p
    assert evaluate(Insertion(), ratios="0/0.5/1") == pytest.approx((none + p) / 4 + p / 2)
    assert curve_area(np.array([[1.0], [0.5], [0.0]]), (0.0, 0.5, 1.0)) == pytest.approx([0.5])


def test_log_odds_by_hand():
    # log-odds of class 1 = z - 0.5; removing A (the top 20% of 3 words: k = 1) drops z by 2.
    assert evaluate(LogOdds()) == pytest.approx(2.0)
    two = np.log(np.array([[0.8, 0.2], [0.2, 0.8]]))
    assert log_odds(two, np.array([0, 0])) == pytest.approx([math.log(4), -math.log(4)])
    three = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))  # p / (1 - p) = 1, then 1/9
    assert log_odds(three, np.array([0, 0])) == pytest.approx([0.0, -math.log(9)])


def test_masked_accuracy_by_hand():
    # gold 1: removing A leaves z = 1 > 0.5 (right), removing A and B leaves 0 < 0.5 (wrong)
    assert evaluate(MaskedAccuracy(), ratios="0.3/0.6") == pytest.approx(0.5)
    # keeping only A (z = 2) and A, B (z = 3): right both times
    assert evaluate(MaskedAccuracy(), ratios="0.3/0.6", mode="keep") == pytest.approx(1.0)
    assert MaskedAccuracy().configure({"mode": "keep"}).higher_is_better
    assert not MaskedAccuracy().higher_is_better


def test_unlabelled_and_unscoreable_examples_are_nan():
    trace, attribution, context = toy_trace(SCORES)
    trace.batch.examples[0] = Example("x", "a b c")
    assert np.isnan(MaskedAccuracy().score(attribution, context)["aggregated"][0, 0])
    trace, attribution, context = toy_trace([0.0, math.nan, 1.0, 1.0, 0.0])
    assert np.isnan(Comprehensiveness().score(attribution, context)["aggregated"][0, 0])


def test_erasures_are_batched_and_shared_between_bins_evaluators_and_methods():
    trace, attribution, context = toy_trace(SCORES, pad=2)
    model = trace.loaded.model
    model.calls = model.rows = 0
    # 9 bins of 3 words erase k = 1, 1, 1, 2, 2, 2, 3, 3, 3 words: 3 distinct variants, one pass
    Comprehensiveness().score(attribution, context)
    assert (model.calls, model.rows) == (1, 3)
    Deletion().score(attribution, context)  # 0 erases nothing, the rest was done
    LogOdds().score(attribution, context)
    MaskedAccuracy().score(attribution, context)
    same_ranking = Attribution(aggregated_BLN=attribution.aggregated_BLN * 2)
    Comprehensiveness().score(same_ranking, context)  # another method, the same erasures
    assert (model.calls, model.rows) == (1, 3)
    Insertion().score(attribution, context)  # keeping 0 words = removing all 3: done
    assert (model.calls, model.rows) == (2, 5)
    whole = Comprehensiveness().score(attribution, context)["aggregated"]
    chunked = Comprehensiveness().configure({"chunk_tokens": "7"})  # one row of 7 per pass
    trace, attribution, context = toy_trace(SCORES, pad=2)
    assert chunked.score(attribution, context)["aggregated"] == pytest.approx(whole)
    assert trace.loaded.model.calls == 1 + 3  # the original, then one pass per variant


def test_erasing_every_word_does_not_depend_on_the_ranking(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)
    saliency = Saliency().attribute(trace)
    reverse = Attribution(aggregated_BLN=-saliency.aggregated_BLN)
    context = EvalContext(trace, None, 0)
    full = Comprehensiveness().configure({"ratios": "1"})
    np.testing.assert_allclose(  # erasing every word does not depend on the order
        full.score(saliency, context)["aggregated"], full.score(reverse, context)["aggregated"]
    )
    scores = Comprehensiveness().score(saliency, context)["aggregated"]
    assert scores.shape == (1, 5) and np.isfinite(scores).all()


@pytest.mark.parametrize(
    "params",
    [{"ratios": "0.1,0.2"}, {"ratios": "1.5"}, {"removal": "blank"}, {"layer": "0"}],
)
def test_bad_parameters_are_usage_errors(params):
    with pytest.raises(UsageError):
        Comprehensiveness().configure(params)


def test_layer_parameter_picks_the_row():
    _, _, context = toy_trace(SCORES)
    # Layer 1 ranks A first, layer 2 ranks C first (removing C changes nothing).
    rows = torch.tensor([[SCORES, [5.0, 0.1, 0.5, 0.9, 4.0]]])
    layered = Attribution(aggregated_BLN=rows)
    first = Comprehensiveness().configure({"ratios": "0.3", "layer": "1"})
    last = Comprehensiveness().configure({"ratios": "0.3"})
    assert first.score(layered, context)["aggregated"][0, 0] == pytest.approx(
        sigmoid(3 - BIAS0) - sigmoid(1 - BIAS0)
    )
    assert last.score(layered, context)["aggregated"][0, 0] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="layers"):
        Comprehensiveness().configure({"layer": "3"}).score(layered, context)


# ------------------------------------------------------------ under a contrastive target


def contrastive(evaluator, **params):
    trace, attribution, context = toy_trace(SCORES)
    trace.target = Target(score="contrastive")  # class 1 (predicted) minus class 0 (runner-up)
    configured = evaluator.configure({k: str(v) for k, v in params.items()})
    return float(configured.score(attribution, context)["aggregated"][0, 0])


def test_contrastive_metrics_read_the_logit_difference_by_hand():
    # s = logit(1) - logit(0) = z - 0.5: 2.5 on the full input; removing A leaves z = 1,
    # removing A and B z = 0; keeping only A z = 2.
    assert contrastive(Comprehensiveness(), ratios="0.3/0.6") == pytest.approx(
        2.5 - (0.5 + -0.5) / 2
    )
    assert contrastive(Sufficiency(), ratios="0.3/0.6") == pytest.approx(2.5 - (1.5 + 2.5) / 2)
    # deletion: 2.5, -0.5, -0.5 at 0, 0.5, 1; insertion: -0.5, 2.5, 2.5
    assert contrastive(Deletion(), ratios="0/0.5/1") == pytest.approx((2.5 - 0.5) / 4 - 1 / 4)
    assert contrastive(Insertion(), ratios="0/0.5/1") == pytest.approx(2.0 / 4 + 5.0 / 4)
    # Two classes: the log-odds of the predicted class are s, so log-odds agree either way.
    assert contrastive(LogOdds()) == pytest.approx(evaluate(LogOdds())) == pytest.approx(2.0)
    # masked accuracy is against the gold label, whatever the target
    assert contrastive(MaskedAccuracy(), ratios="0.3/0.6") == pytest.approx(0.5)


def test_the_contrastive_metric_is_not_the_probability_one():
    p = evaluate(Comprehensiveness(), ratios="0.3/0.6")
    assert p == pytest.approx(sigmoid(2.5) - (sigmoid(0.5) + sigmoid(-0.5)) / 2)
    assert contrastive(Comprehensiveness(), ratios="0.3/0.6") == pytest.approx(2.5)
    assert p != pytest.approx(2.5)


@pytest.fixture(scope="module")
def bert64(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


@pytest.mark.parametrize(
    "target",
    [Target(score="contrastive"), Target(score="contrastive", class_="gold")],
    ids=str,
)
def test_contrastive_comprehensiveness_by_hand_on_the_tiny_model(bert64, target):
    """Float64: s(x) - mean over bins of s(x with its top-k words masked), one example at a
    time on its real tokens, with the classes and foils of the full input."""
    trace = trace_batch(bert64, one_batch(bert64, examples()), Saliency.requires, target=target)
    attribution = Saliency().attribute(trace)
    ratios = (0.2, 0.5)
    evaluator = Comprehensiveness().configure({"ratios": "0.2/0.5"})
    ours = evaluator.score(attribution, EvalContext(trace, None, 0))["aggregated"][0]
    batch = trace.batch
    classes, foils = trace.target_classes_B.tolist(), trace.target_foils_B.tolist()
    model, mask_id = bert64.model, bert64.tokenizer.mask_token_id

    def s(ids: torch.Tensor, row: int) -> float:
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0]
        return float(logits[classes[row]] - logits[foils[row]])

    for row, n in enumerate(batch.lengths):
        ids = batch.input_ids_BN[row, :n]
        scores = attribution.aggregated_BLN[row, 0, :n].tolist()
        words = [i for i in range(n) if not batch.special_tokens_mask_BN[row, i]]
        ranked = sorted(words, key=lambda i: (-scores[i], i))
        erased = []
        for ratio in ratios:
            top = ranked[: math.ceil(ratio * len(words) - 1e-9)]
            masked = ids.clone()
            masked[top] = mask_id
            erased.append(s(masked, row))
        expected = s(ids, row) - sum(erased) / len(erased)
        assert ours[row] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # The probability of the class says something else.
    plain = trace_batch(bert64, batch, set(), target=Target("first"))
    probability = evaluator.score(attribution, EvalContext(plain, None, 0))["aggregated"][0]
    assert not np.allclose(ours, probability)
    # log-odds under a contrastive target is the drop of s at 20%: comprehensiveness at 0.2
    at_20 = Comprehensiveness().configure({"ratios": "0.2"})
    np.testing.assert_allclose(
        LogOdds().score(attribution, EvalContext(trace, None, 0))["aggregated"],
        at_20.score(attribution, EvalContext(trace, None, 0))["aggregated"],
        rtol=1e-12,
    )


def test_packed_erasures_run_in_passes_of_similar_lengths():
    from attrib_bench.toolkit.erasure import PADDING_SHARE, _passes

    generator = np.random.default_rng(0)
    lengths_B = generator.integers(3, 40, size=16)
    mask_BN = torch.arange(40)[None] < torch.as_tensor(lengths_B)[:, None]
    batch = SimpleNamespace(attention_mask_BN=mask_BN.long(), input_ids_BN=mask_BN.long())
    keys, kept = [], {}
    for b, n in enumerate(lengths_B):
        for k in range(1, n - 1):  # erase the first k real tokens after [CLS]
            erased = np.zeros(40, dtype=bool)
            erased[1 : 1 + k] = True
            keys.append(("delete", b, erased.tobytes()))
            kept[keys[-1]] = n - k
    passes = _passes(keys, batch, chunk_tokens=256)
    assert sorted(key for chunk in passes for key in chunk) == sorted(keys)  # each key once
    for chunk in passes:
        padded = len(chunk) * max(kept[key] for key in chunk)
        assert padded <= 256 or len(chunk) == 1
        assert padded * (1 - PADDING_SHARE) <= sum(kept[key] for key in chunk)
    unpacked = _passes([("mask", *key[1:]) for key in keys], batch, chunk_tokens=256)
    assert [len(chunk) for chunk in unpacked[:-1]] == [256 // 40] * (len(unpacked) - 1)


@pytest.mark.parametrize("removal", ["delete", "retokenize"])
def test_packed_passes_give_each_variants_own_scores(tiny_bert, removal):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)
    saliency = Saliency().attribute(trace)
    scores = {}
    for chunk_tokens in ("8192", "1"):  # every variant in few passes, or each alone unpadded
        fresh = trace_batch(loaded, trace.batch, Saliency.requires)
        options = {"removal": removal, "chunk_tokens": chunk_tokens}
        evaluator = Comprehensiveness().configure(options)
        scores[chunk_tokens] = evaluator.score(saliency, EvalContext(fresh, None, 0))["aggregated"]
    np.testing.assert_allclose(scores["8192"], scores["1"], rtol=1e-5, atol=1e-6)


def test_planned_erasures_of_every_evaluator_run_in_one_pooled_pass():
    """``plan`` announces a pair's erasures; the first score then runs them all together: the
    comprehensiveness and insertion variants above (3 + 2 rows) in one pass, not two, with the
    scores of unpooled calls."""
    evaluators = [Comprehensiveness(), Insertion()]
    trace, attribution, context = toy_trace(SCORES, pad=2)
    alone = [e.score(attribution, context)["aggregated"] for e in evaluators]
    trace, attribution, context = toy_trace(SCORES, pad=2)
    model = trace.loaded.model
    model.calls = model.rows = 0
    for evaluator in evaluators:
        evaluator.plan(attribution, context)
    assert (model.calls, model.rows) == (0, 0)  # announcing runs nothing
    pooled = [e.score(attribution, context)["aggregated"] for e in evaluators]
    assert (model.calls, model.rows) == (1, 5)
    for one, other in zip(alone, pooled, strict=True):
        np.testing.assert_array_equal(one, other)


def test_planned_erasures_keep_their_removal_and_token_budget():
    """Pooled keys of two removals run one removal a pass; a key keeps the budget it was
    announced with (``chunk_tokens=7``: one row of 7 tokens a pass)."""
    masked = Comprehensiveness().configure({"removal": "mask"})
    padded = Comprehensiveness().configure({"removal": "pad", "chunk_tokens": "7"})
    trace, attribution, context = toy_trace(SCORES, pad=2)
    alone = [e.score(attribution, context)["aggregated"] for e in (masked, padded)]
    trace, attribution, context = toy_trace(SCORES, pad=2)
    model = trace.loaded.model
    model.calls = 0
    padded.plan(attribution, context)
    pooled = [e.score(attribution, context)["aggregated"] for e in (masked, padded)]
    assert model.calls == 1 + 3  # the masked variants in one pass, the padded one a pass each
    assert {removal for removal, _, _ in trace.shared[CACHE_KEY]} == {"mask", "pad"}
    for one, other in zip(alone, pooled, strict=True):
        np.testing.assert_array_equal(one, other)
