"""Plugins: entry-point discovery, ``--plugin FILE``, name clashes, failures and parameters."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "plugin_fixtures"
EXAMPLE_PLUGIN = FIXTURES / "example_plugin.py"
SCRIPT = Path(sys.executable).parent / "attrib-bench"
#: The installed console script; the same entry function through ``python -c`` if it is missing.
CLI = (
    [str(SCRIPT)]
    if SCRIPT.is_file()
    else [sys.executable, "-c", "from attrib_bench.cli import entry; entry()"]
)
BUILTIN_ATTENTION_SOURCE = (
    f"attrib-bench {importlib.metadata.version('attrib-bench')} "
    "(attention = attrib_bench_plugins.attention)"
)

#: An attributor whose scores fall with the token position: simple, deterministic, not constant.
POSITION_DECAY = """
    import torch

    import attrib_bench


    class PositionDecay:
        name = "{name}"
        description = "Scores fall linearly with the token position"
        requires = frozenset()

        def attribute(self, trace):
            mask_BN = trace.mask_BN.to(torch.float32)
            decay_N = torch.arange(mask_BN.shape[1], 0, -1, dtype=torch.float32)
            scores_BN = mask_BN * decay_N.to(mask_BN.device)
            return attrib_bench.Attribution(aggregated_BLN=scores_BN[:, None, :])


    @attrib_bench.hookimpl
    def attrib_bench_attributors():
        return [PositionDecay()]
"""


def write_module(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def make_site(root: Path, distribution: str, module: str, source: str) -> Path:
    """A site directory holding ``module`` and an installed distribution that registers it."""
    write_module(root / f"{module}.py", source)
    info = root / f"{distribution}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[attrib_bench]\nmy_plugin = {module}\n")
    (info / "RECORD").write_text("")
    return root


def start_subprocess(args, site: Path) -> subprocess.Popen:
    """Start the installed command with ``site`` on the Python path; ``.communicate()`` it."""
    paths = [str(site), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "COLUMNS": "250"}
    return subprocess.Popen(
        [*CLI, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> str:
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0]
    assert code == 2
    return lines[0]


def run_json(run_cli, tmp_path, *args, expect=0, name="result.json"):
    output = tmp_path / name
    code, out, err = run_cli("run", *args, "--output", output)
    assert code == expect, err
    return json.loads(output.read_text()), out, err


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")


# ------------------------------------------------------------------------ entry-point plugins


def test_entry_point_plugin_is_discovered_and_runs(tiny_bert, run_cli, tmp_path, monkeypatch):
    """Listed by the installed command, from the shell; run in this process with the same
    site on its path (a second process would spend its time importing transformers)."""
    site = make_site(  # a module name of its own: this process keeps what it imports
        tmp_path / "site",
        "decay_attrib_plugin",
        "decay_attrib_plugin",
        POSITION_DECAY.format(name="position-decay"),
    )
    output = tmp_path / "result.json"
    run_args = ["run", "--model", tiny_bert, "--limit", "4", "--attributors", "position-decay"]
    listing = start_subprocess(["list", "--json"], site)
    monkeypatch.syspath_prepend(str(site))
    ran_code, ran_out, ran_err = run_cli(*run_args, "--quiet", "--output", output)
    listed_out, listed_err = listing.communicate(timeout=300)

    assert listing.returncode == 0, listed_err
    attributors = {a["name"]: a for a in json.loads(listed_out)["attributors"]}
    assert attributors["position-decay"]["plugin"] == (
        "decay_attrib_plugin 1.0 (my_plugin = decay_attrib_plugin)"
    )
    assert attributors["position-decay"]["description"].startswith("Scores fall")
    assert attributors["attention"]["plugin"] == BUILTIN_ATTENTION_SOURCE

    assert ran_code == 0, ran_err
    assert "position-decay" in ran_out
    method = json.loads(output.read_text())["methods"]["position-decay"]
    assert method["status"] == "ok"
    assert method["plugin"].startswith("decay_attrib_plugin 1.0")
    (summary,) = method["scores"]["spearman"]["aggregated"]
    assert summary["n"] == 4 and -1.0 <= summary["mean"] <= 1.0


def test_entry_point_plugin_that_fails_to_import_is_skipped(run_cli, tmp_path, monkeypatch):
    site = make_site(
        tmp_path / "site", "broken_plugin_dist", "broken_attrib_plugin", "import no_such_module\n"
    )
    monkeypatch.syspath_prepend(str(site))
    code, out, err = run_cli("list", "--json")
    assert code == 0, err
    assert "broken_plugin_dist 1.0 (my_plugin = broken_attrib_plugin) failed to import" in err
    assert "no_such_module" in err
    names = {a["name"] for a in json.loads(out)["attributors"]}
    assert {"attention", "saliency"} <= names


def test_a_third_party_method_joins_no_default_set(run_cli, tmp_path, monkeypatch):
    """Installing a plugin (or loading a --plugin file) leaves the default set alone: it is
    attrib-bench's own methods; the others are listed as left out and run when named."""
    from attrib_bench.core.registry import load_registry

    decay = POSITION_DECAY.format(name="decay")
    site = make_site(tmp_path / "site", "my_attrib_plugin", "my_attrib_plugin", decay)
    monkeypatch.syspath_prepend(str(site))
    local = write_module(tmp_path / "local.py", POSITION_DECAY.format(name="local-decay"))
    registry = load_registry([local])
    assert registry.attributors["attention"].shipped
    assert not registry.attributors["decay"].shipped
    assert not registry.attributors["local-decay"].shipped
    defaults = registry.defaults("attributors")
    assert "attention" in defaults and "hta" not in defaults  # in_default_run still counts
    assert "decay" not in defaults and "local-decay" not in defaults
    assert registry.left_out_of_default() == ["decay", "local-decay"]
    assert "decay" in registry.attributor("decay").name  # named, it runs
    code, out, err = run_cli("list", "--json")
    assert code == 0, err
    listed = {a["name"]: a["default_run"] for a in json.loads(out)["attributors"]}
    assert listed["decay"] is False and listed["attention"] is True


def test_a_default_run_records_its_set_and_names_what_it_left_out(
    tiny_bert, run_cli, tmp_path, monkeypatch
):
    from attrib_bench.core.registry import load_registry
    from attrib_bench.results import SCHEMA_PATH

    decay = POSITION_DECAY.format(name="decay")
    site = make_site(tmp_path / "site", "my_attrib_plugin", "my_attrib_plugin", decay)
    monkeypatch.syspath_prepend(str(site))
    document, _, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--limit", "2", "--batch-size", "2", "--quiet"
    )
    defaults = load_registry().defaults("attributors")
    assert set(document["methods"]) == {*defaults, "saliency"} - {"decay"}
    assert document["provenance"]["default_attributors"] == {
        "used": True,
        "names": defaults,
        "left_out": ["decay"],
    }
    (line,) = [line for line in err.splitlines() if "not in the default run" in line]
    assert ": decay; name them to run them: --attributors" in line
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(document)

    named, _, err = run_json(
        run_cli, tmp_path, "--model", tiny_bert, "--limit", "2", "--quiet",
        "--attributors", "decay", "--evaluators", "spearman", name="named.json",
    )  # fmt: skip
    assert "decay" in named["methods"] and "not in the default run" not in err
    assert named["provenance"]["default_attributors"]["used"] is False


# ------------------------------------------------------------------------------ name clashes

CLASH_WITH_ATTENTION = """
    import attrib_bench


    class Impostor:
        name = "attention"
        description = "Same name as a built-in"
        requires = frozenset()

        def attribute(self, trace):
            raise NotImplementedError


    @attrib_bench.hookimpl
    def attrib_bench_attributors():
        return [Impostor()]
"""


@pytest.mark.parametrize("command", ["list", "run"])
def test_plugin_clashing_with_a_builtin_names_both(command, run_cli, tmp_path):
    plugin = write_module(tmp_path / "impostor.py", CLASH_WITH_ATTENTION)
    code, out, err = run_cli(
        command, "--plugin", plugin, *(["--quiet"] if command == "run" else [])
    )
    line = assert_one_line_error(code, out, err, "'attention'", BUILTIN_ATTENTION_SOURCE)
    assert f"file {plugin}" in line


@pytest.mark.parametrize("command", ["list", "run"])
def test_two_plugin_files_with_one_name_names_both(command, run_cli, tmp_path):
    first = write_module(tmp_path / "one" / "decay_a.py", POSITION_DECAY.format(name="decay"))
    second = write_module(tmp_path / "two" / "decay_b.py", POSITION_DECAY.format(name="decay"))
    args = [command, "--plugin", first, "--plugin", second]
    code, out, err = run_cli(*args, *(["--quiet"] if command == "run" else []))
    assert_one_line_error(
        code, out, err, "two plugins register the attributor 'decay'", f"file {first}", str(second)
    )


# ------------------------------------------------------------------------- --plugin FILE.py


def test_local_plugin_file_is_listed_and_used(tiny_bert, run_cli, tmp_path, wide):
    plugin = write_module(tmp_path / "local_decay.py", POSITION_DECAY.format(name="local-decay"))
    code, out, err = run_cli("list", "--json", "--plugin", plugin)
    assert code == 0, err
    attributors = {a["name"]: a for a in json.loads(out)["attributors"]}
    assert attributors["local-decay"]["plugin"] == f"file {plugin}"

    document, out, _ = run_json(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--limit",
        "4",
        "--attributors",
        "local-decay,attention",
        "--plugin",
        plugin,
        "--quiet",
    )
    assert "local-decay" in out
    method = document["methods"]["local-decay"]
    assert method["status"] == "ok" and method["plugin"] == f"file {plugin}"
    assert method["scores"]["spearman"]["aggregated"][0]["n"] == 4
    assert document["config"]["plugins"] == [str(plugin)]


# ---------------------------------------------------------------------- a plugin that fails

FAILS_ON_SECOND_BATCH = """
    import torch

    import attrib_bench


    class Flaky:
        name = "flaky"
        description = "Works on the first batch, raises on the second"
        requires = frozenset()

        def __init__(self):
            self.batches = 0

        def attribute(self, trace):
            self.batches += 1
            if self.batches == 2:
                raise RuntimeError("flaky broke on batch 2")
            mask_BN = trace.mask_BN.to(torch.float32)
            return attrib_bench.Attribution(aggregated_BLN=mask_BN[:, None, :])


    @attrib_bench.hookimpl
    def attrib_bench_attributors():
        return [Flaky()]
"""


def test_failing_plugin_is_marked_failed_and_the_run_goes_on(tiny_bert, run_cli, tmp_path, wide):
    from attrib_bench import ExitCode

    plugin = write_module(tmp_path / "flaky.py", FAILS_ON_SECOND_BATCH)
    document, out, err = run_json(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--limit",
        "4",
        "--batch-size",
        "2",
        "--attributors",
        "flaky,attention",
        "--plugin",
        plugin,
        "--quiet",
        expect=ExitCode.PARTIAL,
    )
    assert ExitCode.PARTIAL == 3
    flaky = document["methods"]["flaky"]
    assert flaky["status"] == "failed"
    assert flaky["error"] == "RuntimeError: flaky broke on batch 2"
    assert flaky["scores"] == {} and flaky["seconds_per_example"] is None
    attention = document["methods"]["attention"]
    assert attention["status"] == "ok" and attention["error"] is None
    assert attention["scores"]["spearman"]["aggregated"][0]["n"] == 4
    assert document["evaluators"]["spearman"]["status"] == "ok"
    row = next(line for line in out.splitlines() if line.startswith("│ flaky "))
    assert "failed: RuntimeError: flaky broke on batch 2" in row
    assert "flaky failed and is dropped: RuntimeError: flaky broke on batch 2" in err


def test_failing_plugin_in_attribute_writes_an_error_record(tiny_bert, run_cli, tmp_path):
    plugin = write_module(tmp_path / "flaky.py", FAILS_ON_SECOND_BATCH)
    output = tmp_path / "out.jsonl"
    code, _, err = run_cli(
        "attribute",
        "--model",
        tiny_bert,
        "--limit",
        "4",
        "--batch-size",
        "2",
        "--attributors",
        "flaky,attention",
        "--plugin",
        plugin,
        "--quiet",
        "--output",
        output,
    )
    assert code == 3, err
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert records[-1] == {"method": "flaky", "error": "RuntimeError: flaky broke on batch 2"}
    by_method = {}
    for record in records[:-1]:
        by_method.setdefault(record["method"], []).append(record["id"])
    assert len(by_method["attention"]) == 4
    assert len(by_method["flaky"]) == 2  # the first batch only


EVALUATORS = """
    import numpy as np

    import attrib_bench


    class FirstTokenShare:
        name = "first-token-share"
        description = "Share of the attribution mass on the first token"
        needs_reference = False

        def score(self, attribution, context):
            rows_BLN = np.abs(attribution.aggregated_BLN.detach().cpu().numpy())
            rows_BLN = rows_BLN * context.trace.mask_BN.cpu().numpy()[:, None, :]
            share_BL = rows_BLN[:, :, 0] / rows_BLN.sum(axis=-1)
            return {"aggregated": share_BL.T}


    class Broken:
        name = "broken-evaluator"
        description = "Raises on every attribution"
        needs_reference = False

        def score(self, attribution, context):
            raise ValueError("cannot score this")


    @attrib_bench.hookimpl
    def attrib_bench_evaluators():
        return [FirstTokenShare(), Broken()]
"""


def test_evaluator_plugins_score_and_fail_alone(tiny_bert, run_cli, tmp_path, wide):
    plugin = write_module(tmp_path / "evaluators.py", EVALUATORS)
    code, out, err = run_cli("list", "--json", "--plugin", plugin)
    assert code == 0, err
    evaluators = {e["name"]: e for e in json.loads(out)["evaluators"]}
    assert evaluators["first-token-share"]["plugin"] == f"file {plugin}"
    assert {"spearman", "broken-evaluator"} <= set(evaluators)

    document, out, _ = run_json(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--limit",
        "4",
        "--attributors",
        "attention,random",
        "--evaluators",
        "spearman,first-token-share,broken-evaluator",
        "--plugin",
        plugin,
        "--quiet",
        expect=3,
    )
    ok = {"status": "ok", "error": None}
    assert document["evaluators"] == {
        "spearman": ok,
        "first-token-share": ok,
        "broken-evaluator": ok,  # it failed per method, not as a whole
    }
    assert document["provenance"]["evaluator_plugins"]["first-token-share"] == f"file {plugin}"
    assert "broken-evaluator failed: ValueError: cannot score this" in " ".join(out.split())
    assert "first-token-share (aggregated)" in out  # it needs no reference: no "vs saliency"
    for spec, layers in (("attention", 3), ("random", 1)):
        method = document["methods"][spec]
        assert method["status"] == "ok"
        assert method["evaluators"]["broken-evaluator"] == {
            "status": "failed",
            "error": "ValueError: cannot score this",
        }
        assert method["evaluators"]["spearman"] == ok
        assert set(method["scores"]) == {"spearman", "first-token-share"}
        shares = method["scores"]["first-token-share"]["aggregated"]
        assert len(shares) == layers
        assert all(s["n"] == 4 and 0.0 < s["mean"] < 1.0 for s in shares)


# ------------------------------------------------------------------------------- parameters


def test_parameters_make_their_own_rows(tiny_bert, run_cli, tmp_path, wide):
    specs = "rollout,rollout:residual=0.7,attention:residual=0.5,integrated-gradients:steps=2,"
    specs += "chunk_tokens=40,saliency"
    document, out, _ = run_json(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--limit",
        "4",
        "--attributors",
        specs,
        "--quiet",
    )
    assert list(document["methods"]) == [
        "rollout",
        "rollout:residual=0.7",
        "attention:residual=0.5",
        "integrated-gradients:steps=2,chunk_tokens=40",
        "saliency",
        "random",  # added as the floor
    ]
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│ ")]
    assert sorted(rows) == sorted(document["methods"])
    methods = document["methods"]
    assert methods["rollout:residual=0.7"]["name"] == "rollout"
    assert all(m["status"] == "ok" for m in methods.values())

    def per_example(spec):
        return methods[spec]["per_example"]["spearman"]["aggregated"]

    # The parameter reaches the method: another residual gives other numbers, and raw attention
    # with rollout's default residual (0.5) is rollout.
    assert per_example("rollout:residual=0.7") != per_example("rollout")
    for a, b in zip(per_example("attention:residual=0.5"), per_example("rollout"), strict=True):
        assert a == pytest.approx(b, abs=1e-9)


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("rollout:depth=2", ["'depth'", "'rollout'", "valid parameters: residual"]),
        ("rollout:residual=1.5", ["rollout:residual", "1.5", "[0, 1)"]),
        ("rollout:residual=-0.1", ["rollout:residual", "-0.1", "[0, 1)"]),
        ("rollout:residual=abc", ["rollout:residual", "'abc'", "float"]),
        ("saliency:target=logit", ["'logit'", "saliency:target", "predicted, gold"]),
        ("integrated-gradients:steps=0", ["integrated-gradients:steps", ">= 1"]),
        ("random:seed=x", ["random:seed", "'x'", "int"]),
    ],
)
def test_bad_parameters_are_usage_errors(spec, needles, run_cli):
    code, out, err = run_cli("run", "--attributors", spec, "--quiet")
    assert_one_line_error(code, out, err, *needles)


def test_range_errors_name_only_the_offending_value():
    """Every built-in's range error says ``name:key must be ..., got VALUE``: the value alone,
    never the whole parameter table (which buried the number the user got wrong)."""
    from attrib_bench.core.configurable import Configurable, parse_value
    from attrib_bench.core.errors import UsageError
    from attrib_bench.core.registry import load_registry

    registry = load_registry()
    refused = []
    for table in (registry.attributors, registry.evaluators):
        for name, registered in table.items():
            if not isinstance(registered.obj, Configurable):
                continue
            for key, default in registered.obj.parameters.items():
                if isinstance(default, bool) or not isinstance(default, int | float):
                    continue
                for raw in ("-4", "0", "1.5" if isinstance(default, float) else "-1"):
                    try:
                        registered.obj.configure({key: raw})
                    except UsageError as error:
                        value = parse_value(raw, default)
                        refused.append(str(error))
                        assert str(error).startswith(f"{name}:{key} must be "), str(error)
                        assert str(error).endswith(f", got {value!r}"), str(error)
    assert any(m.startswith("integrated-gradients:steps must be") for m in refused), refused
    assert "integrated-gradients:steps must be >= 1, got -4" in refused


def test_parameters_for_a_plugin_without_configure(run_cli, tmp_path):
    plugin = write_module(tmp_path / "plain.py", POSITION_DECAY.format(name="plain"))
    code, out, err = run_cli("run", "--plugin", plugin, "--attributors", "plain:x=1", "--quiet")
    assert_one_line_error(code, out, err, "'plain'", "takes no parameters", "plain:x=1")


# ------------------------------------------------------------------- plugins that are wrong

NOT_AN_ATTRIBUTOR = """
    import attrib_bench


    class NoDescription:
        name = "no-description"
        requires = frozenset()

        def attribute(self, trace):
            raise NotImplementedError


    @attrib_bench.hookimpl
    def attrib_bench_attributors():
        return [NoDescription()]
"""

UNKNOWN_TRACE_FIELD = """
    import attrib_bench


    class WantsLogits:
        name = "wants-logits"
        description = "Requires a trace field that does not exist"
        requires = frozenset({"logits"})

        def attribute(self, trace):
            raise NotImplementedError


    @attrib_bench.hookimpl
    def attrib_bench_attributors():
        return [WantsLogits()]
"""


def test_plugin_returning_a_non_attributor_is_rejected(run_cli, tmp_path):
    plugin = write_module(tmp_path / "nodesc.py", NOT_AN_ATTRIBUTOR)
    code, out, err = run_cli("list", "--plugin", plugin)
    assert_one_line_error(code, out, err, f"file {plugin}", "attrib_bench.Attributor")


def test_plugin_requiring_an_unknown_trace_field(tiny_bert, run_cli, tmp_path):
    plugin = write_module(tmp_path / "logits.py", UNKNOWN_TRACE_FIELD)
    # `attribute`, not `run`: `run --quiet` still draws a progress bar (see test_cli.py).
    code, out, err = run_cli(
        "attribute",
        "--output",
        tmp_path / "out.jsonl",
        "--model",
        tiny_bert,
        "--limit",
        "2",
        "--plugin",
        plugin,
        "--attributors",
        "wants-logits",
        "--quiet",
    )
    assert_one_line_error(code, out, err, "'logits'", "attentions", "hidden_states")


# ----------------------------------------------------------------- the README example plugin


def test_readme_example_plugin(tiny_bert, run_cli, tmp_path, wide):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from attrib_bench.data.load import load_examples

    source = EXAMPLE_PLUGIN.read_text()
    assert source.startswith("# --8<-- [start:example]\n")
    assert source.rstrip().endswith("# --8<-- [end:example]")

    code, out, err = run_cli("list", "--json", "--plugin", EXAMPLE_PLUGIN)
    assert code == 0, err
    listed = {a["name"]: a for a in json.loads(out)["attributors"]}["cls-max-attention"]
    assert listed["description"] == "Last-layer attention from [CLS] to each token, max over heads"

    common = ("--model", tiny_bert, "--limit", "4", "--batch-size", "4", "--quiet")
    common += ("--plugin", EXAMPLE_PLUGIN, "--attributors", "cls-max-attention")
    document, out, _ = run_json(run_cli, tmp_path, *common)
    method = document["methods"]["cls-max-attention"]
    assert method["status"] == "ok"
    assert method["plugin"] == f"file {EXAMPLE_PLUGIN}"
    assert len(method["scores"]["spearman"]["aggregated"]) == 1
    assert "cls-max-attention" in out

    # Its numbers are what it says: the last layer's [CLS] row, max over heads, computed here
    # one example at a time (no padding) straight from the model.
    output = tmp_path / "example.jsonl"
    code, _, err = run_cli("attribute", *common, "--output", output)
    assert code == 0, err
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_bert, attn_implementation="eager"
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    texts = {e.id: e.text for e in load_examples("default", limit=4).examples}
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(texts)
    for record in records:
        encoded = tokenizer(texts[record["id"]], return_tensors="pt")
        with torch.no_grad():
            attention = model(**encoded, output_attentions=True).attentions[-1]
        expected = attention[0, :, 0, :].amax(dim=0).tolist()
        assert record["tokens"] == tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
        assert record["local"] is None
        assert record["aggregated"] == [pytest.approx(expected, abs=1e-5)]
