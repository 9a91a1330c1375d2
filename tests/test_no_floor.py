"""``run --no-floor`` (``floor = false`` in a config file): no `random` row unless selected; the
other rows, their cache entries and the gate are unaffected."""

from __future__ import annotations

import json

from attrib_bench.runner.cache import NO_CACHE_ENV

ARGS = ("--limit", "6", "--attributors", "attention", "--quiet")


def run(run_cli, tmp_path, model, *extra, name):
    output = tmp_path / name
    code, out, err = run_cli("run", "--model", model, *ARGS, *extra, "--output", output)
    assert code == 0, err
    return json.loads(output.read_text()), out, err


def test_no_floor_drops_the_random_row_and_keeps_everything_else(
    tiny_bert, run_cli, tmp_path, monkeypatch
):
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)  # the cache as users get it
    with_floor, _, _ = run(run_cli, tmp_path, tiny_bert, name="floor.json")
    assert with_floor["methods"]["random"]["added_as_floor"]
    assert with_floor["config"]["floor"] is True

    without, out, err = run(run_cli, tmp_path, tiny_bert, "--no-floor", name="none.json")
    assert set(without["methods"]) == {"attention", "saliency"}  # the reference stays
    assert "random" not in out and "added as the floor" not in out + err
    assert without["config"]["floor"] is False
    assert without["cache"]["hits"] == {"attention": 6, "saliency": 6}  # same keys: reused
    for spec in ("attention", "saliency"):
        assert without["methods"][spec]["scores"] == with_floor["methods"][spec]["scores"]
        assert without["methods"][spec]["per_example"] == with_floor["methods"][spec]["per_example"]

    # The gate reads a missing floor as a removed method, not a regression.
    code, out, err = run_cli("check", tmp_path / "none.json", "--baseline", tmp_path / "floor.json")
    assert code == 0, out + err


def test_a_selected_random_stays_and_the_config_file_says_floor_false(tiny_bert, run_cli, tmp_path):
    chosen, _, _ = run(
        run_cli, tmp_path, tiny_bert, "--no-floor", "--attributors", "attention,random",
        name="chosen.json",
    )  # fmt: skip
    assert "random" in chosen["methods"] and not chosen["methods"]["random"]["added_as_floor"]

    config = tmp_path / "bench.toml"
    config.write_text(f'model = "{tiny_bert}"\nfloor = false\nlimit = 6\n')
    code, _, err = run_cli(
        "run", "--config", config, "--attributors", "attention", "--quiet",
        "--output", tmp_path / "file.json",
    )  # fmt: skip
    assert code == 0, err
    assert "random" not in json.loads((tmp_path / "file.json").read_text())["methods"]

    config.write_text(f'model = "{tiny_bert}"\nfloor = "no"\n')
    code, _, err = run_cli("run", "--config", config, "--quiet")
    assert code == 2 and "floor must be true or false" in err
