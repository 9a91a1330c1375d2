"""A run under torchrun with two gloo processes on the CPU equals the single-process run: every
per-example number, the statistics (computed after the merge) and the example ids, at a batch
size above 1 (each process runs whole batches of the single-process run); rank 0 alone writes
the result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attrib_bench.results import Result

ARGS = (
    "run", "--attributors", "attention,rollout,saliency,random",
    "--evaluators", "spearman,comprehensiveness:ratios=0.2/0.5",
    "--limit", "6", "--batch-size", "2", "--device", "cpu", "--no-cache", "--quiet",
)  # fmt: skip


def _torchrun(arguments: list[str], cache: Path) -> subprocess.CompletedProcess:
    """``attrib-bench`` under torchrun with two gloo processes on the CPU."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTRIB_BENCH_CACHE": str(cache)}
    # --standalone: a free port of its own, never one another job holds
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node", "2"]
    return subprocess.run(
        [*torchrun, "-m", "attrib_bench", *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def runs(tiny_bert, tmp_path_factory) -> dict[str, Result]:
    from attrib_bench.cli import main

    folder = tmp_path_factory.mktemp("distributed")
    single, launched = folder / "single.json", folder / "launched.json"
    arguments = [*ARGS, "--model", str(tiny_bert)]
    assert main([*arguments, "--output", str(single)]) == 0  # this process: no launcher
    done = _torchrun([*arguments, "--output", str(launched)], folder / "cache")
    assert done.returncode == 0, done.stderr[:3000] + "\n...\n" + done.stderr[-1500:]
    return {"single": Result.load(single), "launched": Result.load(launched), "out": done.stdout}


def test_two_processes_give_the_single_process_numbers(runs):
    single, launched = runs["single"], runs["launched"]
    assert launched.example_ids == single.example_ids
    assert [part["shard"] for part in launched.extra["merged_from"]] == ["1/2", "2/2"]
    for spec, method in single.methods.items():
        assert launched.methods[spec].per_example == method.per_example, spec
        assert launched.methods[spec].scores == method.scores, spec
    assert launched.paired == single.paired
    assert launched.config["shard"] is None


def test_rank_zero_alone_prints_the_leaderboard(runs):
    assert runs["out"].count("spearman vs saliency") == 1


def test_more_processes_than_batches_is_one_line(tiny_bert, tmp_path):
    """A process with an empty shard still joins the gather: rank 0 alone says why, one line,
    and no process dies on a closed gloo socket (an internal error, exit 4, before)."""
    arguments = [*ARGS, "--model", str(tiny_bert), "--limit", "2", "--output", "x.json"]
    done = _torchrun(arguments, tmp_path / "cache")
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(ours) == 1, done.stderr[-3000:]
    assert "holds no example" in ours[0] and "process(es)" in ours[0]
    assert "internal error" not in done.stderr and "exitcode  : 4" not in done.stderr


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_launcher_without_accelerate_is_one_line(tiny_bert, run_cli, monkeypatch, rank):
    """Under a launcher without the distributed extra, each process died importing
    accelerate: a traceback from every one, exit 4. Rank 0 now says it in one line, exit 2,
    and the others exit 2 quietly (the launcher's environment, not a real launch)."""
    for name, value in (("WORLD_SIZE", "2"), ("RANK", rank), ("LOCAL_RANK", rank)):
        monkeypatch.setenv(name, value)
    # not installed: every import of it fails, also of a submodule transformers imported already
    for name in [m for m in sys.modules if m.split(".")[0] == "accelerate"] + ["accelerate"]:
        monkeypatch.setitem(sys.modules, name, None)
    arguments = ("run", "--model", tiny_bert, "--limit", "2", "--no-cache", "--quiet")
    if rank == "0":
        code, _, err = run_cli(*arguments)
        assert code == 2, err
        assert err.strip() == (
            "error: a run under torchrun or accelerate launch needs Accelerate: pip install "
            "'attrib-bench[distributed]'"
        )
    else:
        with pytest.raises(SystemExit) as exited:
            run_cli(*arguments)
        assert exited.value.code == 2
