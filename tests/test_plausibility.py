"""Plausibility: ERASER metrics by hand, word alignment, ERASER loaders, truncation losses."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA
from helpers import ARCHITECTURES, one_batch

from attrib_bench import Attribution, EvalContext
from attrib_bench.core.errors import UsageError
from attrib_bench.core.interfaces import Example
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.data.rationales import (
    rationale_words_lost,
    token_word_ids,
    word_scores,
)
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench_plugins.plausibility import (
    Auprc,
    IouF1,
    TokenF1,
    auprc,
    iou_prf,
    spans,
    token_prf,
    top_k_words,
)

# ------------------------------------------------------------------------- metrics by hand


def test_auprc_by_hand():
    # Ranked: 1 (pos), 2 (neg), 3 (pos), 4 (neg). Points (recall, precision) from the top:
    # (0, 1) (0.5, 1) (0.5, 0.5) (1, 2/3) (1, 0.5); trapezoids: 0.5 * 1 + 0.5 * (0.5 + 2/3) / 2
    truth = np.array([1, 0, 1, 0], dtype=bool)
    assert auprc(truth, np.array([0.9, 0.8, 0.7, 0.1])) == pytest.approx(19 / 24)
    # A tie forms one threshold: scores [1, 1, 0] with truth [1, 0, 1] give the points
    # (0, 1) (0.5, 0.5) (1, 2/3): 0.5 * 0.75 + 0.5 * (0.5 + 2/3) / 2
    assert auprc(np.array([1, 0, 1], bool), np.array([1.0, 1.0, 0.0])) == pytest.approx(
        0.375 + 7 / 24
    )
    assert auprc(np.array([1, 1, 0], bool), np.array([0.9, 0.8, 0.1])) == pytest.approx(1.0)
    assert math.isnan(auprc(np.zeros(3, bool), np.array([0.1, 0.2, 0.3])))


def test_auprc_matches_sklearn_as_eraser_computes_it():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(20):
        truth = rng.random(12) < 0.4
        truth[0] = True
        scores = rng.integers(0, 5, 12).astype(float)  # many ties
        precision, recall, _ = metrics.precision_recall_curve(truth, scores)
        assert auprc(truth, scores) == pytest.approx(metrics.auc(recall, precision))


def test_token_f1_by_hand():
    truth = np.array([1, 1, 0, 0, 1], dtype=bool)
    predicted = np.array([1, 0, 1, 0, 1], dtype=bool)
    assert token_prf(truth, predicted) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    assert token_prf(truth, np.zeros(5, bool)) == (0.0, 0.0, 0.0)


def test_iou_f1_by_hand():
    truth = np.zeros(10, bool)
    truth[[0, 1, 2, 5, 6]] = True  # spans [0, 3) and [5, 7)
    predicted = np.zeros(10, bool)
    predicted[[1, 2, 4, 5, 8]] = True  # spans [1, 3) [4, 6) [8, 9)
    assert spans(predicted) == [(1, 3), (4, 6), (8, 9)]
    # [1, 3) vs [0, 3): IOU 2/3, a hit; [4, 6) vs [5, 7): 1/3; [8, 9): 0.
    precision, recall, f1 = iou_prf(truth, predicted)
    assert (precision, recall) == pytest.approx((1 / 3, 1 / 2))
    assert f1 == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    # Exactly 0.5 counts (ERASER thresholds with >=): [0, 2) against [0, 4).
    assert iou_prf(np.array([1, 1, 1, 1], bool), np.array([1, 1, 0, 0], bool))[0] == 1.0


def eraser_macro_iou_f1(instances, threshold=0.5):
    """ERASER's ``partial_match_score`` (macro), transcribed on spans as sets of positions.

    Per instance: a predicted span is a hit when its best IOU with a true span reaches the
    threshold; precision = hits / predicted spans, recall = hits / true spans. Then the F1 of
    the mean precision and the mean recall.
    """
    precisions, recalls = [], []
    for true_spans, predicted_spans in instances:
        hits = 0
        for p in predicted_spans:
            ious = [len(p & t) / len(p | t) for t in true_spans]
            hits += max(ious, default=0.0) >= threshold
        precisions.append(hits / len(predicted_spans))
        recalls.append(hits / len(true_spans))
    p, r = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    return 0.0 if p == 0 or r == 0 else 2 * p * r / (p + r)


def runs(mask) -> list[set[int]]:
    """The maximal runs of True, each as the set of its positions."""
    out, position = [], 0
    for value, group in itertools.groupby(mask.tolist()):
        size = len(list(group))
        if value:
            out.append(set(range(position, position + size)))
        position += size
    return out


def test_iou_f1_is_erasers_macro_f1_and_instance_f1_the_mean_of_per_example_f1():
    rng = np.random.default_rng(0)
    evaluator, instance = IouF1(), IouF1().configure({"part": "instance-f1"})
    parts, per_example, instances = [], [], []
    for _ in range(40):
        n = int(rng.integers(4, 25))
        truth = rng.random(n) < 0.35
        truth[rng.integers(n)] = True
        scores = rng.integers(0, 4, n) + truth * rng.random(n)  # ties and some signal
        score, precision, recall = evaluator.metrics(truth, scores)
        parts.append((precision, recall))
        per_example.append(score)
        assert instance.metrics(truth, scores) == (score,)
        instances.append((runs(truth), runs(top_k_words(scores, int(truth.sum())))))
    expected = eraser_macro_iou_f1(instances)
    assert evaluator.parts == ("precision", "recall") and instance.parts == ()
    assert evaluator.aggregate(np.array(parts)) == pytest.approx(expected, abs=1e-12)
    assert abs(np.mean(per_example) - expected) > 0.005  # the two definitions differ here


def test_top_k_breaks_ties_by_position():
    assert np.flatnonzero(top_k_words(np.array([0.2, 0.5, 0.5, 0.5]), 2)).tolist() == [1, 2]


# --------------------------------------------------------------------------- word alignment


def test_token_word_ids_from_offsets_by_hand():
    text = "the dog's  bark"  # whitespace words: the, dog's, bark
    # [CLS] the dog ' s bark [SEP] pad, with a RoBERTa-style leading space on "bark"
    offsets = [(0, 0), (0, 3), (4, 7), (7, 8), (8, 9), (10, 15), (0, 0), (0, 0)]
    sequences = [None, 0, 0, 0, 0, 0, None, None]
    assert token_word_ids(text, offsets, sequences) == [-1, 0, 1, 1, 1, 2, -1, -1]
    # The second text of a pair never maps to a word of the first.
    assert token_word_ids("a b", [(0, 1), (0, 1)], [0, 1]) == [0, -1]


def test_word_scores_sum_or_max_by_hand():
    token_scores = np.array([9.0, 1.0, 2.0, 3.0, 4.0, 9.0])
    word_ids = np.array([-1, 0, 1, 1, 3, -1])  # word 2 was truncated away
    pooled, visible = word_scores(token_scores, word_ids, 4)
    assert pooled.tolist() == [1.0, 5.0, 0.0, 4.0] and visible.tolist() == [1, 1, 0, 1]
    pooled, _ = word_scores(token_scores, word_ids, 4, pool="max")
    assert pooled.tolist() == [1.0, 3.0, 0.0, 4.0]


def test_batches_carry_word_ids_and_rationale_losses(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    text = "unbelievably good w1 w2 w3 w4 w5 w6 terrible ending"
    items = [
        Example("0", text, rationale=(0, 1, 0, 0, 0, 0, 0, 0, 1, 1)),
        Example("1", "fine", "second text", rationale=(1,)),
    ]
    batches, truncated = make_batches(items, loaded.tokenizer, 2, 12)
    batch = batches[0]
    row = [e.id for e in batch.examples].index("0")
    words = batch.word_ids_BN[row][batch.attention_mask_BN[row].bool()].tolist()
    tokens = batch.tokens[row]
    assert tokens[0] == "[CLS]" and words[0] == -1 and words[-1] == -1
    # every word piece maps to its whitespace word, in order, the text cut after 12 tokens
    inside = [word for word in words if word >= 0]
    assert inside == sorted(inside) and inside[0] == 0
    seen = set(words)
    assert truncated == 1 and 8 not in seen and 9 not in seen
    pair = 1 - row
    assert set(batch.word_ids_BN[pair].tolist()) == {-1, 0}  # "second text" is not a word
    assert rationale_words_lost(batches) == pytest.approx(2 / 4)


# ------------------------------------------------------------------------------ ERASER data


def test_eraser_folders_load_with_labels_and_rationale_masks():
    for name, classes in (("eraser_movies", ("NEG", "POS")), ("hatexplain_eraser", None)):
        folder = SHARED_DATA / name
        if not folder.is_dir():
            pytest.skip(f"{folder} is not available")
        data = load_examples(str(folder), limit=20)
        assert data.split == "val" and len(data.examples) == 20
        lines = (folder / "val.jsonl").read_text().splitlines()[:20]
        for example, line in zip(data.examples, lines, strict=True):
            annotation = json.loads(line)
            words = example.text.split()
            assert len(example.rationale) == len(words)
            label_names = classes or ("non-toxic", "toxic")
            assert label_names[example.label] == annotation["classification"]
            for group in annotation["evidences"]:
                for span in group:
                    assert " ".join(words[span["start_token"] : span["end_token"]]) == span["text"]
                    assert all(example.rationale[span["start_token"] : span["end_token"]])
        test = load_examples(str(folder), split="test", limit=2)
        assert test.split == "test" and test.fingerprint != data.fingerprint


def test_a_handmade_eraser_folder(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "d1").write_text("a great\nfilm .\n")
    annotation = {
        "annotation_id": "d1",
        "classification": "POS",
        "evidences": [[{"docid": "d1", "start_token": 1, "end_token": 3, "text": "great film"}]],
    }
    negative = {"annotation_id": "d2", "classification": "NEG", "evidences": [[]], "docids": ["d1"]}
    (tmp_path / "val.jsonl").write_text(json.dumps(annotation) + "\n" + json.dumps(negative))
    data = load_examples(str(tmp_path))
    first, second = data.examples
    assert first.text == "a great film ." and first.label == 1 and first.rationale == (0, 1, 1, 0)
    assert second.label == 0 and second.rationale == (0, 0, 0, 0)


# ------------------------------------------------------------------------------ evaluators


def rationale_trace(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    items = [
        Example("0", "the plot was awful and boring", rationale=(0, 0, 0, 1, 0, 1)),
        Example("1", "a calm evening", rationale=(0, 0, 0)),  # nothing to find: NaN
        Example("2", "unbelievably dull", rationale=(1, 1)),
    ]
    return trace_batch(loaded, one_batch(loaded, items), set())


def test_evaluators_on_a_batch_with_known_answers(tiny_bert):
    trace = rationale_trace(tiny_bert)
    batch = trace.batch
    # Score each token 1 when its word is a rationale word, plus a small decreasing tie-breaker.
    scores = torch.zeros(batch.input_ids_BN.shape, dtype=torch.float64)
    for row, example in enumerate(batch.examples):
        for position, word in enumerate(batch.word_ids_BN[row].tolist()):
            if word >= 0:
                scores[row, position] = example.rationale[word] + 0.01 / (1 + position)
    perfect = Attribution(aggregated_BLN=scores[:, None, :])
    context = EvalContext(trace, None, 0)
    ids = [e.id for e in batch.examples]
    for evaluator in (TokenF1(), IouF1(), Auprc()):
        result = evaluator.score(perfect, context)["aggregated"][0]
        assert math.isnan(result[ids.index("1")])
        assert result[ids.index("0")] == pytest.approx(1.0) == result[ids.index("2")]
    # Reversed scores put the rationale last: no overlap in the top-k.
    worst = TokenF1().score(Attribution(aggregated_BLN=-scores[:, None, :]), context)
    assert worst["aggregated"][0][ids.index("0")] == 0.0
    recall = IouF1().configure({"part": "recall", "k_ratio": "1"}).score(perfect, context)
    assert recall["aggregated"][0][ids.index("0")] == 0.0  # every word: one span, IOU 1/6


def test_iou_f1_returns_the_parts_of_its_corpus_statistic(tiny_bert):
    trace = rationale_trace(tiny_bert)
    ids = [e.id for e in trace.batch.examples]
    generator = torch.Generator().manual_seed(0)
    rows = torch.rand(3, 1, trace.batch.input_ids_BN.shape[1], generator=generator)
    scores, context = Attribution(aggregated_BLN=rows), EvalContext(trace, None, 0)
    result = IouF1().score(scores, context)
    assert set(result) == {"aggregated", "aggregated/precision", "aggregated/recall"}
    for key, values in result.items():
        assert values.shape == (1, 3) and math.isnan(values[0, ids.index("1")]), key
    for part in ("precision", "recall", "instance-f1"):
        alone = IouF1().configure({"part": part}).score(scores, context)
        assert set(alone) == {"aggregated"}
        key = "aggregated" if part == "instance-f1" else f"aggregated/{part}"
        np.testing.assert_array_equal(alone["aggregated"], result[key])


def test_iou_f1_in_a_run_is_erasers_macro_f1(tiny_bert, run_cli, tmp_path):
    folder = SHARED_DATA / "hatexplain_eraser"
    if not folder.is_dir():
        pytest.skip(f"{folder} is not available")
    output = tmp_path / "result.json"
    evaluators = "iou-f1,iou-f1:part=precision,iou-f1:part=recall"
    code, _, err = run_cli(
        "run", "--model", tiny_bert, "--dataset", folder, "--limit", "16", "--max-length", "24",
        "--attributors", "random", "--evaluators", evaluators, "--quiet", "--output", output,
    )  # fmt: skip
    assert code == 0, err
    method = json.loads(output.read_text())["methods"]["random"]
    precision, recall, instance = (
        np.nanmean(np.array(method["per_example"][name]["aggregated"][0], dtype=float))
        for name in ("iou-f1:part=precision", "iou-f1:part=recall", "iou-f1")
    )
    macro = 2 * precision * recall / (precision + recall)
    assert abs(instance - macro) > 1e-3  # the mean of per-example F1 would not pass
    assert method["scores"]["iou-f1"]["aggregated"][0]["mean"] == pytest.approx(macro)


def test_no_rationales_is_an_evaluator_error(tiny_bert):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, [Example("0", "no rationale here")]), set())
    with pytest.raises(UsageError, match="no word rationales"):
        Auprc().score(Attribution(aggregated_BLN=torch.rand(1, 1, 5)), EvalContext(trace, None, 0))


def test_plausibility_run_on_hatexplain(tiny_bert, run_cli, tmp_path):
    folder = SHARED_DATA / "hatexplain_eraser"
    if not folder.is_dir():
        pytest.skip(f"{folder} is not available")
    output = tmp_path / "result.json"
    code, out, err = run_cli(
        "run",
        "--model",
        tiny_bert,
        "--dataset",
        folder,
        "--limit",
        "8",
        "--max-length",
        "24",
        "--attributors",
        "attention,saliency",
        "--evaluators",
        "token-f1,iou-f1:part=recall,auprc:pool=max",
        "--quiet",
        "--output",
        output,
    )
    assert code == 0, err
    document = json.loads(output.read_text())
    assert "token-f1 (aggregated)" in out  # no "vs saliency": it needs no reference
    lost = document["provenance"]["dataset"]["rationale_words_lost"]
    assert 0.0 < lost < 1.0 and "rationale words" in err
    for spec in ("attention", "saliency", "random"):
        summary = document["methods"][spec]["scores"]["auprc:pool=max"]["aggregated"]
        assert len(summary) == 1 and summary[0]["n"] + summary[0]["nan"] == 8
        assert summary[0]["n"] > 0
