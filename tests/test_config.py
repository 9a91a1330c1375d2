"""TOML benchmark configs: parsing, paths, flags that override, errors, the shipped examples."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from attrib_bench.core.errors import UsageError
from attrib_bench.runner.config import make_plan, read_config

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_setting_is_read_and_paths_are_relative_to_the_file(tmp_path, tiny_bert):
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "test.csv").write_text("text,label\ngood,1\n")
    config = write(
        tmp_path / "conf" / "bench.toml",
        f"""
        model = "{tiny_bert}"
        dataset = "data/test.csv"
        split = "test"
        text_column = "text"
        label_column = "label"
        limit = 5
        max_length = 32
        attributors = [
            "attention", "rollout:residual=0.9", {{ name = "norm", normalize_rows = true }},
        ]
        evaluators = [{{ name = "spearman", drop_special = false }}]
        reference = {{ name = "integrated-gradients", steps = 8 }}
        seed = 3
        batch_size = 2
        device = "cpu"
        plugins = ["plugins/mine.py"]
        output = "out/result.json"
        cache = false
        """.replace("\n        ", "\n"),
    )
    values = read_config(config)
    assert values["model"] == str(tiny_bert)
    assert values["dataset"] == str(tmp_path / "conf" / "data" / "test.csv")
    assert values["attributors"] == [
        "attention",
        "rollout:residual=0.9",
        "norm:normalize_rows=true",
    ]
    assert values["evaluators"] == ["spearman:drop_special=false"]
    assert values["reference"] == "integrated-gradients:steps=8"
    assert values["plugins"] == [str(tmp_path / "conf" / "plugins" / "mine.py")]
    assert values["output"] == tmp_path / "conf" / "out" / "result.json"
    assert (values["seed"], values["batch_size"], values["limit"], values["cache"]) == (
        3,
        2,
        5,
        False,
    )

    # Names that are not paths next to the file stay as written (hub ids, 'default').
    other = write(tmp_path / "other.toml", 'dataset = "glue/sst2"\nmodel = "bert-base-uncased"\n')
    assert read_config(other) == {"dataset": "glue/sst2", "model": "bert-base-uncased"}


def test_flags_given_override_the_file_and_flags_left_out_do_not(tiny_bert, run_cli, tmp_path):
    config = write(
        tmp_path / "bench.toml",
        f'model = "{tiny_bert}"\nlimit = 6\nseed = 3\nbatch_size = 2\n'
        'attributors = ["attention", "random"]\noutput = "from-file.json"\n',
    )
    code, out, err = run_cli("run", "--config", config, "--limit", "4", "--quiet")
    assert code == 0, err
    document = json.loads((tmp_path / "from-file.json").read_text())
    assert document["config"]["limit"] == 4  # the flag
    assert document["config"]["seed"] == 3 and document["config"]["batch_size"] == 2  # the file
    assert document["config"]["attributors"] == ["attention", "random"]
    assert len(document["example_ids"]) == 4 and "attention" in out

    code, _, err = run_cli(
        "run", "--config", config, "--seed", "0", "--quiet", "--output", tmp_path / "flag.json"
    )
    assert code == 0, err
    assert json.loads((tmp_path / "flag.json").read_text())["config"]["seed"] == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "limt = 3\n",
            "unknown top-level key(s) limt; valid keys: agreement_k, attributors, batch_size",
        ),
        ('limit = "3"\n', "limit must be an integer, got '3'"),
        ("seed = true\n", "seed must be an integer, got True"),
        ("attributors = []\n", "attributors must be a non-empty list of specs"),
        ("attributors = [{ residual = 0.9 }]\n", "write a spec string or a table with a 'name'"),
        ("cache = 1\n", "cache must be true or false"),
        ("limit = [\n", "is not valid TOML"),
        ('model = "m"\n[finetune]\nlimit = 4\n', "give either model (a classifier) or [finetune]"),
        ("[finetune]\nepoch = 2\n", "unknown [finetune] key(s) epoch; valid keys:"),
        ('[finetune]\nlearning_rate = "fast"\n', "finetune.learning_rate must be a number"),
    ],
)
def test_bad_configs_are_one_line_usage_errors(run_cli, tmp_path, text, message):
    config = write(tmp_path / "bad.toml", text)
    code, out, err = run_cli("run", "--config", config, "--quiet")
    assert code == 2 and out == ""
    assert message in " ".join(err.split())


def test_a_missing_config_and_unknown_overrides(run_cli, tmp_path):
    code, _, err = run_cli("run", "--config", tmp_path / "nope.toml")
    assert code == 2 and "does not exist" in err
    with pytest.raises(UsageError, match="unknown setting"):
        make_plan(None, {"limt": 3})


def test_finetune_table_builds_the_model_first(tiny_bert, run_cli, tmp_path):
    config = write(
        tmp_path / "bench.toml",
        'limit = 4\nattributors = ["attention"]\noutput = "r.json"\n'
        f'[finetune]\nmodel = "{tiny_bert}"\ndataset = "default"\nlimit = 32\nbatch_size = 16\n',
    )
    code, _, err = run_cli("run", "--config", config, "--quiet")
    assert code == 0, err
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["finetune"]["train_examples"] == 32
    assert document["finetune"]["config"]["model"] == str(tiny_bert)
    assert Path(document["config"]["model"]).parent.name == "models"  # the cached fine-tune
    assert not document["provenance"]["model"]["fresh_head"]


def _script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem + "_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_configs_are_valid():
    from attrib_bench.core.registry import load_registry

    registry = load_registry()
    configs = sorted(BENCHMARKS.glob("*.toml"))
    assert {p.name for p in configs} >= {"default.toml", "globenc_sst2.toml", "ci.toml"}
    for config in configs:
        plan = make_plan(config, {})
        for spec in [*(plan.config.attributors or []), plan.config.reference]:
            registry.attributor(spec)
        for spec in plan.config.evaluators or []:
            registry.evaluator(spec)


def _same_path(a: str | None, b: str | Path) -> bool:
    return a is not None and Path(a).resolve() == Path(b).resolve()


def test_the_globenc_config_is_the_benchmark_script():
    """Same fine-tuning inputs, data and methods as the script.

    Paths are compared resolved: the config resolves symlinks, the script does not, and
    ``../shared`` may be one.
    """
    from attrib_bench.model.finetune import FinetuneConfig, default_model_source
    from attrib_bench.runner.state import RunConfig

    script = _script(BENCHMARKS / "globenc_sst2.py")
    plan = make_plan(BENCHMARKS / "globenc_sst2.toml", {})
    assert _same_path(plan.finetune.dataset, script.SST2)
    assert _same_path(plan.config.dataset, script.SST2)
    expected = FinetuneConfig(
        model=default_model_source(), dataset=plan.finetune.dataset, split="train", limit=20000
    )
    assert plan.finetune == expected
    specs = [name for name, _, _ in script.VARIANTS] + [
        f"{base}:residual={r}" for base in ("rollout", "norm-fixedres") for r in script.SWEEP
    ]
    assert plan.config == RunConfig(
        dataset=plan.config.dataset,
        split="dev",
        attributors=specs,
        evaluators=["spearman"],
        reference="saliency",
        batch_size=32,
        device="cpu",
    )


def test_the_globenc_config_shares_the_scripts_cached_model():
    from attrib_bench.model.finetune import FinetuneConfig, cache_key, default_model_source

    script = _script(BENCHMARKS / "globenc_sst2.py")
    plan = make_plan(BENCHMARKS / "globenc_sst2.toml", {})
    as_the_script = FinetuneConfig(
        model=default_model_source(), dataset=str(script.SST2), split="train", limit=20000
    )
    # The config resolves ../shared (a symlink on some machines), the script does not: the key
    # must not depend on the spelling.
    assert cache_key(plan.finetune, "data") == cache_key(as_the_script, "data")


def test_one_local_dataset_has_one_fingerprint_however_it_is_spelt(tmp_path, monkeypatch):
    from attrib_bench.data.load import load_examples
    from attrib_bench.model.finetune import FinetuneConfig, cache_key

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    spellings = [str(tmp_path / "real"), "real", "link", "./link/../real"]
    fingerprints = {load_examples(name, "train").fingerprint for name in spellings}
    assert len(fingerprints) == 1
    keys = {cache_key(FinetuneConfig(model="m", dataset=name), "data") for name in spellings}
    assert len(keys) == 1
