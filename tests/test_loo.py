"""loo-tau: against an explicit loop (one model call per left-out token, scipy's Kendall tau),
the LOO passes shared by every method of a batch, and the conformance kit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, full_trace
from scipy.stats import kendalltau

from attrib_bench import Attribution, EvalContext
from attrib_bench.model.load import load_model
from attrib_bench.testing import check_evaluator
from attrib_bench_plugins.gradient import Saliency
from attrib_bench_plugins.loo import LooTau, loo_drops


def seeded_attribution(trace, seed: int) -> Attribution:
    """Random scores at real tokens, zero at padding: a stand-in method."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(trace.batch.input_ids_BN.shape, generator=generator, dtype=torch.float64)
    scores = scores * trace.batch.attention_mask_BN
    return Attribution(aggregated_BLN=scores[:, None, :].float())


def candidate_count(trace) -> int:
    batch = trace.batch
    return int((batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool()).sum())


def reference_tau(loaded, trace, attribution, removal: str) -> list[float]:
    """Per example, from the definition: for each non-special token j, one model call on the
    example alone with j deleted (or masked), the drop of p(predicted class) in float64, then
    scipy's tau-b against the scores of the same tokens."""
    batch, out = trace.batch, []
    for b in range(len(batch.examples)):
        n = batch.lengths[b]
        ids = batch.input_ids_BN[b, :n]
        special = batch.special_tokens_mask_BN[b, :n].bool()
        with torch.no_grad():
            full = loaded.model(input_ids=ids[None]).logits[0].double().softmax(-1)
        y = int(full.argmax())
        drops, scores = [], []
        for j in range(n):
            if special[j]:
                continue
            if removal == "delete":
                left = torch.cat([ids[:j], ids[j + 1 :]])
            else:
                left = ids.clone()
                left[j] = loaded.tokenizer.mask_token_id
            with torch.no_grad():
                p = loaded.model(input_ids=left[None]).logits[0].double().softmax(-1)[y]
            drops.append(float(full[y] - p))
            scores.append(float(attribution.aggregated_BLN[b, -1, j]))
        if len(scores) < 2 or np.ptp(scores) == 0:
            out.append(float("nan"))
        else:
            out.append(float(kendalltau(scores, drops).statistic))
    return out


@pytest.mark.parametrize("removal", ["delete", "mask"])
def test_loo_tau_matches_a_per_token_loop_with_scipy(tiny_bert, removal):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, examples())
    attribution = seeded_attribution(trace, 0)
    evaluator = LooTau().configure({"removal": removal})
    got = evaluator.score(attribution, EvalContext(trace, None, 0))["aggregated"][0]
    expected = reference_tau(loaded, trace, attribution, removal)
    bad = [e.id for e in trace.batch.examples].index("2")  # "bad": one candidate token
    assert np.isnan(got[bad]) and np.isnan(expected[bad])
    np.testing.assert_allclose(got, expected, atol=1e-9)


def test_loo_passes_run_once_per_batch_however_many_methods(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, examples())
    calls = []
    handle = loaded.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        evaluator = LooTau()
        context = EvalContext(trace, None, 0)
        first = evaluator.score(seeded_attribution(trace, 0), context)["aggregated"]
        after_first = len(calls)
        for seed in (1, 2, 3):
            evaluator.score(seeded_attribution(trace, seed), context)
        # A second evaluator instance (another removal) computes its own, once.
        LooTau().configure({"removal": "mask"}).score(seeded_attribution(trace, 4), context)
        LooTau().configure({"removal": "mask"}).score(seeded_attribution(trace, 5), context)
    finally:
        handle.remove()
    # The 48 single-token variants of this batch run in passes of one length each (deleting a
    # token shortens its example by one: a pass per distinct example length), in place under
    # [MASK] (one pass of 8192 tokens).
    assert candidate_count(trace) == 48
    assert after_first == len(set(trace.batch.attention_mask_BN.sum(dim=1).tolist()))
    assert len(calls) == after_first + 1
    # The same method scored again gives the same value (read from the memo).
    again = evaluator.score(seeded_attribution(trace, 0), context)["aggregated"]
    np.testing.assert_array_equal(first, again)


def test_chunking_splits_the_passes_without_changing_the_scores(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    attribution_trace = full_trace(loaded, examples())
    attribution = seeded_attribution(attribution_trace, 0)
    trace = full_trace(loaded, examples())
    calls = []
    handle = loaded.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        whole = LooTau().score(attribution, EvalContext(attribution_trace, None, 0))["aggregated"]
        passes = len(calls)
        tokens = 5 * trace.batch.input_ids_BN.shape[1]  # 5 variants in place, more packed
        small = LooTau().configure({"removal": "mask", "chunk_tokens": str(tokens)})
        small.score(attribution, EvalContext(trace, None, 0))
        assert len(calls) - passes == -(-candidate_count(trace) // 5)
        small = LooTau().configure({"chunk_tokens": str(tokens)})
        chunked = small.score(attribution, EvalContext(trace, None, 0))["aggregated"]
    finally:
        handle.remove()
    assert len(calls) - passes - 10 > passes  # packed: more passes than with the whole budget
    np.testing.assert_allclose(chunked, whole, atol=1e-6)


def test_a_method_that_ranks_as_leave_one_out_scores_tau_one(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, examples())
    evaluator = LooTau()
    context = EvalContext(trace, None, 0)
    evaluator.score(seeded_attribution(trace, 0), context)
    erased = trace.shared["loo.erased/delete"]
    drops = np.nan_to_num(loo_drops(trace, erased, (trace.target_classes_B, None)))
    perfect = Attribution(aggregated_BLN=torch.tensor(drops)[:, None, :].float())
    reversed_ = Attribution(aggregated_BLN=-perfect.aggregated_BLN)
    tau = evaluator.score(perfect, context)["aggregated"][0]
    anti = evaluator.score(reversed_, context)["aggregated"][0]
    defined = ~np.isnan(tau)
    np.testing.assert_allclose(tau[defined], 1.0)
    np.testing.assert_allclose(anti[defined], -1.0)


@pytest.mark.parametrize("attributor", [None, Saliency()], ids=["kit-default", "saliency"])
def test_conformance(attributor):
    check_evaluator(LooTau(), attributor=attributor)


def test_a_cli_run_scores_loo_and_the_soft_metrics(run_cli, tiny_bert, tmp_path):
    output = tmp_path / "result.json"
    evaluators = "loo-tau,soft-comprehensiveness,soft-sufficiency:normalise=false"
    code, _, err = run_cli(
        *("run", "--model", tiny_bert, "--attributors", "saliency,attention"),
        *("--evaluators", evaluators, "--limit", "4", "--quiet", "--output", output),
    )
    assert code == 0, err
    document = json.loads(output.read_text())
    assert set(document["evaluators"]) == set(evaluators.split(","))
    assert all(e["status"] == "ok" for e in document["evaluators"].values())
    tau = document["methods"]["saliency"]["per_example"]["loo-tau"]["aggregated"][0]
    assert len(tau) == 4 and all(t is None or -1 <= t <= 1 for t in tau)
