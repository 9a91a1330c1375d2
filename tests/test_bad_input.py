"""Bad input: one line on stderr naming the bad value and the valid choices, exit code 2.

Arguments may hold ``{bert}`` (a tiny BERT classifier) and ``{tmp}`` (a folder of prepared bad
inputs, see ``bad_inputs``); they are filled in by the test.
"""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

BUILTINS = ("attention", "gradient", "integrated-gradients", "random", "rollout", "saliency")
#: The progress bar ``datasets`` draws while it converts a local file (disabled by the CLI).
DATASETS_PROGRESS = re.compile(r"^Generating \S+ split: ")
MODEL = ("--model", "{bert}", "--limit", "2", "--quiet")


@pytest.fixture
def bad_inputs(tmp_path):
    """Files and folders that are wrong in one way each."""
    (tmp_path / "no-config").mkdir()
    (tmp_path / "no-config" / "model.safetensors").write_bytes(b"")
    (tmp_path / "empty.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "reviews.csv").write_text("text,label\na fine film,1\na dull film,0\n")
    (tmp_path / "unlabelled.csv").write_text("text\na fine film\na dull film\n")
    (tmp_path / "notext.csv").write_text("a,b\nx,1\ny,0\n")
    (tmp_path / "notes.xml").write_text("<notes/>\n")
    (tmp_path / "no-data").mkdir()
    (tmp_path / "no-data" / "README.md").write_text("nothing to load\n")
    (tmp_path / "raises.py").write_text(
        textwrap.dedent(
            """
            import attrib_bench

            raise RuntimeError("this plugin exploded on import")
            """
        )
    )
    return tmp_path


def fill(args, tiny_bert, folder) -> list[str]:
    return [str(a).format(bert=tiny_bert, tmp=folder) for a in args]


def assert_usage_error(result, needles, ignore_datasets_progress=False) -> str:
    code, out, err = result
    assert "Traceback" not in out + err
    assert out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    if ignore_datasets_progress:
        lines = [line for line in lines if not DATASETS_PROGRESS.match(line)]
    assert len(lines) == 1, err
    (line,) = lines
    assert line.startswith("error: ")
    for needle in needles:
        assert needle in line, needle
    assert code == 2
    return line


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")

CASES = [
    pytest.param(
        ["run", "--attributors", "nope", "--quiet"],
        ["unknown attributor 'nope'", "valid choices:", *BUILTINS],
        id="unknown-attributor",
    ),
    pytest.param(
        ["attribute", "--attributors", "attention,nope", "--output", "{tmp}/x.jsonl"],
        ["unknown attributor 'nope'", *BUILTINS],
        id="unknown-attributor-in-attribute",
    ),
    pytest.param(
        ["run", "--evaluators", "nope", "--quiet"],
        ["unknown evaluator 'nope'", "valid choices:", "spearman"],
        id="unknown-evaluator",
    ),
    pytest.param(
        ["run", *MODEL, "--attributors", "attention", "--reference", "nope"],
        ["unknown reference attributor 'nope'", *BUILTINS],
        id="unknown-reference",
    ),
    pytest.param(
        ["run", "--model", "{tmp}/no-such-model", "--limit", "2", "--quiet"],
        ["'{tmp}/no-such-model' not found", "local directory", "Hugging Face hub"],
        id="model-missing-path",
    ),
    pytest.param(
        ["run", "--model", "nobody/no-such-model", "--limit", "2", "--quiet"],
        ["'nobody/no-such-model' not found", "local directory", "Hugging Face hub"],
        id="model-hub-id-offline",
    ),
    pytest.param(
        ["run", "--model", "{tmp}/no-config", "--limit", "2", "--quiet"],
        ["'{tmp}/no-config'", "no config.json"],
        id="model-folder-without-config",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/missing.csv"],
        ["dataset '{tmp}/missing.csv' not found", "'default'", "local path", "hub id"],
        id="dataset-missing-path",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "nobody/no-such-dataset"],
        ["dataset 'nobody/no-such-dataset' not found", "'default'", "local path", "hub id"],
        id="dataset-hub-id-offline",
    ),
    pytest.param(
        ["run", *MODEL, "--split", "nope"],
        ["'nope'", "split", "valid choices: test, train"],
        id="unknown-split",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/reviews.csv", "--split", "nope"],
        ["'nope'", "split", "valid choices: reviews"],
        id="unknown-split-of-a-file",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/reviews.csv", "--text-column", "nope"],
        ["'nope'", "column", "valid choices: label, text"],
        id="unknown-text-column",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/reviews.csv", "--label-column", "nope"],
        ["'nope'", "column", "valid choices: label, text"],
        id="unknown-label-column",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/reviews.csv", "--text-pair-column", "nope"],
        ["'nope'", "column", "valid choices: label, text"],
        id="unknown-pair-column",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/notext.csv"],
        ["no text column", "a, b", "--text-column"],
        id="no-text-column-found",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/empty.tsv"],
        ["'{tmp}/empty.tsv'", "no examples"],
        id="empty-data",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/notes.xml"],
        ["'.xml'", ".tsv", ".csv", ".jsonl", ".parquet"],
        id="unknown-file-type",
    ),
    pytest.param(
        ["run", *MODEL, "--dataset", "{tmp}/no-data"],
        ["'{tmp}/no-data'", "no data file", ".tsv", ".parquet"],
        id="folder-without-data",
    ),
    pytest.param(
        ["run", "--model", "{bert}", "--limit", "0", "--quiet"],
        ["--limit must be at least 1, got 0"],
        id="limit-0",
    ),
    pytest.param(
        ["run", "--model", "{bert}", "--limit", "-3", "--quiet"],
        ["--limit must be at least 1, got -3"],
        id="limit-negative",
    ),
    pytest.param(
        ["run", *MODEL, "--batch-size", "0"],
        ["--batch-size must be at least 1, got 0"],
        id="batch-size-0",
    ),
    pytest.param(
        ["run", *MODEL, "--max-length", "2"],
        ["--max-length must be at least 3, got 2"],
        id="max-length-2",
    ),
    pytest.param(
        ["run", *MODEL, "--device", "cuda"],
        ["'cuda'", "CUDA is not available", "--device cpu"],
        id="device-cuda-unavailable",
        marks=NO_CUDA,
    ),
    pytest.param(
        ["run", *MODEL, "--device", "cuda:1"],
        ["'cuda:1'", "CUDA is not available", "--device cpu"],
        id="device-cuda-1-unavailable",
        marks=NO_CUDA,
    ),
    pytest.param(
        ["run", *MODEL, "--device", "bogus"],
        ["'bogus'", "cpu", "cuda"],
        id="device-bogus",
    ),
    pytest.param(
        ["run", "--attributors", "rollout:residual", "--quiet"],
        ["'residual'", "'rollout:residual'", "name:key=value"],
        id="parameter-without-value",
    ),
    pytest.param(
        ["run", "--attributors", ":residual=0.5", "--quiet"],
        ["empty method name", "':residual=0.5'"],
        id="parameter-without-method",
    ),
    pytest.param(
        ["run", "--plugin", "{tmp}/missing_plugin.py", "--quiet"],
        ["plugin file '{tmp}/missing_plugin.py' does not exist"],
        id="plugin-missing",
    ),
    pytest.param(
        ["list", "--plugin", "{tmp}/missing_plugin.py"],
        ["plugin file '{tmp}/missing_plugin.py' does not exist"],
        id="plugin-missing-in-list",
    ),
    pytest.param(
        ["run", "--plugin", "{tmp}/raises.py", "--quiet"],
        ["error importing plugin file '{tmp}/raises.py'", "this plugin exploded on import"],
        id="plugin-raises-on-import",
    ),
    pytest.param(
        [
            "attribute",
            *MODEL,
            "--dataset",
            "{tmp}/unlabelled.csv",
            "--attributors",
            "saliency:target=gold",
            "--output",
            "{tmp}/x.jsonl",
        ],
        ["target=gold", "label"],
        id="gold-target-without-labels",
    ),
    pytest.param(
        [
            "finetune",
            "--model",
            "{bert}",
            "--dataset",
            "{tmp}/unlabelled.csv",
            "--split",
            "unlabelled",
            "--quiet",
        ],
        ["'{tmp}/unlabelled.csv'", "no labels"],
        id="finetune-without-labels",
    ),
    pytest.param(
        ["finetune", "--model", "{bert}", "--limit", "8", "--batch-size", "0", "--quiet"],
        ["--batch-size", "0"],
        id="finetune-batch-size-0",
    ),
    pytest.param(
        ["finetune", "--model", "{bert}", "--seed", "1", "--seeds", "0,1", "--quiet"],
        ["--seed", "--seeds", "not both"],
        id="finetune-seed-and-seeds",
    ),
    pytest.param(
        ["finetune", "--model", "{bert}", "--seeds", "0,x", "--quiet"],
        ["--seeds", "integers", "'0,x'"],
        id="finetune-seeds-not-integers",
    ),
    pytest.param(
        ["finetune", "--model", "{bert}", "--seeds", "", "--quiet"],
        ["--seeds", "integers", "''"],
        id="finetune-seeds-empty",
    ),
    pytest.param(
        ["finetune", "--model", "{bert}", "--seeds", "0,1,0", "--quiet"],
        ["--seeds", "seed 0 more than once"],
        id="finetune-seeds-duplicated",
    ),
    pytest.param(
        ["run", "--attributors", "[bold]", "--quiet"],
        ["unknown attributor '[bold]'"],
        id="value-that-looks-like-markup",
    ),
]


@pytest.mark.parametrize(("args", "needles"), CASES)
def test_bad_input_is_one_line_and_exit_2(args, needles, bad_inputs, tiny_bert, run_cli):
    result = run_cli(*fill(args, tiny_bert, bad_inputs))
    loads_a_file = "--dataset" in args and args[args.index("--dataset") + 1].startswith("{tmp}")
    assert_usage_error(
        result, fill(needles, tiny_bert, bad_inputs), ignore_datasets_progress=loads_a_file
    )


def test_error_on_a_fresh_local_file_is_the_only_line(bad_inputs, tiny_bert, run_cli):
    code, out, err = run_cli(
        "run",
        "--model",
        tiny_bert,
        "--dataset",
        bad_inputs / "reviews.csv",
        "--text-column",
        "nope",
        "--quiet",
    )
    assert_usage_error((code, out, err), ["'nope'"])


def test_string_labels_are_mapped_or_refused(run_cli, tmp_path, tiny_bert):
    (tmp_path / "words.csv").write_text("text,label\na fine film,pos\na dull film,neg\n")
    code, out, err = run_cli(
        "attribute",
        "--model",
        tiny_bert,
        "--dataset",
        tmp_path / "words.csv",
        "--attributors",
        "attention",
        "--quiet",
        "--output",
        tmp_path / "x.jsonl",
    )
    if code != 0:  # refusing is as good as mapping, if it says why
        assert_usage_error((code, out, err), ["label", "'pos'"], ignore_datasets_progress=True)


def test_unsupported_architecture(run_cli, tmp_path, tiny_bert):
    """A model family without an adapter: gradient methods run on it; a method reading model
    internals fails alone, with one line naming the model type and the supported ones."""
    from transformers import (
        AutoTokenizer,
        MegatronBertConfig,
        MegatronBertForSequenceClassification,
    )

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    config = MegatronBertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    MegatronBertForSequenceClassification(config).save_pretrained(tmp_path / "megatron")
    tokenizer.save_pretrained(tmp_path / "megatron")
    for attributors, expected in (("saliency", 0), ("saliency,globenc", 3)):
        code, _, err = run_cli(
            "attribute",
            "--model",
            tmp_path / "megatron",
            "--limit",
            "2",
            "--attributors",
            attributors,
            "--quiet",
            "--output",
            tmp_path / "x.jsonl",
        )
        assert code == expected, err
    failure = " ".join(err.split())
    assert failure.startswith(
        "warning: globenc failed and is dropped: globenc cannot run on model type "
        "'megatron-bert': it reads model internals, and no architecture adapter serves "
        "'megatron-bert' (supported: albert, bert, camembert,"
    )
