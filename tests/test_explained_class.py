"""The removal evaluators score the class the attributor explained: under ``score=gold`` the
gold class, also where the model predicts the other one (through the API, as a user runs it).

On a two-class model p(gold) = 1 - p(predicted) where the two differ, so with the same scores
(``random`` ignores the target) every drop of p, of the log-odds and of the contrastive score
changes sign there and nowhere else; an evaluator that read the predicted class would not.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES

import attrib_bench
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model

SIGNED = (
    "comprehensiveness",
    "sufficiency",
    "comprehensiveness:protocol=ferret",
    "sufficiency:protocol=ferret",
    "log-odds",
    "loo-tau",
    "soft-comprehensiveness:normalise=false",
    "soft-sufficiency:normalise=false",
)
#: Against the gold label whatever the target.
SAME = ("masked-accuracy",)
LIMIT = 8


def per_example(tiny_bert, target: str, evaluators) -> tuple[list[str], dict]:
    document = attrib_bench.run(
        model=str(tiny_bert),
        limit=LIMIT,
        attributors=["random"],
        evaluators=list(evaluators),
        target=target,
        cache=False,
    )
    random = document.methods["random"]
    return document.example_ids, {name: random.example_scores(name, layer=0) for name in evaluators}


@pytest.fixture(scope="module")
def runs(tiny_bert):
    targets = {
        "predicted": "position=auto,score=predicted",
        "gold": "position=auto,score=gold",
        "contrastive": "position=auto,score=contrastive",
        "contrastive-gold": "position=auto,score=contrastive,class=gold",
    }
    return {key: per_example(tiny_bert, spec, (*SIGNED, *SAME)) for key, spec in targets.items()}


@pytest.fixture(scope="module")
def disagree(tiny_bert, runs):
    """Per example (in the runs' order), True where the gold label is not the prediction."""
    ids, _ = runs["gold"]
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    data = load_examples("default", limit=LIMIT)
    by_id = {e.id: e for e in data.examples}
    texts = [by_id[i].text for i in ids]
    with torch.no_grad():
        logits = loaded.model(**loaded.tokenizer(texts, padding=True, return_tensors="pt")).logits
    labels = torch.tensor([by_id[i].label for i in ids])
    out = (logits.argmax(-1) != labels).numpy()
    assert out.any() and not out.all()  # both kinds of example are there
    return out


@pytest.mark.parametrize("name", SIGNED)
@pytest.mark.parametrize(
    ("run", "against"), [("gold", "predicted"), ("contrastive-gold", "contrastive")]
)
def test_the_gold_class_is_scored_where_it_is_not_the_prediction(
    runs, disagree, name, run, against
):
    gold, predicted = runs[run][1][name], runs[against][1][name]
    sign = np.where(disagree, -1.0, 1.0)
    defined = ~np.isnan(predicted)
    assert defined.sum() >= LIMIT // 2
    np.testing.assert_allclose(
        gold[defined], sign[defined] * predicted[defined], rtol=0, atol=1e-12
    )
    assert np.abs(predicted[disagree & defined]).min() > 1e-9  # the sign flip is visible


@pytest.mark.parametrize("name", SAME)
def test_masked_accuracy_reads_the_gold_label_under_every_target(runs, name):
    values = [runs[key][1][name] for key in runs]
    for other in values[1:]:
        np.testing.assert_array_equal(other, values[0])


def test_comprehensiveness_under_score_gold_by_a_float64_loop(tiny_bert, run_cli, tmp_path):
    """p(gold | x) - p(gold | x with the top ceil(r n) tokens masked), r = 0.5, recomputed from
    the written attributions and the model, one example at a time."""
    target = "position=auto,score=gold"
    common = ["--model", tiny_bert, "--limit", LIMIT, "--attributors", "saliency:reduce=sum"]
    code, _, err = run_cli(
        "attribute", *common, "--target", target, "--output", tmp_path / "rows.jsonl"
    )
    assert code == 0, err
    code, _, err = run_cli(
        "run", *common, "--target", target, "--evaluators", "comprehensiveness:ratios=0.5",
        "--no-cache", "--quiet", "--output", tmp_path / "result.json",
    )  # fmt: skip
    assert code == 0, err
    document = json.loads((tmp_path / "result.json").read_text())
    method = document["methods"]["saliency:reduce=sum"]["per_example"]
    values = method["comprehensiveness:ratios=0.5"]["aggregated"][0]
    ours = dict(zip(document["example_ids"], values, strict=True))
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    tokenizer = loaded.tokenizer
    data = load_examples("default", limit=LIMIT)
    by_id = {e.id: e for e in data.examples}
    records = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    for record in records:
        example = by_id[record["id"]]
        ids = tokenizer(example.text, return_tensors="pt")["input_ids"]
        scores = record["aggregated"][0]
        candidates = list(range(1, len(scores) - 1))  # [CLS] ... [SEP]
        k = -(-len(candidates) // 2)  # ceil(0.5 n)
        top = sorted(candidates, key=lambda j: (-scores[j], j))[:k]
        masked = ids.clone()
        masked[0, top] = tokenizer.mask_token_id
        with torch.no_grad():
            before = torch.softmax(loaded.model(ids).logits.double(), -1)[0, example.label]
            after = torch.softmax(loaded.model(masked).logits.double(), -1)[0, example.label]
        assert ours[record["id"]] == pytest.approx(float(before - after), abs=1e-6)


#: Evaluators of what the method explains; soft erasure is left out (its Bernoulli thresholds
#: can flip on the float noise between two runs of a gradient method).
OWN_TARGET = (
    "comprehensiveness",
    "sufficiency",
    "comprehensiveness:protocol=ferret",
    "log-odds",
    "loo-tau",
)


def test_a_methods_own_target_is_the_class_scored(tiny_bert, disagree):
    """``saliency:target=gold`` under the default (predicted) run target explains the gold
    class, so the removal evaluators score the gold class: the same numbers as ``saliency``
    under ``--target score=gold``, also where the model predicts the other class."""

    def scores(attributor: str, target: str) -> dict:
        document = attrib_bench.run(
            model=str(tiny_bert),
            limit=LIMIT,
            attributors=[attributor],
            evaluators=list(OWN_TARGET),
            target=target,
            cache=False,
        )
        return document.methods[attributor].per_example

    own = scores("saliency:target=gold", "position=auto,score=predicted")
    run = scores("saliency", "position=auto,score=gold")
    for name in OWN_TARGET:
        mine = np.array(own[name]["aggregated"][0], dtype=float)
        theirs = np.array(run[name]["aggregated"][0], dtype=float)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-9, err_msg=name)
