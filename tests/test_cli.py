"""The ``attrib-bench`` command end to end: list, run, attribute and finetune on tiny models.

Every run here is small (a handful of examples, tiny 3-layer models) so the file stays fast;
only the MiniLM test loads a real model.
"""

from __future__ import annotations

import csv
import json
import os
import re
import runpy
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from helpers import ARCHITECTURES

import attrib_bench

BUILTIN_ATTRIBUTORS = (
    "attention",
    "rollout",
    "saliency",
    "gradient",
    "integrated-gradients",
    "random",
)
#: Every built-in, with Integrated Gradients cut to 2 steps to stay fast.
ALL_METHODS = "attention,rollout,saliency,gradient,random,integrated-gradients:steps=2"
#: Methods with one row per layer; the others are whole-model methods with a single row.
LAYERWISE = {"attention", "rollout"}
FAST = ("--quiet", "--batch-size", "6")
SUMMARY_KEYS = {"layer", "mean", "std", "ci95", "n", "nan"}


@pytest.fixture
def wide(monkeypatch):
    """A wide terminal, so that rich tables print whole cells instead of wrapping them."""
    monkeypatch.setenv("COLUMNS", "250")


def num_layers(model_dir) -> int:
    return json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_json(run_cli, tmp_path, *args, name="result.json"):
    """``attrib-bench run ... --output`` and the parsed result document."""
    output = tmp_path / name
    code, out, err = run_cli("run", *args, "--output", output)
    assert code == 0, err
    return json.loads(output.read_text()), out, err


# ---------------------------------------------------------------------------------------- list


def test_list_prints_a_table_of_every_builtin(run_cli, wide):
    code, out, err = run_cli("list")
    assert code == 0, err
    assert "attributors" in out and "evaluators" in out
    for name in (*BUILTIN_ATTRIBUTORS, "spearman"):
        assert re.search(rf"│ {re.escape(name)} +│", out), name
    assert "attrib-bench 0.1.0 (attention =" in out
    assert re.search(r"│ rollout +│.*│ residual=0\.5: share .*│ yes +│", out)
    assert re.search(r"│ hta +│.*│ no +│", out)


def test_list_piped_folds_long_cells_instead_of_cutting_them(run_cli):
    """Stdout is not a terminal here: every parameter and plugin cell is whole, folded onto
    more lines where it does not fit (``chunk_elements=1677…`` hid the value)."""
    from attrib_bench.cli import _parameters_text

    code, out, err = run_cli("list")
    assert code == 0, err
    assert "…" not in out
    listing = json.loads(run_cli("list", "--json")[1])
    table = out[: out.index("\nevaluators")]
    cells: dict[str, list[list[str]]] = {}
    for line in table.splitlines():
        if not line.startswith("│"):
            continue
        columns = [cell.strip() for cell in line.split("│")[1:-1]]
        if columns[0]:
            name = columns[0]
        cells.setdefault(name, []).append(columns)

    def whole(name: str, column: int) -> str:
        return "".join(row[column] for row in cells[name]).replace(" ", "")

    for entry in listing["attributors"]:
        expected = _parameters_text(entry["parameters"]).replace(" ", "").replace("\n", "")
        assert whole(entry["name"], 2) == expected, entry["name"]
        assert whole(entry["name"], 4) == entry["plugin"].replace(" ", ""), entry["name"]
        facts = [f"family:{entry['family']}"] if entry["family"] else []
        facts += [f"passes:{entry['passes']}"] if entry["passes"] else []
        needs = ",".join(f"{k}={v}" for k, v in entry["needs"].items())
        facts += [f"needs:{needs}"] if needs else []
        description = f"{entry['description']}Reference:{entry['reference']}" + ";".join(facts)
        assert whole(entry["name"], 1) == description.replace(" ", ""), entry["name"]
    assert "chunk_elements=16777216" in whole("alti", 2)


def test_list_json_schema_and_builtin_sources(run_cli):
    code, out, err = run_cli("list", "--json")
    assert code == 0, err
    listing = json.loads(out)
    assert set(listing) == {
        "attributors",
        "evaluators",
        "architectures",
        "segment_attributors",
        "segment_evaluators",
    }
    segment_names = {e["name"] for e in listing["segment_attributors"]}
    assert {"leave-one-segment-out", "context-cite"} <= segment_names
    for entry in listing["segment_attributors"] + listing["segment_evaluators"]:
        assert {"name", "description", "reference", "parameters"} <= set(entry)
    for kind in ("attributors", "evaluators"):
        for entry in listing[kind]:
            keys = {"name", "description", "family", "parameters", "default_run"}
            keys |= {"compares_models", "plugin", "reference"}
            if kind == "attributors":
                keys |= {"passes", "needs"}
            assert set(entry) == keys
            assert entry["description"].strip()
        names = [entry["name"] for entry in listing[kind]]
        assert names == sorted(names)
    attributors = {entry["name"]: entry for entry in listing["attributors"]}
    evaluators = {entry["name"]: entry for entry in listing["evaluators"]}
    assert set(BUILTIN_ATTRIBUTORS) <= set(attributors)
    assert "spearman" in evaluators
    builtins = [attributors[name] for name in BUILTIN_ATTRIBUTORS] + [evaluators["spearman"]]
    for entry in builtins:
        assert entry["plugin"].startswith(f"attrib-bench {attrib_bench.__version__} (")
        assert "attrib_bench_plugins." in entry["plugin"]
    assert attributors["rollout"]["plugin"].endswith("(attention = attrib_bench_plugins.attention)")
    assert attributors["saliency"]["plugin"].endswith("(gradient = attrib_bench_plugins.gradient)")
    # Parameters with their defaults (and closed choices), and which run only when selected.
    # ... and what each means, with its range (parameter_docs).
    residual = attributors["rollout"]["parameters"]["residual"]
    assert set(attributors["rollout"]["parameters"]) == {"residual"}
    assert residual["default"] == 0.5 and residual["doc"].endswith("in [0, 1)")
    norm = attributors["hta"]["parameters"]["norm"]
    assert (norm["default"], norm["choices"]) == ("frobenius", ["frobenius", "sum"])
    assert norm["doc"].startswith("frobenius: ")
    assert attributors["rollout"]["family"] == "attention"
    assert attributors["rollout"]["reference"].startswith("Abnar & Zuidema 2020, ")
    assert attributors["attention"]["default_run"] and not attributors["hta"]["default_run"]
    evaluators = {e["name"]: e for e in listing["evaluators"]}
    assert evaluators["seed-invariance"]["compares_models"]
    assert not evaluators["spearman"]["compares_models"]


# ----------------------------------------------------------------------------------------- run


def test_run_end_to_end(tiny_model, run_cli, tmp_path, wide):
    document, out, _ = run_json(
        run_cli,
        tmp_path,
        "--model",
        tiny_model,
        "--dataset",
        "default",
        "--limit",
        "6",
        "--attributors",
        ALL_METHODS,
        *FAST,
    )
    layers = num_layers(tiny_model)

    # The leaderboard on stdout: one row per method, saliency against itself on top.
    assert "spearman vs saliency (aggregated)" in out
    for spec in ALL_METHODS.split(","):
        assert spec in out
    rows = [line for line in out.splitlines() if line.startswith("│ ")]
    assert rows[0].split("│")[1].strip() == "saliency"

    assert document["schema_version"] == 1
    assert document["reference"] == "saliency"
    assert document["evaluators"] == {"spearman": {"status": "ok", "error": None}}
    assert len(document["example_ids"]) == 6 == len(set(document["example_ids"]))
    assert list(document["methods"]) == ALL_METHODS.split(",")
    for spec, method in document["methods"].items():
        name = spec.partition(":")[0]
        assert method["name"] == name
        assert method["status"] == "ok" and method["error"] is None
        assert method["plugin"].startswith("attrib-bench ")
        assert method["seconds_per_example"] > 0
        expected = layers if name in LAYERWISE else 1
        summaries = method["scores"]["spearman"]["aggregated"]
        assert [s["layer"] for s in summaries] == list(range(1, expected + 1)), spec
        for summary in summaries:
            assert set(summary) == SUMMARY_KEYS
            assert summary["n"] + summary["nan"] == 6
            assert len(summary["ci95"]) == 2
            if summary["n"]:
                assert -1.0 <= summary["mean"] <= 1.0
        per_example = method["per_example"]["spearman"]["aggregated"]
        assert len(per_example) == expected and all(len(row) == 6 for row in per_example)
        if name in LAYERWISE:  # these have a single-layer row too
            assert len(method["scores"]["spearman"]["local"]) == layers
        else:
            assert "local" not in method["scores"]["spearman"]

    # The reference against itself agrees perfectly on every example.
    saliency = document["methods"]["saliency"]["scores"]["spearman"]["aggregated"]
    assert saliency[0]["mean"] == pytest.approx(1.0)
    assert saliency[0]["n"] == 6
    assert document["methods"]["saliency"]["per_example"]["spearman"]["aggregated"] == [
        [pytest.approx(1.0)] * 6
    ]

    provenance = document["provenance"]
    model = provenance["model"]
    assert model["id"] == str(tiny_model)
    assert model["type"] == json.loads((tiny_model / "config.json").read_text())["model_type"]
    assert re.fullmatch(r"[0-9a-f]{64}", model["weights_sha256"])
    assert model["fresh_head"] is False
    dataset = provenance["dataset"]
    assert dataset["name"] == "default" and dataset["split"] == "test"
    assert dataset["examples"] == 6 and dataset["truncated"] == 0
    assert re.fullmatch(r"[0-9a-f]{64}", dataset["fingerprint"])
    assert provenance["seed"] == 0
    import torch
    import transformers

    assert provenance["hardware"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")

    assert provenance["packages"]["attrib-bench"] == attrib_bench.__version__
    assert provenance["packages"]["torch"] == torch.__version__
    assert provenance["packages"]["transformers"] == transformers.__version__
    assert provenance["evaluator_plugins"]["spearman"].startswith("attrib-bench ")

    # Valid against the shipped schema.
    jsonschema = pytest.importorskip("jsonschema")
    from attrib_bench.results import SCHEMA_PATH

    if not SCHEMA_PATH.is_file():
        pytest.skip(f"the result schema {SCHEMA_PATH} is not written yet")
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(document)


def test_run_is_reproducible_and_the_seed_drives_random(tiny_bert, run_cli, tmp_path):
    args = ("--model", tiny_bert, "--limit", "6", "--attributors", "attention,random,saliency")
    first, _, _ = run_json(run_cli, tmp_path, *args, *FAST, name="first.json")
    again, _, _ = run_json(run_cli, tmp_path, *args, *FAST, name="again.json")
    other, _, _ = run_json(run_cli, tmp_path, *args, *FAST, "--seed", "1", name="other.json")

    for spec in ("attention", "random", "saliency"):
        assert first["methods"][spec]["scores"] == again["methods"][spec]["scores"]
        assert first["methods"][spec]["per_example"] == again["methods"][spec]["per_example"]
    for key in ("model", "dataset"):
        assert first["provenance"][key] == again["provenance"][key] == other["provenance"][key]
    assert other["provenance"]["seed"] == 1 and other["config"]["seed"] == 1

    def per_example(document, spec):
        return document["methods"][spec]["per_example"]["spearman"]["aggregated"]

    # The seed moves the random baseline, and nothing deterministic.
    assert per_example(other, "random") != per_example(first, "random")
    assert per_example(other, "attention") == per_example(first, "attention")


def test_run_numbers_do_not_depend_on_batch_size(tiny_bert, run_cli, tmp_path):
    args = ("--model", tiny_bert, "--limit", "4", "--attributors", "rollout,random", "--quiet")
    one, _, _ = run_json(run_cli, tmp_path, *args, "--batch-size", "1", name="one.json")
    four, _, _ = run_json(run_cli, tmp_path, *args, "--batch-size", "4", name="four.json")
    assert one["example_ids"] == four["example_ids"]
    for spec in ("rollout", "random"):
        for a, b in zip(
            one["methods"][spec]["per_example"]["spearman"]["aggregated"],
            four["methods"][spec]["per_example"]["spearman"]["aggregated"],
            strict=True,
        ):
            assert a == pytest.approx(b, abs=1e-6)


def test_run_quiet_shows_no_progress_bar(tiny_bert, run_cli, tmp_path):
    _, _, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--limit", "4", "--attributors", "random", *FAST
    )
    assert "attributing" not in err


TQDM_PLUGIN = """
from tqdm.auto import tqdm

import attrib_bench


class PlainBar:
    name = "plain-bar"
    description = "Position decay behind a plain tqdm bar, as transformers' GGUF loading draws"
    requires = frozenset()

    def attribute(self, trace):
        for _ in tqdm(range(3), desc="plain tqdm bar"):
            pass
        positions = trace.mask_BN.cumsum(-1).float()
        return attrib_bench.Attribution(aggregated_BLN=(trace.mask_BN / positions)[:, None, :])


@attrib_bench.hookimpl
def attrib_bench_attributors():
    return [PlainBar()]
"""


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_also_silences_plain_tqdm_bars(tiny_bert, tmp_path, quiet):
    """From the shell, as a user runs it: tqdm reads its switch when first imported."""
    plugin = tmp_path / "plain_bar.py"
    plugin.write_text(TQDM_PLUGIN)
    args = ["--model", tiny_bert, "--limit", "2", "--plugin", plugin, "--attributors", "plain-bar"]
    args += ["--no-floor", "--reference", "plain-bar", "--output", tmp_path / "result.json"]
    environment = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    done = subprocess.run(
        [sys.executable, "-m", "attrib_bench.cli", "run", *map(str, args)]
        + (["--quiet"] if quiet else []),
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert ("plain tqdm bar" in done.stderr) is not quiet


def test_run_on_local_sst2_folder_picks_dev(tiny_bert, run_cli, tmp_path):
    folder = SHARED_DATA / "sst2"
    if not (folder / "dev.tsv").is_file():
        pytest.skip(f"{folder} is not available")
    document, _, _ = run_json(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--dataset",
        folder,
        "--limit",
        "6",
        "--attributors",
        "attention",
        *FAST,
    )
    dataset = document["provenance"]["dataset"]
    assert dataset["split"] == "dev"
    assert dataset["text_column"] == "sentence" and dataset["text_pair_column"] is None
    assert dataset["label_column"] == "label"
    with (folder / "dev.tsv").open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:6]
    assert document["example_ids"] == [row["idx"] for row in rows]


def test_sentence_pairs_are_detected_and_encoded_as_pairs(tiny_bert, run_cli, tmp_path):
    folder = SHARED_DATA / "mrpc"
    if not (folder / "dev.tsv").is_file():
        pytest.skip(f"{folder} is not available")
    common = ("--model", tiny_bert, "--dataset", folder, "--limit", "4", "--attributors")
    document, _, _ = run_json(run_cli, tmp_path, *common, "attention", *FAST)
    dataset = document["provenance"]["dataset"]
    assert (dataset["text_column"], dataset["text_pair_column"]) == ("sentence1", "sentence2")
    assert dataset["split"] == "dev"

    output = tmp_path / "pairs.jsonl"
    code, _, err = run_cli("attribute", *common, "attention", *FAST, "--output", output)
    assert code == 0, err
    records = read_jsonl(output)
    with (folder / "dev.tsv").open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:4]
    assert sorted(r["id"] for r in records) == sorted(row["idx"] for row in rows)
    by_id = {row["idx"]: row for row in rows}
    for record in records:
        tokens = record["tokens"]
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
        assert tokens.count("[SEP]") == 2
        first_sep = tokens.index("[SEP]")
        # The first segment is sentence1 and the second sentence2.
        first_word = by_id[record["id"]]["sentence1"].split()[0].lower()
        second_word = by_id[record["id"]]["sentence2"].split()[-2].lower()
        assert "".join(tokens[1:first_sep]).replace("##", "").startswith(first_word[:3])
        assert second_word[:3] in "".join(tokens[first_sep + 1 :]).replace("##", "")


LABELLED = [
    ("a wonderful and moving film", 1),
    ("a dull , lifeless mess", 0),
    ("great acting and a clever plot", 1),
    ("boring from start to finish", 0),
    ("an absolute delight to watch", 1),
    ("i wanted my money back", 0),
]


def write_table(path, columns: dict[str, list]) -> None:
    import pandas as pd

    frame = pd.DataFrame(columns)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path, index=False)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_run_on_local_files(suffix, tiny_bert, run_cli, tmp_path):
    labelled = tmp_path / f"reviews{suffix}"
    write_table(labelled, {"text": [t for t, _ in LABELLED], "label": [y for _, y in LABELLED]})
    document, _, _ = run_json(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--dataset",
        labelled,
        "--attributors",
        "attention,saliency:target=gold",
        "--reference",
        "saliency:target=gold",
        *FAST,
        name="labelled.json",
    )
    dataset = document["provenance"]["dataset"]
    assert dataset["split"] == "reviews" and dataset["examples"] == 6
    assert (dataset["text_column"], dataset["label_column"]) == ("text", "label")
    assert document["example_ids"] == [str(i) for i in range(6)]
    gold = document["methods"]["saliency:target=gold"]["scores"]["spearman"]["aggregated"]
    assert gold[0]["mean"] == pytest.approx(1.0)

    # A custom text column, and no labels at all: the default target (predicted class) works.
    unlabelled = tmp_path / f"unlabelled{suffix}"
    write_table(unlabelled, {"review": [t for t, _ in LABELLED[:4]], "stars": [5, 1, 4, 2]})
    document, _, _ = run_json(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--dataset",
        unlabelled,
        "--text-column",
        "review",
        "--attributors",
        "attention,saliency",
        *FAST,
        name="unlabelled.json",
    )
    dataset = document["provenance"]["dataset"]
    assert (dataset["text_column"], dataset["label_column"]) == ("review", None)
    assert dataset["examples"] == 4
    assert all(m["status"] == "ok" for m in document["methods"].values())
    assert document["methods"]["saliency"]["scores"]["spearman"]["aggregated"][0]["n"] == 4


def test_run_on_a_file_whose_name_has_a_hyphen(tiny_bert, run_cli, tmp_path):
    path = tmp_path / "my-reviews.csv"
    write_table(path, {"text": [t for t, _ in LABELLED], "label": [y for _, y in LABELLED]})
    document, _, _ = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--dataset", path, "--attributors", "random", *FAST
    )
    assert document["provenance"]["dataset"]["examples"] == 6


def test_finetune_on_a_single_labelled_file(tiny_bert, run_cli, tmp_path):
    path = tmp_path / "reviews.csv"
    write_table(path, {"text": [t for t, _ in LABELLED], "label": [y for _, y in LABELLED]})
    code, out, err = run_cli(
        "finetune", "--model", tiny_bert, "--dataset", path, "--batch-size", "6", "--quiet"
    )
    assert code == 0, err
    assert "accuracy: n/a" in out  # a single file has no evaluation split


def test_max_length_truncates_and_reports_it(tiny_bert, run_cli, tmp_path):
    from transformers import AutoTokenizer

    from attrib_bench.data.load import load_examples

    texts = [e.text for e in load_examples("default", limit=6).examples]
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    expected = sum(len(ids) > 8 for ids in tokenizer(texts)["input_ids"])
    assert expected > 0  # the default sentences are longer than 8 tokens

    args = ("--model", tiny_bert, "--limit", "6", "--max-length", "8", *FAST)
    document, _, err = run_json(run_cli, tmp_path, *args, "--attributors", "attention")
    assert f"{expected} of 6 inputs truncated to 8 tokens" in err
    assert document["provenance"]["dataset"]["truncated"] == expected
    assert document["provenance"]["dataset"]["max_length"] == 8

    output = tmp_path / "short.jsonl"
    code, _, err = run_cli("attribute", *args, "--attributors", "attention", "--output", output)
    assert code == 0, err
    for record in read_jsonl(output):
        assert len(record["tokens"]) <= 8 and record["tokens"][-1] == "[SEP]"
        assert all(len(row) == len(record["tokens"]) for row in record["aggregated"])


# ----------------------------------------------------------------------------------- attribute


def test_attribute_writes_one_record_per_example_and_method(tiny_bert, run_cli, tmp_path):
    from attrib_bench.data.load import load_examples

    output = tmp_path / "out" / "attributions.jsonl"
    code, _, err = run_cli(
        "attribute",
        "--model",
        tiny_bert,
        "--limit",
        "5",
        "--attributors",
        "attention,saliency",
        "--output",
        output,
        *FAST,
    )
    assert code == 0, err
    assert str(output) in "".join(err.split())  # the message may wrap at 80 columns
    records = read_jsonl(output)
    ids = [e.id for e in load_examples("default", limit=5).examples]
    assert sorted((r["id"], r["method"]) for r in records) == sorted(
        (i, m) for i in ids for m in ("attention", "saliency")
    )
    layers = num_layers(tiny_bert)
    for record in records:
        assert set(record) == {"id", "tokens", "method", "aggregated", "local", "target", "seed"}
        tokens = record["tokens"]
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "[PAD]" not in tokens
        assert all(len(row) == len(tokens) for row in record["aggregated"])
        if record["method"] == "attention":
            assert len(record["aggregated"]) == layers
            assert len(record["local"]) == layers
            assert all(len(row) == len(tokens) for row in record["local"])
            # Attention probabilities over the real tokens, and products of them, sum to 1.
            for row in record["aggregated"] + record["local"]:
                assert sum(row) == pytest.approx(1.0, abs=1e-4)
        else:
            assert len(record["aggregated"]) == 1
            assert record["local"] is None
            assert min(record["aggregated"][0]) >= 0.0  # an L2 norm per token
    # The two records of one example share its tokens.
    tokens = {}
    for record in records:
        assert tokens.setdefault(record["id"], record["tokens"]) == record["tokens"]


# ------------------------------------------------------------------------------------ finetune


def test_finetune_trains_once_and_caches_under_attrib_bench_cache(
    tiny_bert, run_cli, tmp_path, monkeypatch
):
    from attrib_bench.model import finetune as finetune_module
    from attrib_bench.model.load import load_model

    cache = tmp_path / "my-cache"
    monkeypatch.setenv("ATTRIB_BENCH_CACHE", str(cache))
    output = tmp_path / "finetuned"
    args = (
        "finetune",
        "--model",
        tiny_bert,
        "--dataset",
        "default",
        "--limit",
        "64",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--quiet",
        "--output",
        output,
    )
    code, out, err = run_cli(*args)
    assert code == 0, err
    match = re.search(r"accuracy: (\d\.\d{4}) on (\w+)", out)
    assert match, out
    assert f"model: {output}" in out

    entries = list((cache / "models").iterdir())
    assert len(entries) == 1
    metadata_file = entries[0] / finetune_module.METADATA_FILE
    metadata = json.loads(metadata_file.read_text())
    assert metadata["train_examples"] == 64
    assert metadata["eval_split"] == match.group(2)
    assert f"{metadata['eval_accuracy']:.4f}" == match.group(1)
    assert json.loads((output / finetune_module.METADATA_FILE).read_text()) == metadata

    loaded = load_model(str(output), "cpu", warn_fresh_head=False, architectures=ARCHITECTURES)
    assert loaded.fresh_head is False
    assert loaded.model.config.num_labels == 2
    assert (
        loaded.weights_sha256
        == load_model(str(entries[0]), "cpu", architectures=ARCHITECTURES).weights_sha256
    )

    # Same inputs again: the cached model is reused, nothing is trained.
    before = (metadata_file.stat().st_mtime_ns, metadata_file.read_bytes())

    def no_training(*_args, **_kwargs):
        raise AssertionError("fine-tuned again although the inputs did not change")

    monkeypatch.setattr(finetune_module, "_train", no_training)
    code, again, err = run_cli(*args)
    assert code == 0, err
    assert again == out
    assert (metadata_file.stat().st_mtime_ns, metadata_file.read_bytes()) == before
    assert [p.name for p in (cache / "models").iterdir()] == [entries[0].name]

    # Nothing went to the default test cache (the autouse fixture's): the variable decides.
    assert not (tmp_path / "cache").exists()


def test_finetune_seeds_one_model_per_seed_cached_and_deterministic(
    tiny_bert, run_cli, tmp_path, monkeypatch
):
    from attrib_bench.model import finetune as finetune_module
    from attrib_bench.model.load import load_model

    cache = tmp_path / "my-cache"
    monkeypatch.setenv("ATTRIB_BENCH_CACHE", str(cache))
    output = tmp_path / "seeds"
    common = ("finetune", "--model", tiny_bert, "--dataset", "default", "--limit", "32")
    common += ("--batch-size", "16", "--quiet")
    code, out, err = run_cli(*common, "--seeds", "0,1", "--output", output)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2, out
    for seed, line in zip((0, 1), lines, strict=True):
        assert line.startswith(f"seed {seed}: model: {output / f'seed-{seed}'}  accuracy: 0."), line
        assert "training seconds: " in line
    models = [
        load_model(str(output / f"seed-{seed}"), "cpu", architectures=ARCHITECTURES)
        for seed in (0, 1)
    ]
    assert models[0].weights_sha256 != models[1].weights_sha256  # two different models
    shapes = [{k: v.shape for k, v in m.model.state_dict().items()} for m in models]
    assert shapes[0] == shapes[1]  # of the same architecture
    configs = [{**m.model.config.to_dict(), "_name_or_path": None} for m in models]
    assert configs[0] == configs[1]
    entries = sorted((cache / "models").iterdir())
    assert len(entries) == 2
    seeds = {finetune_module.read_metadata(e)["config"]["seed"] for e in entries}
    assert seeds == {0, 1}

    # The same seeds again (in another order, without --output): both cached, nothing trained;
    # the cache paths are printed, as the single fine-tune prints its own.
    def no_training(*_args, **_kwargs):
        raise AssertionError("fine-tuned again although the inputs did not change")

    with monkeypatch.context() as patched:
        patched.setattr(finetune_module, "_train", no_training)
        code, again, err = run_cli(*common, "--seeds", "1,0")
        assert code == 0, err
        by_seed = {e.name: finetune_module.read_metadata(e)["config"]["seed"] for e in entries}
        printed = re.findall(r"seed (\d): model: (\S+)", again)
        assert [(int(s), by_seed[Path(p).name]) for s, p in printed] == [(1, 1), (0, 0)]
        # The single fine-tune with one of those seeds shares its cache entry.
        code, single, err = run_cli(*common, "--seed", "1")
        assert code == 0, err
        assert f"model: {dict(printed)['1']}" in single
    assert sorted((cache / "models").iterdir()) == entries

    # Determinism: seed 1 trained afresh in an empty cache gives the same weights.
    monkeypatch.setenv("ATTRIB_BENCH_CACHE", str(tmp_path / "fresh-cache"))
    code, fresh, err = run_cli(*common, "--seed", "1")
    assert code == 0, err
    directory = re.search(r"model: (\S+)", fresh).group(1)
    assert (
        load_model(directory, "cpu", architectures=ARCHITECTURES).weights_sha256
        == models[1].weights_sha256
    )


def test_finetune_seed_drives_head_initialisation_and_dropout(tiny_bert, tmp_path):
    """An encoder without a head, learning rate 0: the seeds' heads differ, the shared encoder
    does not. A classifier with its head, one batch (so one data order): dropout differs."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from attrib_bench.model.finetune import FinetuneConfig, finetune_seeds
    from attrib_bench.model.load import load_model

    encoder = tmp_path / "encoder"
    BertModel(BertConfig.from_pretrained(tiny_bert)).save_pretrained(encoder)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(encoder)
    config = FinetuneConfig(model=str(encoder), dataset="default", limit=8, batch_size=8)
    states = [
        load_model(str(d), "cpu", architectures=ARCHITECTURES).model.state_dict()
        for d in finetune_seeds(
            replace(config, learning_rate=0.0), [0, 1], quiet=True, architectures=ARCHITECTURES
        )
    ]
    heads = [k for k in states[0] if k.startswith("classifier.")]
    assert heads and not torch.equal(states[0]["classifier.weight"], states[1]["classifier.weight"])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0] if k not in heads)

    trained = [
        load_model(str(d), "cpu", architectures=ARCHITECTURES).weights_sha256
        for d in finetune_seeds(
            replace(config, model=str(tiny_bert)), [0, 1], quiet=True, architectures=ARCHITECTURES
        )
    ]
    assert trained[0] != trained[1]


# ------------------------------------------------------------------------------------- MiniLM


@pytest.mark.slow
def test_minilm_encoder_end_to_end(minilm, run_cli, tmp_path):
    document, out, err = run_json(
        run_cli,
        tmp_path,
        "--model",
        minilm,
        "--dataset",
        "default",
        "--limit",
        "4",
        "--attributors",
        "attention,rollout,saliency",
        "--quiet",
        "--batch-size",
        "4",
    )
    assert "has no trained classification head" in err
    assert "spearman vs saliency" in out
    assert document["provenance"]["model"]["fresh_head"] is True
    assert document["provenance"]["model"]["type"] == "bert"
    for spec, expected in (("attention", 6), ("rollout", 6), ("saliency", 1)):
        method = document["methods"][spec]
        assert method["status"] == "ok"
        assert len(method["scores"]["spearman"]["aggregated"]) == expected


# ------------------------------------------------------------------------------ python -m entry


@pytest.mark.filterwarnings("ignore:'attrib_bench.cli' found in sys.modules:RuntimeWarning")
def test_python_dash_m_runs_the_cli(monkeypatch, capsys):
    """What ``python -m attrib_bench.cli --version`` does, without paying for a new process."""
    monkeypatch.setattr(sys, "argv", ["attrib-bench", "--version"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("attrib_bench.cli", run_name="__main__")
    assert exited.value.code in (0, None)
    assert capsys.readouterr().out.strip() == f"attrib-bench {attrib_bench.__version__}"


# ------------------------------------------------------------------------------- startup cost

#: Run ``main`` with the arguments, then print the heavy libraries the process imported.
IMPORTS_PROBE = """
import sys
from attrib_bench.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = ("torch", "transformers", "datasets", "captum", "scipy", "matplotlib")
print("imported:", *[name for name in heavy if name in sys.modules], file=sys.__stderr__)
"""


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (["--help"], set()),
        (["run", "--attributors", ""], set()),  # a usage error from argparse
        (["check", "missing.json", "--baseline", "missing.json"], set()),
        (["list", "--json"], {"torch"}),  # plugins import torch; nothing else
    ],
)
def test_light_commands_do_not_import_heavy_libraries(args, allowed, tmp_path):
    """--help, usage errors, check and list answer in about a second: no transformers import."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_PROBE, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    last = done.stderr.strip().splitlines()[-1].split()
    assert last[0] == "imported:", done.stderr
    assert set(last[1:]) <= allowed, done.stderr
