"""Cost columns (seconds and peak memory per method), the random floor, opt-in evaluators.

The cost tests run methods of known cost through ``attrib-bench run``: one that takes a known
time, one that allocates a known tensor, and two that share one intermediate of known time and
size (README, "Cost columns": every method is charged its standalone cost). Time is a fake
clock (``attrib_bench.core.clock``) that the methods advance: the charges are exact, whatever
the machine's load.
"""

from __future__ import annotations

import json
import textwrap
from types import SimpleNamespace

import pytest
import torch

from attrib_bench.core import clock
from attrib_bench.runner import memory
from attrib_bench.runner.memory import (
    CPU_SOURCE,
    PeakMemory,
    standalone_megabytes,
    tensor_megabytes,
)

FORWARD_PER_EXAMPLE = 0.25  # seconds of the traced forward pass, charged to every method
SLEEP_PER_EXAMPLE = 0.1  # seconds
ALLOCATED_MB = 64
SHARED_SLEEP_PER_EXAMPLE = 0.05  # seconds, to compute the shared intermediate
SHARED_MB = 32


class FakeClock:
    """``attrib_bench.core.clock.now`` for tests: it moves only by ``advance``."""

    def __init__(self) -> None:
        self.seconds = 1000.0

    def __call__(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.seconds += seconds


#: Each cost is time on the test's fake clock (``clock.now``, a FakeClock during the run). The
#: forward pass's cost is a trace field's: captured in the pass, whoever requires it.
COST_PLUGIN = f"""
import torch

import attrib_bench
from attrib_bench.core import clock


def forward_cost(kept):
    clock.now.advance({FORWARD_PER_EXAMPLE} * kept[0].shape[0])
    return tuple(kept)


KNOWN_FORWARD = attrib_bench.TraceField(
    name="known_forward",
    doc="the head's output, and a forward pass of known time",
    modules=lambda adapter: [adapter.model.classifier],
    keep="output",
    collect=forward_cost,
)


class KnownCost:
    def __init__(self, name, work, requires=()):
        self.name = name
        self.description = f"Position decay at a known cost ({{name}})"
        self.work = work
        self.requires = frozenset(requires)

    def attribute(self, trace):
        self.work(trace)
        positions = torch.arange(trace.mask_BN.shape[1], dtype=torch.float32)
        rows_BN = (1.0 / (1.0 + positions)).expand(trace.mask_BN.shape) * trace.mask_BN
        return attrib_bench.Attribution(aggregated_BLN=rows_BN[:, None, :])


def sleep(trace):
    clock.now.advance({SLEEP_PER_EXAMPLE} * len(trace.batch.examples))


def allocate(trace):
    block = torch.ones({ALLOCATED_MB} * 2**20 // 4)  # float32, every page touched
    del block


def shared(trace):
    def compute():
        clock.now.advance({SHARED_SLEEP_PER_EXAMPLE} * len(trace.batch.examples))
        return torch.ones({SHARED_MB} * 2**20 // 4)

    trace.memo("test-shared", compute)


@attrib_bench.hookimpl
def attrib_bench_trace_fields():
    return [KNOWN_FORWARD]


@attrib_bench.hookimpl
def attrib_bench_attributors():
    return [
        KnownCost("idle", lambda trace: None, requires={{"known_forward"}}),
        KnownCost("sleeps", sleep),
        KnownCost("allocates", allocate),
        KnownCost("shared-first", shared),
        KnownCost("shared-second", shared),
    ]
"""


def test_peak_memory_sees_an_allocation_freed_before_the_end():
    with PeakMemory(torch.device("cpu")) as peak:
        block = torch.ones(64, 2**20 // 4)  # 64 MB, touched
        block.add_(1)
        del block
    assert 60 < peak.megabytes < 80


def test_peak_memory_times_the_block_not_its_own_setup(monkeypatch):
    """The trim before the block is the measure's cost, not the method's (``seconds``)."""
    fake = FakeClock()
    monkeypatch.setattr(clock, "now", fake)
    monkeypatch.setattr(memory, "_TRIM", lambda: fake.advance(0.3))
    monkeypatch.setattr(memory, "CPU_SOURCE", "vmhwm")
    with PeakMemory(torch.device("cpu")) as peak:
        fake.advance(0.05)
    assert peak.seconds == pytest.approx(0.05)  # the trim's 0.3 s left out


def _megabyte_chunks() -> list[torch.Tensor]:
    return [torch.ones(2**20 // 4) for _ in range(64)]


@pytest.mark.skipif(CPU_SOURCE != "vmhwm", reason="needs a resettable resident peak (Linux)")
def test_peak_memory_counts_memory_an_earlier_block_freed():
    """Freed 1 MB chunks below a live allocation stay resident; reusing them is still counted."""
    for _ in range(2):  # the first round lifts glibc's mmap threshold; the second reuses the heap
        held = _megabyte_chunks()
        pinned = torch.ones(1000)  # above the chunks, so glibc cannot trim the heap's top itself
        del held
        with PeakMemory(torch.device("cpu")) as peak:
            again = _megabyte_chunks()
            del again
        del pinned
        assert 60 < peak.megabytes < 80
    with PeakMemory(torch.device("cpu")) as idle:
        pass
    assert idle.megabytes < 1  # the earlier blocks' peaks are not carried over


def test_tensor_megabytes_and_the_standalone_charge():
    one_mb = torch.zeros(2**20 // 4)
    assert tensor_megabytes({"a": [one_mb, (one_mb,)], "b": "text"}) == pytest.approx(2.0)
    trace = SimpleNamespace(
        attentions=(one_mb, one_mb),
        hidden_states=(),
        values=(),
        pre_ln1=(one_mb,),
        pre_ln2=(one_mb,),
        shared={"old": [one_mb], "new": one_mb},
        accessed={"old", "new"},
    )
    # 0.5 own + 2 attention tensors + 2 pre-LN tensors + "old" (computed by another method)
    assert standalone_megabytes(
        trace, {"attentions", "pre_layernorm"}, 0.5, computed_before={"old"}
    ) == pytest.approx(5.5)


def test_the_standalone_charge_counts_the_plugin_fields_required():
    one_mb = torch.zeros(2**20 // 4)
    trace = SimpleNamespace(
        attentions=(one_mb,),
        plugin_fields={"toy": (one_mb, [one_mb]), "unread": (one_mb,)},
        shared={},
        accessed=set(),
    )
    # 0.5 own + 1 attention tensor + the 2 tensors of "toy"; "unread" is not required
    assert standalone_megabytes(trace, {"attentions", "toy"}, 0.5, set()) == pytest.approx(3.5)
    assert standalone_megabytes(trace, {"attentions"}, 0.5, set()) == pytest.approx(1.5)


FIELD_MB = 16

#: A plugin trace field of known size: the classification head's output (B, 2), kept with a
#: block of FIELD_MB; charged to the method that requires it, not to the one that does not.
FIELD_COST_PLUGIN = f"""
import torch

import attrib_bench


KNOWN_SIZE = attrib_bench.TraceField(
    name="known_size",
    doc="the head's output (B, 2) and a block of {FIELD_MB} MB",
    modules=lambda adapter: [adapter.model.classifier],
    keep="output",
    collect=lambda kept: (*kept, torch.ones({FIELD_MB} * 2**20 // 4)),
)


class PositionDecay:
    def __init__(self, name, requires):
        self.name = name
        self.description = f"Position decay ({{name}})"
        self.requires = frozenset(requires)

    def attribute(self, trace):
        for name in self.requires:
            trace.need(name)
        positions = torch.arange(trace.mask_BN.shape[1], dtype=torch.float32)
        rows_BN = (1.0 / (1.0 + positions)).expand(trace.mask_BN.shape) * trace.mask_BN
        return attrib_bench.Attribution(aggregated_BLN=rows_BN[:, None, :])


@attrib_bench.hookimpl
def attrib_bench_trace_fields():
    return [KNOWN_SIZE]


@attrib_bench.hookimpl
def attrib_bench_attributors():
    return [PositionDecay("field-free", ()), PositionDecay("field-reader", {{"known_size"}})]
"""


def test_a_plugin_trace_field_is_charged_to_the_method_that_requires_it(
    tiny_bert, run_cli, tmp_path
):
    plugin = tmp_path / "field_cost_plugin.py"
    plugin.write_text(textwrap.dedent(FIELD_COST_PLUGIN))
    document, _ = run(
        run_cli,
        tmp_path,
        *("--model", tiny_bert, "--plugin", plugin, "--batch-size", "2"),
        *("--attributors", "field-free,field-reader"),
    )
    methods = document["methods"]
    # Both read the one trace holding the field; only the reader is charged it, in full.
    assert FIELD_MB <= methods["field-reader"]["peak_memory_mb"] < FIELD_MB + 2
    assert methods["field-free"]["peak_memory_mb"] < 4


def run(run_cli, tmp_path, *args):
    output = tmp_path / "result.json"
    code, out, err = run_cli("run", *args, "--limit", "4", "--quiet", "--output", output)
    assert code == 0, err
    return json.loads(output.read_text()), out


@pytest.fixture(scope="module")
def known_costs(tiny_bert, tmp_path_factory):
    """One run of the known-cost methods: 4 examples in 2 batches, in the order listed."""
    from attrib_bench.cli import main

    folder = tmp_path_factory.mktemp("cost")
    plugin = folder / "cost_plugin.py"
    plugin.write_text(textwrap.dedent(COST_PLUGIN))
    output = folder / "result.json"
    args = ["--model", tiny_bert, "--plugin", plugin, "--limit", "4", "--batch-size", "2"]
    methods = "idle,sleeps,allocates,shared-first,shared-second"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTRIB_BENCH_CACHE", str(folder / "cache"))
        patch.setenv("ATTRIB_BENCH_NO_CACHE", "1")
        patch.setattr(clock, "now", FakeClock())
        code = main(
            ["run", *map(str, args), "--attributors", methods, "--quiet", "--output", str(output)]
        )
    assert code == 0
    return json.loads(output.read_text())["methods"]


def test_seconds_per_example_charge_a_methods_own_time(known_costs):
    # Every method carries the shared forward pass (which idle alone asked a field of), plus
    # its own time, per example.
    assert known_costs["idle"]["seconds_per_example"] == pytest.approx(FORWARD_PER_EXAMPLE)
    assert known_costs["allocates"]["seconds_per_example"] == pytest.approx(FORWARD_PER_EXAMPLE)
    assert known_costs["sleeps"]["seconds_per_example"] == pytest.approx(
        FORWARD_PER_EXAMPLE + SLEEP_PER_EXAMPLE
    )


def test_peak_memory_is_what_a_method_allocates(known_costs):
    assert ALLOCATED_MB * 0.95 <= known_costs["allocates"]["peak_memory_mb"] < ALLOCATED_MB * 1.25
    for name in ("idle", "sleeps"):
        assert known_costs[name]["peak_memory_mb"] < 4, name


def test_a_shared_intermediate_is_charged_to_every_method_that_reads_it(known_costs):
    """Computed by whichever method runs first, charged in time and memory to both."""
    first, second = known_costs["shared-first"], known_costs["shared-second"]
    for method in (first, second):
        assert method["seconds_per_example"] == pytest.approx(
            FORWARD_PER_EXAMPLE + SHARED_SLEEP_PER_EXAMPLE
        )
        assert SHARED_MB * 0.95 <= method["peak_memory_mb"] < SHARED_MB * 1.25
    # The reader is charged the tensor it read exactly, plus its own (tiny) peak.
    assert SHARED_MB <= second["peak_memory_mb"] < SHARED_MB + 2


def test_cost_columns_and_the_random_floor(tiny_bert, run_cli, tmp_path, monkeypatch):
    from attrib_bench.core.registry import load_registry

    monkeypatch.setenv("COLUMNS", "250")
    document, out = run(run_cli, tmp_path, "--model", tiny_bert, "--attributors", "attention")
    # The reference and the floor join the table unselected, each marked as such.
    assert list(document["methods"]) == ["attention", "saliency", "random"]
    assert document["methods"]["random"]["added_as_floor"] is True
    assert document["methods"]["saliency"]["added_as_reference"] is True
    assert document["methods"]["attention"]["added_as_floor"] is False
    assert document["methods"]["attention"]["added_as_reference"] is False
    assert "random: added as the floor" in out
    # The table shows the JSON's cost columns.
    header = next(line for line in out.splitlines() if "method" in line)
    assert "s/ex" in header and "peak MB" in header
    attention = document["methods"]["attention"]
    row = next(line for line in out.splitlines() if line.startswith("│ attention "))
    cells = [cell.strip() for cell in row.split("│")]
    assert f"{attention['seconds_per_example']:.4f}" in cells
    assert f"{attention['peak_memory_mb']:.1f}" in cells
    # Only spearman runs by default: the costly evaluators are opt-in.
    assert set(document["evaluators"]) == {"spearman"}
    spearman = load_registry().evaluator("spearman")
    assert document["evaluator_info"]["spearman"] == {
        "description": spearman.description,
        "needs_reference": True,
        "higher_is_better": True,
        "corpus_level": False,
    }


def test_selected_random_is_not_marked_added(tiny_bert, run_cli, tmp_path):
    document, out = run(
        run_cli, tmp_path, "--model", tiny_bert, "--attributors", "random,attention"
    )
    assert list(document["methods"]) == ["random", "attention", "saliency"]
    assert not any(m["added_as_floor"] for m in document["methods"].values())
    assert "added as the floor" not in out


def test_lower_is_better_evaluators_sort_ascending(tiny_bert, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    document, out = run(
        run_cli,
        tmp_path,
        "--model",
        tiny_bert,
        "--attributors",
        "saliency,attention",
        "--evaluators",
        "sufficiency:ratios=0.5",
    )
    assert "sufficiency:ratios=0.5 (aggregated, lower is better)" in out
    means = {
        spec: m["scores"]["sufficiency:ratios=0.5"]["aggregated"][0]["mean"]
        for spec, m in document["methods"].items()
    }
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│ ")]
    assert rows == sorted(means, key=means.get)
