"""ferret 0.4.2's AOPC protocol (``comprehensiveness:protocol=ferret`` and its switches) against
a pure-Python loop written from ferret's ``AOPC_Comprehensiveness_Evaluation`` and
``AOPC_Sufficiency_Evaluation`` (evaluators/faithfulness_measures.py, with
utils_from_soft_to_discrete.py's ``_get_id_tokens_percentage`` and default arguments)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, one_batch

from attrib_bench import Attribution, EvalContext
from attrib_bench.core.interfaces import Example
from attrib_bench.core.target import DEFAULT_TARGET, Target
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.erasure import CACHE_KEY, retokenized, round_trip_restores
from attrib_bench_plugins.faithfulness import FERRET_RATIOS, Comprehensiveness, Sufficiency
from attrib_bench_plugins.gradient import Saliency
from attrib_bench_plugins.loo import LooTau

#: Word pieces whose deletion changes the re-tokenised count ("snoozefest" is s ##no ##oz
#: ##efe ##st; without ##no it decodes to "sozefest": so ##ze ##fest), a sentence of 6, one of
#: 11 word pieces and a short one (k = int(0.1 * n) = 0 for n < 10).
TEXTS = [
    "what a snoozefest , truly",
    "the film was not good .",
    "a truly wonderful and moving story about two friends",
    "bad movie",
]


def ferret_aopc(model, tokenizer, text, scores, target, keep):
    """ferret 0.4.2's AOPC comprehensiveness (``keep=False``) or sufficiency, in float64."""

    def probability(texts):
        encoded = tokenizer(texts, return_tensors="pt", truncation=True)
        with torch.no_grad():
            return torch.softmax(model(**encoded).logits.double(), -1)[0, target].item()

    baseline = probability(text)
    ids = tokenizer(text, truncation=True)["input_ids"][1:-1]  # remove_first_last
    scores = list(scores[1:-1])
    last, drops = None, []
    for threshold in np.arange(0.1, 1.1, 0.1):
        k = int(threshold * len(scores))
        if not 0 < k <= len(scores):
            continue
        top = [i for i in np.array(scores).argsort()[-k:][::-1] if scores[i] > 0]  # only_pos
        if not top or (last is not None and set(top) == last):
            continue
        last = set(top)
        if keep:
            kept = [ids[i] for i in sorted(top)]
        else:
            kept = [token for i, token in enumerate(ids) if i not in top]
        drops.append(baseline - probability(tokenizer.decode(kept)))
    if not drops:
        return 1.0 if keep else 0.0
    return sum(drops) / len(drops)


@pytest.fixture(scope="module")
def setting(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    items = [Example(id=str(i), text=t, label=i % 2) for i, t in enumerate(TEXTS)]
    batch = one_batch(loaded, items)
    # Signed scores without ties: alternating signs over the word pieces; example 3 all negative.
    N = batch.input_ids_BN.shape[1]
    generator = torch.Generator().manual_seed(1)
    magnitude = torch.rand(len(items), N, generator=generator, dtype=torch.float64) + 0.1
    sign = torch.where(torch.arange(N) % 3 == 0, -1.0, 1.0).double()
    scores = magnitude * sign
    scores[3] = -magnitude[3]
    scores[0, 3] = 5.0  # ##no (s ##no ##oz ...) ranks first: its deletion re-tokenises
    scores = scores * batch.attention_mask_BN
    return loaded, batch, Attribution(aggregated_BLN=scores[:, None, :].float())


def scored(loaded, batch, attribution, evaluator, target=DEFAULT_TARGET, **params):
    trace = trace_batch(loaded, batch, set(), target=target)
    configured = evaluator.configure({"protocol": "ferret", **params})
    values = configured.score(attribution, EvalContext(trace, None, 0))["aggregated"][0]
    return trace, values


@pytest.mark.parametrize("evaluator", [Comprehensiveness(), Sufficiency()])
@pytest.mark.parametrize("target", [Target(), Target(score="gold")])
def test_ferret_protocol_equals_ferrets_loop(setting, evaluator, target):
    loaded, batch, attribution = setting
    trace, values = scored(loaded, batch, attribution, evaluator, target)
    classes = trace.target_classes_B.tolist()
    if target.score == "gold":  # the gold class is not the predicted one somewhere
        assert (trace.target_classes_B != trace.predicted_B).any()
    for row, example in enumerate(batch.examples):
        n = batch.lengths[row]
        expected = ferret_aopc(
            loaded.model,
            loaded.tokenizer,
            example.text,
            attribution.aggregated_BLN[row, 0, :n].double().tolist(),
            classes[row],
            keep=evaluator.mode == "keep",
        )
        assert values[row] == pytest.approx(expected, abs=1e-6), example.text
    assert values[3] == (1.0 if evaluator.mode == "keep" else 0.0)  # no positive score


def test_the_cases_are_exercised(setting):
    """The fixture holds what the protocol must handle: a deletion that changes the token
    count on re-tokenisation, a step with k = 0, a repeated k and negative top scores."""
    loaded, _, attribution = setting
    tokenizer = loaded.tokenizer
    ids = tokenizer(TEXTS[0])["input_ids"][1:-1]
    kept = [token for i, token in enumerate(ids) if i != 2]  # ##no (position 3 with [CLS])
    assert len(tokenizer(tokenizer.decode(kept))["input_ids"]) - 2 != len(kept)
    counts = [int(r * 6) for r in np.arange(0.1, 1.1, 0.1)]  # "the film was not good ."
    assert counts[0] == 0 and len(set(counts)) < len(counts)
    assert (attribution.aggregated_BLN[1, 0, 1:7] < 0).any()


def test_the_default_protocol_is_not_ferrets(setting):
    """Without protocol=ferret the numbers are this harness's (ceil, every step, in place)."""
    loaded, batch, attribution = setting
    trace = trace_batch(loaded, batch, set())
    context = EvalContext(trace, None, 0)
    default = Comprehensiveness().configure({}).score(attribution, context)["aggregated"][0]
    _, ferret = scored(loaded, batch, attribution, Comprehensiveness())
    assert not np.allclose(default, ferret)
    assert default[3] != 0.0  # the all-negative example erases its top tokens all the same


def test_protocol_sets_every_switch_and_a_given_switch_wins():
    params = Comprehensiveness().configure({"protocol": "ferret"}).params
    assert params["ratios"] == FERRET_RATIOS
    assert [float(r) for r in FERRET_RATIOS.split("/")] == np.arange(0.1, 1.1, 0.1).tolist()
    assert (params["removal"], params["rationale"], params["rounding"]) == (
        "retokenize",
        "positive",
        "floor",
    )
    assert (params["repeats"], params["empty"]) == ("skip", "skip")
    mixed = Sufficiency().configure({"protocol": "ferret", "removal": "mask"}).params
    assert mixed["removal"] == "mask" and mixed["rounding"] == "floor"
    assert Comprehensiveness().configure({}).params["rounding"] == "ceil"


def test_each_switch_alone_changes_only_its_part(setting):
    """rounding=floor alone: k = int(r * n), every step evaluated (a step with k = 0 erases
    nothing and scores 0); the mean is over all ratios."""
    loaded, batch, attribution = setting
    trace = trace_batch(loaded, batch, set())
    context = EvalContext(trace, None, 0)
    floor = Comprehensiveness().configure({"rounding": "floor", "ratios": "0.1/0.5"})
    ceil = Comprehensiveness().configure({"ratios": "0.5"})
    values = floor.score(attribution, context)["aggregated"][0]
    half = ceil.score(attribution, context)["aggregated"][0]
    # int(0.1 * n) = 0 for n < 10, and int(0.5 * n) = ceil(0.5 * n) for an even n
    rows = [row for row, n in enumerate(batch.lengths) if n - 2 < 10 and n % 2 == 0]
    assert len(rows) >= 2
    for row in rows:
        assert values[row] == pytest.approx(half[row] / 2)


def test_class_based_aopc_is_the_mean_over_classes_of_each_class_explained(setting):
    """ferret's ``aopc_class_compr``: per class c, the explanation of c scored on p(c)."""
    loaded, batch, _ = setting
    method = Saliency().configure({"reduce": "sum"})
    trace = trace_batch(loaded, batch, method.requires)
    context = EvalContext(trace, None, 0, method)
    evaluator = Comprehensiveness().configure({"protocol": "ferret", "classes": "all"})
    values = evaluator.score(method.attribute(trace), context)["aggregated"][0]
    expected = np.zeros(len(batch.examples))
    for c in range(2):  # the method's own target=gold with every label c: another code path
        relabelled = [Example(e.id, e.text, label=c) for e in batch.examples]
        explain_c = Saliency().configure({"reduce": "sum", "target": "gold"})
        relabelled_batch = one_batch(loaded, relabelled)
        rows = explain_c.attribute(trace_batch(loaded, relabelled_batch, Saliency.requires))
        for row, example in enumerate(batch.examples):
            scores = rows.aggregated_BLN[row, 0, : batch.lengths[row]].double().tolist()
            expected[row] += ferret_aopc(
                loaded.model, loaded.tokenizer, example.text, scores, c, keep=False
            )
    np.testing.assert_allclose(values, expected / 2, atol=1e-6)
    single = Comprehensiveness().configure({"protocol": "ferret"})
    assert not np.allclose(values, single.score(method.attribute(trace), context)["aggregated"][0])


def test_loo_tau_with_retokenize_is_ferrets_taucorr_loo(setting):
    """ferret's ``TauLOO_Evaluation``: each token popped, the rest decoded and tokenised again."""
    from scipy.stats import kendalltau

    loaded, batch, attribution = setting
    trace = trace_batch(loaded, batch, set())
    evaluator = LooTau().configure({"removal": "retokenize"})
    values = evaluator.score(attribution, EvalContext(trace, None, 0))["aggregated"][0]
    tokenizer, target = loaded.tokenizer, trace.target_classes_B.tolist()
    for row, example in enumerate(batch.examples):

        def probability(text, row=row):
            with torch.no_grad():
                logits = loaded.model(**tokenizer(text, return_tensors="pt")).logits
            return torch.softmax(logits.double(), -1)[0, target[row]].item()

        ids = tokenizer(example.text)["input_ids"][1:-1]
        loo = [
            probability(example.text) - probability(tokenizer.decode(ids[:j] + ids[j + 1 :]))
            for j in range(len(ids))
        ]
        scores = attribution.aggregated_BLN[row, 0, 1 : batch.lengths[row] - 1].double()
        if len(ids) < 2:
            assert np.isnan(values[row])
            continue
        assert values[row] == pytest.approx(kendalltau(loo, scores.numpy())[0], abs=1e-9)


def test_retokenize_round_trips_single_texts_and_pairs(tiny_model):
    """Erasing nothing gives back the input (pairs stay pairs, for BERT and RoBERTa); erasing a
    word drops it from the text that is tokenised again."""
    loaded = load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)
    items = [
        Example("0", "the film was not good .", text_pair="a truly wonderful story"),
        Example("1", "bad", text_pair="i loved every minute of it"),
    ]
    batch = one_batch(loaded, items)
    nothing = torch.zeros_like(batch.input_ids_BN, dtype=torch.bool)
    inputs = batch.model_inputs()
    again = retokenized(inputs, nothing, batch.special_tokens_mask_BN, loaded.tokenizer)
    for name, tensor in inputs.items():
        torch.testing.assert_close(again[name], tensor)
    erase_first_word = nothing.clone()
    erase_first_word[0, 1] = True  # "the"
    shorter = retokenized(inputs, erase_first_word, batch.special_tokens_mask_BN, loaded.tokenizer)
    expected = loaded.tokenizer("film was not good .", "a truly wonderful story")["input_ids"]
    assert shorter["input_ids"][0, : len(expected)].tolist() == expected


def test_erasing_nothing_runs_no_pass_where_the_round_trip_gives_the_input_back(setting):
    """Sufficiency at 100% of an all-positive ranking keeps every token: no model call where
    decoding and tokenising again gives the same tokens, one where it does not ("the ##re"
    decodes to "there", one token), and the scores are still ferret's."""
    loaded, batch, _ = setting
    row = next(i for i, e in enumerate(batch.examples) if e.text == TEXTS[1])
    ids = batch.input_ids_BN.clone()
    assert loaded.tokenizer.convert_ids_to_tokens(ids[row, 1].item()) == "the"
    ids[row, 2] = loaded.tokenizer.convert_tokens_to_ids("##re")  # "film" -> "##re"
    odd = dataclasses.replace(batch, input_ids_BN=ids)
    N = ids.shape[1]
    scores_BN = (1.0 + torch.arange(N) / N) * odd.attention_mask_BN  # positive, no ties
    positive = Attribution(aggregated_BLN=scores_BN[:, None, :].float())
    trace, values = scored(loaded, odd, positive, Sufficiency())
    assert round_trip_restores(trace).tolist() == [b != row for b in range(len(batch.examples))]
    erased_nothing = {
        b for _, b, mask in trace.shared[CACHE_KEY] if not np.frombuffer(mask, bool).any()
    }
    assert erased_nothing == {row}
    classes = trace.target_classes_B.tolist()
    for b, example in enumerate(odd.examples):
        if b == row:  # its input is not the tokenisation of any text ferret's loop starts from
            continue
        n = odd.lengths[b]
        expected = ferret_aopc(
            loaded.model,
            loaded.tokenizer,
            example.text,
            scores_BN[b, :n].tolist(),
            classes[b],
            True,
        )
        assert values[b] == pytest.approx(expected, abs=1e-6), example.text
