"""Segment attribution (``attrib-bench context``): the answer's log-probability against the
model's own logits in float64; leave-one-segment-out through the key-value cache equal to
running each ablated prompt whole; ContextCite recovering a linear score; the evaluators by
hand; the ERASER sentences; bad input as one line naming the example."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA
from helpers import ARCHITECTURES, save_tiny_decoder

from attrib_bench.api import list_plugins
from attrib_bench.core.errors import UsageError
from attrib_bench.core.registry import load_registry
from attrib_bench.model.load import load_model
from attrib_bench.segments.data import ERASER_QUERY, SegmentExample, load_segments, split_context
from attrib_bench.segments.scorer import SegmentScorer
from attrib_bench_plugins.segments import (
    ContextCite,
    EvidenceAuprc,
    LeaveOneSegmentOut,
    LinearDatamodelingScore,
    TokenGradients,
    TopKDrop,
    random_masks,
)

TEMPLATE = "{context}\n{query}"
EXAMPLE = SegmentExample(
    "cat",
    ("the cat sat on the mat.", "a dog ran.", "mary gave a drink to john.", "the store"),
    "who sat?",
    " the cat",
    evidence=(1, 0, 0, 0),
)


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def decoder64(request, tmp_path_factory):
    directory = save_tiny_decoder(tmp_path_factory.mktemp(request.param), request.param)
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def test_answer_log_probs_equal_the_models_logits(decoder64):
    scorer = SegmentScorer(decoder64, EXAMPLE, TEMPLATE)
    ids = scorer.ids()
    with torch.no_grad():
        logits = decoder64.model(torch.tensor([ids])).logits[0]
    T = len(scorer.answer_ids)
    expected = [
        torch.log_softmax(logits[len(ids) - T - 1 + t], -1)[scorer.answer_ids[t]].item()
        for t in range(T)
    ]
    steps = scorer.steps(np.ones((1, 4), dtype=bool))[0]
    # LLaMA's RMSNorm normalises in float32 even in a float64 model: agreement to ~1e-10.
    np.testing.assert_allclose(steps, expected, rtol=1e-8)
    # An ablated prompt is the template over the kept segments, tokenised whole.
    keep = [True, False, True, False]
    ablated = decoder64.tokenizer(TEMPLATE.format(context=EXAMPLE.context(keep), query="who sat?"))
    assert scorer.ids(keep) == ablated["input_ids"] + scorer.answer_ids


@pytest.mark.parametrize("separator", [" ", "", "\n"])
def test_cached_leave_one_out_equals_running_each_ablation_whole(decoder64, separator):
    example = SegmentExample(
        "e", EXAMPLE.segments, EXAMPLE.query, EXAMPLE.answer, separator=separator
    )
    naive = SegmentScorer(decoder64, example, TEMPLATE).leave_one_out(cached=False)
    cached_scorer = SegmentScorer(decoder64, example, TEMPLATE)
    cached = cached_scorer.leave_one_out(cached=True)
    np.testing.assert_allclose(cached, naive, rtol=0, atol=1e-12)
    assert cached.shape == (4, len(cached_scorer.answer_ids))
    # Only the suffixes ran after the one full pass: fewer tokens than four whole prompts.
    whole = sum(len(cached_scorer.ids(~np.eye(4, dtype=bool)[s])) for s in range(4))
    assert cached_scorer.forward_tokens < len(cached_scorer.ids()) + whole


def _close(loaded, actual, expected) -> None:
    """Equal to float64 rounding; for LLaMA, whose RMSNorm computes in float32 even in a float64
    model, to float32 rounding of the largest value."""
    llama = loaded.model.config.model_type == "llama"
    atol = 1e-6 * np.abs(expected).max() if llama else 1e-12
    np.testing.assert_allclose(actual, expected, rtol=0 if llama else 1e-8, atol=atol)


def _segment_sums(scorer: SegmentScorer, tokens_N: np.ndarray) -> np.ndarray:
    owner = scorer.token_segments
    return np.array([tokens_N[: len(owner)][owner == s].sum() for s in range(scorer.count)])


def test_per_step_input_x_gradient_is_autograd_of_each_step(decoder64):
    """Row t: x times the gradient of log p(a_t | prefix) from its own forward pass through the
    model's logits (float64), summed over the hidden size and over the segment's tokens; and,
    kept apart, over each of the answer's earlier tokens (the prefix)."""
    example = replace(EXAMPLE, answer=" the cat sat")
    scorer = SegmentScorer(decoder64, example, TEMPLATE)
    T, P = len(scorer.answer_ids), len(scorer.prompt_ids)
    assert T == 3
    ids = torch.tensor([scorer.ids()])
    N = ids.shape[1]
    expected, prefix = [], []
    for t in range(T):
        embeddings = decoder64.model.get_input_embeddings()(ids).detach().requires_grad_()
        with decoder64.fast_attention():  # the same kernels: LLaMA's RMSNorm rounds to float32
            logits = decoder64.model(inputs_embeds=embeddings).logits[0, N - T - 1 + t]
        log_p = torch.log_softmax(logits, -1)[scorer.answer_ids[t]]
        (grad,) = torch.autograd.grad(log_p, embeddings)
        tokens = (grad * embeddings)[0].sum(-1).detach().numpy()
        expected.append(_segment_sums(scorer, tokens))
        prefix.append(tokens[P : P + T - 1])
    method = TokenGradients("input-x-gradient", "InputXGradient")
    steps = method.attribute_steps(scorer)
    _close(decoder64, steps.segments_TS, np.array(expected))
    _close(decoder64, steps.prefix_TP, np.array(prefix))
    assert (steps.prefix_TP[np.triu_indices(T, 0, T - 1)] == 0).all()  # never a later token
    _close(decoder64, steps.segments_TS.sum(0), method.attribute_segments(scorer))


def test_per_step_integrated_gradients_is_captums_per_step(decoder64):
    """Row t equals Captum's IG with ``target=t`` on the per-step log-probabilities (one
    forward per chunk of path points instead of one per step); the rows sum to the summed row."""
    from captum.attr import IntegratedGradients

    scorer = SegmentScorer(decoder64, EXAMPLE, TEMPLATE)
    method = TokenGradients("integrated-gradients", "IntegratedGradients").configure(
        {"steps": "7", "internal_batch_size": "3"}
    )
    ids = torch.tensor([scorer.ids()])
    embeddings = decoder64.model.get_input_embeddings()(ids).detach()
    captum = IntegratedGradients(scorer.steps_from_embeddings)
    expected = [
        _segment_sums(
            scorer,
            captum.attribute(embeddings, target=t, n_steps=7, internal_batch_size=3)[0]
            .sum(-1)
            .numpy(),
        )
        for t in range(len(scorer.answer_ids))
    ]
    steps_TS = method.attribute_steps(scorer).segments_TS
    _close(decoder64, steps_TS, np.array(expected))
    _close(decoder64, steps_TS.sum(0), method.attribute_segments(scorer))


def test_token_methods_sum_each_steps_row_over_the_segments(decoder64):
    """A registered token attributor as a segment method: step t explains the logit of a_t
    after the prompt and a_<t (the run's ``position=last,score=gold``); ``saliency:reduce=sum``
    there is x times the gradient of that logit, from its own float64 pass, summed per segment
    and over a_<t (the prefix); the scores are the steps' sum."""
    from attrib_bench.segments.token_methods import TokenMethodSegments

    example = replace(EXAMPLE, answer=" the cat sat")
    scorer = SegmentScorer(decoder64, example, TEMPLATE)
    T, P = len(scorer.answer_ids), len(scorer.prompt_ids)
    full = scorer.ids()
    expected, prefix = [], []
    for t in range(T):
        ids = torch.tensor([full[: P + t]])
        embeddings = decoder64.model.get_input_embeddings()(ids).detach().requires_grad_()
        with decoder64.fast_attention():
            logit = decoder64.model(inputs_embeds=embeddings).logits[0, -1, full[P + t]]
        (grad,) = torch.autograd.grad(logit, embeddings)
        tokens = (grad * embeddings)[0].sum(-1).detach().numpy()
        expected.append(_segment_sums(scorer, tokens))
        prefix.append(np.pad(tokens[P:], (0, T - 1 - t)))
    registry = load_registry()
    method = TokenMethodSegments(
        "saliency:reduce=sum",
        registry.attributor("saliency:reduce=sum"),
        registry.trace_field_specs(),
    )
    steps = method.attribute_steps(scorer)
    _close(decoder64, steps.segments_TS, np.array(expected))
    _close(decoder64, steps.prefix_TP, np.array(prefix))
    _close(decoder64, method.attribute_segments(scorer), np.array(expected).sum(0))


def test_per_step_leave_one_out_is_each_steps_drop(decoder64):
    scorer = SegmentScorer(decoder64, EXAMPLE, TEMPLATE)
    full_T = scorer.steps(np.ones((1, 4), dtype=bool))[0]
    naive_ST = SegmentScorer(decoder64, EXAMPLE, TEMPLATE).steps(~np.eye(4, dtype=bool))
    steps_TS = LeaveOneSegmentOut().attribute_steps(scorer)
    np.testing.assert_allclose(steps_TS, (full_T - naive_ST).T, atol=1e-12)
    np.testing.assert_allclose(
        steps_TS.sum(0), LeaveOneSegmentOut().attribute_segments(scorer), atol=1e-12
    )


def test_token_segments_own_each_segments_words(decoder64):
    scorer = SegmentScorer(decoder64, EXAMPLE, TEMPLATE)
    tokens = decoder64.tokenizer.convert_ids_to_tokens(scorer.prompt_ids)
    for s, segment in enumerate(EXAMPLE.segments):
        owned = [t for t, owner in zip(tokens, scorer.token_segments, strict=True) if owner == s]
        text = decoder64.tokenizer.convert_tokens_to_string(owned)
        assert text.strip() == segment
    assert scorer.token_segments[-3:].tolist() == [-1, -1, -1]  # the query's tokens


class LinearScorer:
    """A scorer whose answer log-probability is exactly ``bias + masks @ weights``."""

    def __init__(self, weights, bias=-2.0, evidence=None):
        self.weights, self.bias = np.asarray(weights, dtype=float), bias
        self.count = len(self.weights)
        self.answer_ids = [1, 2]
        self.example = SegmentExample("lin", ("x",) * self.count, "q", " a", evidence)

    def scores(self, masks_MS):
        return self.bias + np.asarray(masks_MS, dtype=float) @ self.weights

    @property
    def full_score(self):
        return float(self.bias + self.weights.sum())


def test_context_cite_recovers_a_linear_score():
    weights = np.array([0.8, -0.3, 0.0, 1.5, 0.2, 0.0])
    method = ContextCite().configure({"output": "log-prob", "alpha": "1e-6"})
    np.testing.assert_allclose(method.attribute_segments(LinearScorer(weights)), weights, atol=1e-4)
    # LASSO shrinks: with the official alpha a small weight goes to 0 before a large one.
    shrunk = ContextCite().configure({"output": "log-prob", "alpha": "0.1"})
    values = shrunk.attribute_segments(LinearScorer(weights))
    assert values[4] == 0 and values[3] > 1.0


def test_context_cite_masks_are_the_official_ones():
    masks = random_masks(5, 3, 0.5, 7)
    for i in range(3):  # context_cite.utils._create_mask(num_sources, alpha, seed)
        official = np.random.RandomState(7 + i).choice([False, True], size=5, p=[0.5, 0.5])
        assert masks[i].tolist() == official.tolist()


def test_topk_drop_and_lds_by_hand():
    scorer = LinearScorer([0.5, 2.0, -1.0, 0.25])
    values = TopKDrop().configure({"ks": "1,2,4"}).evaluate_segments(scorer, scorer.weights)
    assert values["top1-drop"] == pytest.approx(2.0)
    assert values["top2-drop"] == pytest.approx(2.5)
    assert math.isnan(values["top4-drop"])  # removing every segment tells methods not apart
    lds = LinearDatamodelingScore().evaluate_segments(scorer, scorer.weights)["lds"]
    assert lds == pytest.approx(1.0)
    reverse = LinearDatamodelingScore().evaluate_segments(scorer, -scorer.weights)["lds"]
    assert reverse == pytest.approx(-1.0)


def test_evidence_auprc():
    scorer = LinearScorer([0.0, 0.0, 0.0], evidence=(0, 1, 0))
    perfect = EvidenceAuprc().evaluate_segments(scorer, np.array([0.1, 0.9, 0.2]))
    assert perfect["evidence-auprc"] == 1.0
    worst = EvidenceAuprc().evaluate_segments(scorer, np.array([0.5, 0.1, 0.9]))
    # Ranked last: precision 0 until recall jumps to 1 at precision 1/3, a trapezoid of 1/6.
    assert worst["evidence-auprc"] == pytest.approx(1 / 6, rel=1e-12)
    none = EvidenceAuprc().evaluate_segments(LinearScorer([0.0, 1.0]), np.array([0.1, 0.2]))
    assert math.isnan(none["evidence-auprc"])


def test_split_rules():
    text = 'He said "no." Then left! Why? ok\nnext line'
    assert split_context(text, "sentences") == [
        'He said "no."',
        "Then left!",
        "Why?",
        "ok\nnext line",
    ]
    assert split_context(text, "lines") == ['He said "no." Then left! Why? ok', "next line"]


def test_eraser_reviews_become_sentences_with_evidence():
    examples, _ = load_segments(SHARED_DATA / "eraser_movies", "val", limit=2)
    first = examples[0]
    assert first.query == ERASER_QUERY and first.answer in (" positive", " negative")
    assert len(first.evidence) == len(first.segments) and sum(first.evidence) > 0
    # A line of punctuation alone joins the sentence before it.
    assert not any(s.strip(".!?, ") == "" for s in first.segments)
    annotation = json.loads((SHARED_DATA / "eraser_movies" / "val.jsonl").open().readline())
    words = " ".join(first.segments).split()
    span = annotation["evidences"][0][0]
    assert " ".join(words[span["start_token"] : span["end_token"]]) == span["text"]


@pytest.mark.parametrize(
    ("segments", "query", "answer", "message"),
    [
        (("the cat", " "), "q", " mat", "example 'bad': segment 1 is empty"),
        (("the cat",), "the ca", "t", "tokenises differently after the prompt"),
        (("the cat",) * 40, "q", " mat", "longer than the model's limit of 64"),
    ],
)
def test_bad_examples_are_one_line(decoder64, segments, query, answer, message):
    with pytest.raises(UsageError, match=message):
        SegmentScorer(decoder64, SegmentExample("bad", segments, query, answer), TEMPLATE)


def test_segments_without_tokens(decoder64):
    cat = SegmentExample("tiny", ("c", "a", "t"), "", " mat", separator="")  # one token: "cat"
    with pytest.raises(UsageError, match=r"example 'tiny' has more segments \(3\) than prompt"):
        SegmentScorer(decoder64, cat, "{context}{query}")
    longer = SegmentExample("merged", ("c", "a", "t"), " on the mat", " mat", separator="")
    with pytest.raises(UsageError, match=r"example 'merged': segment 0 .* has no token of its own"):
        SegmentScorer(decoder64, longer, "{context}{query}")


def test_builtins_register_through_the_hook():
    registry = load_registry()
    assert {"leave-one-segment-out", "context-cite", "random"} <= set(registry.segment_attributors)
    assert {"topk-drop", "lds", "evidence-auprc"} <= set(registry.segment_evaluators)
    with pytest.raises(UsageError, match="unknown parameter 'ablation'"):
        registry.segment_attributor("context-cite:ablation=3")


def test_list_shows_segment_plugins_with_their_parameters():
    listing = list_plugins()
    methods = {row["name"]: row for row in listing["segment_attributors"]}
    output = methods["context-cite"]["parameters"]["output"]
    assert output["default"] == "logit-prob"
    assert output["choices"] == ["logit-prob", "log-prob"]
    assert output["doc"].startswith("logit-prob: log P - log(1 - P)")
    assert "AttriBoT" in methods["leave-one-segment-out"]["reference"]
    assert {row["name"] for row in listing["segment_evaluators"]} >= {"lds", "topk-drop"}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_cli_runs_and_a_bad_example_exits_2_before_any_work(run_cli, tmp_path):
    model = save_tiny_decoder(tmp_path / "llama", "llama")
    data = write_jsonl(
        tmp_path / "ok.jsonl",
        [
            {
                "id": "a",
                "segments": list(EXAMPLE.segments),
                "query": "who sat?",
                "answer": " the cat",
                "evidence": [0],
            }
        ],
    )
    report = tmp_path / "report.json"
    code, out, err = run_cli(
        "context",
        "--dataset",
        data,
        "--model",
        model,
        "--template",
        TEMPLATE,
        "--quiet",
        "--methods",
        "leave-one-segment-out,random",
        "--output",
        report,
    )
    assert code == 0, err
    written = json.loads(report.read_text())
    assert written["methods"]["random"]["status"] == "ok"
    assert len(written["examples"][0]["scores"]["leave-one-segment-out"]) == 4
    assert "lds" in out and "top1-drop" in out
    assert "steps" not in written["examples"][0]
    summed = written["examples"][0]["scores"]
    code, _, err = run_cli(
        "context", "--dataset", data, "--model", model, "--template", TEMPLATE, "--quiet",
        "--methods", "leave-one-segment-out,input-x-gradient,random", "--per-step",
        "--output", report,
    )  # fmt: skip
    assert code == 0, err
    written = json.loads(report.read_text())
    (example,) = written["examples"]
    T = len(example["answer_tokens"])
    assert T >= 2 and set(example["steps"]) == {"leave-one-segment-out", "input-x-gradient"}
    assert {m: row["per_step"] for m, row in written["methods"].items()} == {
        "leave-one-segment-out": True,
        "input-x-gradient": True,
        "random": False,
    }
    assert all(np.shape(steps) == (T, 4) for steps in example["steps"].values())
    # The steps sum to what the summed path (attribute_segments, the run above) gives.
    np.testing.assert_allclose(
        np.sum(example["steps"]["leave-one-segment-out"], 0),
        summed["leave-one-segment-out"],
        rtol=1e-5,
        atol=1e-7,
    )
    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            {"id": "a", "segments": ["x y"], "query": "q", "answer": " a"},
            {"id": "b", "segments": ["x", ""], "query": "q", "answer": " a"},
        ],
    )
    code, _, err = run_cli(
        "context", "--dataset", bad, "--model", model, "--output", tmp_path / "b"
    )
    assert code == 2 and "example 'b': segment 1 is empty" in err
    assert not (tmp_path / "b").exists()
    code, _, err = run_cli("context", "--dataset", tmp_path / "none.jsonl", "--model", model)
    assert code == 2 and "not found" in err


def test_report_renders_a_segment_report(tmp_path):
    """``attrib_bench.report`` on a segment report: the summary, each segment's scores (the
    evidence starred) and the step x segment matrices, Markdown and one self-contained page."""
    import attrib_bench

    model = save_tiny_decoder(tmp_path / "llama", "llama")
    record = {
        "id": "cat",
        "segments": list(EXAMPLE.segments),
        "query": "who sat?",
        "answer": " the cat",
        "evidence": [0],
    }
    data = write_jsonl(tmp_path / "data.jsonl", [record])
    report = attrib_bench.context(
        data,
        model=str(model),
        template=TEMPLATE,
        methods=["leave-one-segment-out", "input-x-gradient", "random"],
        token_methods=["rollout", "alti"],
        per_step=True,
        device="cpu",
    )
    assert {m: row["status"] for m, row in report["methods"].items()} == dict.fromkeys(
        ["leave-one-segment-out", "input-x-gradient", "random", "tokens/rollout", "tokens/alti"],
        "ok",
    )
    written = tmp_path / "report.json"
    written.write_text(json.dumps(report))
    page = tmp_path / "page.html"
    text = attrib_bench.report(written, html=page)
    assert text.startswith("# attrib-bench context: ")
    assert "| method | top1-drop | top3-drop | top5-drop | lds | evidence-auprc | s/ex |" in text
    scores = report["examples"][0]["scores"]["leave-one-segment-out"]
    best = int(np.argmax(scores))
    star = "*" if best == 0 else ""
    assert f"- leave-one-segment-out: {best}{star} ({scores[best]:+.3g})" in text
    html = page.read_text()
    assert "http" not in html and "<script" not in html
    assert "<td>0 ★</td><td>the cat sat on the mat.</td>" in html
    assert "<td>1</td><td>a dog ran.</td>" in html
    assert "leave-one-segment-out per answer step (rows) and segment (columns)" in html
    tokens = report["examples"][0]["answer_tokens"]
    assert all(f"<td><code>{token}</code></td>" in html for token in tokens)
    assert "random per answer step" not in html  # random has no per-step form
    # Input x gradient also attributes the second step to the answer's first token.
    assert "input-x-gradient per answer step (rows) and earlier answer token (columns)" in html
    assert "leave-one-segment-out per answer step (rows) and earlier" not in html


def test_a_failing_method_leaves_the_others(run_cli, tmp_path):
    model = save_tiny_decoder(tmp_path / "gpt2", "gpt2")
    plugin = tmp_path / "broken.py"
    plugin.write_text(
        "from attrib_bench import hookimpl\n"
        "class Broken:\n"
        "    name = 'broken'\n"
        "    description = 'fails'\n"
        "    def attribute_segments(self, scorer):\n"
        "        raise RuntimeError('no luck')\n"
        "@hookimpl\n"
        "def attrib_bench_segment_attributors():\n"
        "    return [Broken()]\n"
    )
    data = write_jsonl(
        tmp_path / "ok.jsonl",
        [{"id": "a", "segments": list(EXAMPLE.segments), "query": "q", "answer": " the"}],
    )
    code, out, _ = run_cli(
        "context",
        "--dataset",
        data,
        "--model",
        model,
        "--plugin",
        plugin,
        "--quiet",
        "--methods",
        "broken,random",
        "--evaluators",
        "topk-drop",
    )
    assert code == 3
    assert "RuntimeError: no luck" in out and "ok" in out


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")  # one worker dequantises it (conftest.py)
def test_smollm2_cached_leave_one_out(smollm2_session):
    _, loaded = smollm2_session
    example = SegmentExample(
        "s", ("The film was a joy.", "The cast is great.", "I left early."), "Verdict:", " good"
    )
    naive = SegmentScorer(loaded, example).leave_one_out(cached=False)
    cached = SegmentScorer(loaded, example).leave_one_out(cached=True)
    np.testing.assert_allclose(cached, naive, rtol=0, atol=2e-4)


def test_summary_cells_read_nan_as_written_to_json():
    """``write_json`` writes NaN as null: one example's CI (and an all-NaN mean) must render."""
    from attrib_bench.reports.segments import _cell

    assert _cell({"mean": 0.5, "ci95": [None, None]}) == "0.500"
    assert _cell({"mean": None, "ci95": [None, None]}) == "-"
    assert _cell({"mean": 0.5, "ci95": [0.25, 0.75]}) == "0.500 [0.250, 0.750]"
