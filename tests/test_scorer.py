"""``scorer=DIR`` on the removal evaluators (in-distribution removal): which model scores, the
erasure cache kept apart per scorer, the provenance, and a scorer that cannot score."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, one_batch

import attrib_bench
from attrib_bench import Attribution, EvalContext, UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.scorer import SCORER_PREFIX
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.erasure import CACHE_KEY
from attrib_bench_plugins.faithfulness import (
    Comprehensiveness,
    Deletion,
    Insertion,
    LogOdds,
    MaskedAccuracy,
    Sufficiency,
)
from attrib_bench_plugins.loo import LooTau

EVALUATORS = [
    (Comprehensiveness, {}),
    (Comprehensiveness, {"normalise": "naopc", "ratios": "0.3/0.6"}),
    (Comprehensiveness, {"normalise": "naopc", "exact_cap": "3", "ratios": "0.3/0.6"}),  # beam
    (Sufficiency, {}),
    (Deletion, {}),
    (Insertion, {"removal": "delete"}),
    (LogOdds, {}),
    (MaskedAccuracy, {"mode": "keep"}),
    (LooTau, {}),
]
TEXTS = ["the film was not good .", "bad", "a truly wonderful and moving story"]


@pytest.fixture(scope="module")
def scorers(tiny_bert, tmp_path_factory) -> dict[str, str]:
    """``same``: a copy of the run's model; ``other``: its classifier negated and embeddings
    scaled, same tokenizer;
    ``foreign``: another vocabulary (one token added)."""
    root = tmp_path_factory.mktemp("scorers")
    same = root / "same"
    shutil.copytree(tiny_bert, same)
    other = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    with torch.no_grad():
        for parameter in other.model.classifier.parameters():
            parameter.neg_()  # the classes swapped: every prediction changes
        other.model.bert.embeddings.word_embeddings.weight.mul_(1.5)
    other.model.save_pretrained(root / "other")
    other.tokenizer.save_pretrained(root / "other")
    foreign = root / "foreign"
    shutil.copytree(tiny_bert, foreign)
    other.tokenizer.add_tokens(["zzunseenzz"])
    other.tokenizer.save_pretrained(foreign)
    return {"same": str(same), "other": str(root / "other"), "foreign": str(foreign)}


def _setup(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples(TEXTS)), frozenset())
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(trace.batch.input_ids_BN.shape, generator=generator, dtype=torch.float64)
    return trace, Attribution(aggregated_BLN=scores[:, None].float())


def _score(cls, params: dict, trace, attribution, scorer: str = "") -> np.ndarray:
    evaluator = cls().configure({**params, **({"scorer": scorer} if scorer else {})})
    context = EvalContext(trace, None, 0)
    if hasattr(evaluator, "plan"):
        evaluator.plan(attribution, context)
    return evaluator.score(attribution, context)["aggregated"]


@pytest.mark.parametrize(("cls", "params"), EVALUATORS)
def test_the_scorer_scores_and_scorers_never_mix(tiny_bert, scorers, cls, params):
    """On one trace: the run's model, then the other scorer, then a copy of the run's model,
    then the run's model again; each equals the same evaluator on a fresh trace."""
    trace, attribution = _setup(tiny_bert)
    own = _score(cls, params, trace, attribution)
    other = _score(cls, params, trace, attribution, scorers["other"])
    same = _score(cls, params, trace, attribution, scorers["same"])
    again = _score(cls, params, trace, attribution)
    np.testing.assert_array_equal(same, own)  # a copy of the model: its numbers, bit for bit
    np.testing.assert_array_equal(again, own)
    assert not np.allclose(other, own, equal_nan=True)
    fresh, fresh_attribution = _setup(tiny_bert)
    alone = _score(cls, params, fresh, fresh_attribution, scorers["other"])
    np.testing.assert_array_equal(other, alone)  # the shared trace's caches did not leak
    namespaces = [key for key in trace.shared if key.startswith(SCORER_PREFIX)]
    assert len(namespaces) == 2  # the other scorer's and the copy's, beside the model's own
    assert all(CACHE_KEY in trace.shared[key] for key in namespaces) or cls is LooTau


def test_comprehensiveness_with_a_scorer_is_the_scorers_drop(tiny_bert, scorers):
    """f(x) - f(x without its top half), both by the scorer, at ratios=0.5 (float64 from the
    scorer's own logits); the ranking is the method's on the run's model."""
    trace, attribution = _setup(tiny_bert)
    got = _score(Comprehensiveness, {"ratios": "0.5"}, trace, attribution, scorers["other"])[0]
    scorer = load_model(scorers["other"], "cpu", architectures=ARCHITECTURES)
    batch = trace.batch
    classes = trace.target_classes_B  # the run's model's prediction, what the method explains
    for b in range(len(TEXTS)):
        candidates = (batch.attention_mask_BN[b] & ~batch.special_tokens_mask_BN[b].bool()).bool()
        positions = torch.nonzero(candidates).flatten()
        k = math.ceil(0.5 * len(positions))
        scores = attribution.aggregated_BLN[b, 0, positions].double()
        top = positions[torch.argsort(-scores, stable=True)[:k]]
        ids = batch.input_ids_BN[b : b + 1].clone()
        masked = ids.clone()
        masked[0, top] = scorer.tokenizer.mask_token_id
        mask = batch.attention_mask_BN[b : b + 1]
        with torch.no_grad():
            before = scorer.model(input_ids=ids, attention_mask=mask).logits.double()
            after = scorer.model(input_ids=masked, attention_mask=mask).logits.double()
        c = int(classes[b])
        expected = float(before.softmax(-1)[0, c] - after.softmax(-1)[0, c])
        assert got[b] == pytest.approx(expected, abs=1e-6)


def test_a_scorer_with_another_tokenizer_is_one_line(tiny_bert, scorers):
    trace, attribution = _setup(tiny_bert)
    with pytest.raises(UsageError) as raised:
        _score(Comprehensiveness, {}, trace, attribution, scorers["foreign"])
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"comprehensiveness:scorer={scorers['foreign']} has another")
    assert "--masking" in message


def test_a_scorer_that_is_no_directory_is_refused_when_configured(tmp_path):
    with pytest.raises(UsageError, match=r"deletion:scorer=\S+ is not a model directory"):
        Deletion().configure({"scorer": str(tmp_path / "missing")})


def test_a_run_names_the_scorer_in_its_provenance_and_a_bad_one_fails_alone(tiny_bert, scorers):
    result = attrib_bench.run(
        model=str(tiny_bert),
        dataset="default",
        limit=3,
        attributors=["saliency"],
        evaluators=[
            f"comprehensiveness:scorer={scorers['same']}",
            f"sufficiency:scorer={scorers['foreign']}",
            "deletion",
        ],
        cache=False,
    )
    scorers_seen = result.provenance["scorers"]
    same = load_model(scorers["same"], "cpu", architectures=ARCHITECTURES)
    assert scorers_seen[f"comprehensiveness:scorer={scorers['same']}"]["weights_sha256"] == (
        same.weights_sha256
    )
    assert "deletion" not in scorers_seen
    assert result.evaluators[f"comprehensiveness:scorer={scorers['same']}"]["status"] == "ok"
    failed = result.evaluators[f"sufficiency:scorer={scorers['foreign']}"]
    assert failed["status"] == "failed" and "another tokenizer" in failed["error"]
    assert result.evaluators["deletion"]["status"] == "ok"
