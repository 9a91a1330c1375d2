"""A run streams its batches: each is tokenised when the runner reaches it and freed after, so
the run's working memory does not grow with the dataset (issue 14)."""

from __future__ import annotations

import gc
import weakref

import pytest

from attrib_bench.data import batches as batch_module
from attrib_bench.runner import engine
from attrib_bench.runner.engine import run_benchmark
from attrib_bench.runner.state import RunConfig


@pytest.mark.parametrize("cache", [False, True])
def test_only_the_batch_being_traced_is_alive(cache, tiny_bert, monkeypatch):
    """Before each trace, the batches alive (tokenised and not freed) are the one about to be
    traced: none of those before it, none made ahead; with the cache on too (it reads every
    batch once before the run, to find the examples it holds)."""
    made: list[weakref.ref] = []
    alive: list[int] = []
    encode, trace = batch_module._encode_batch, engine.trace_batch

    def tracked_encode(chunk, plan):
        batch = encode(chunk, plan)
        made.append(weakref.ref(batch))
        return batch

    def counted_trace(loaded, batch, *args, **kwargs):
        gc.collect()
        alive.append(sum(ref() is not None for ref in made))
        return trace(loaded, batch, *args, **kwargs)

    monkeypatch.setattr(batch_module, "_encode_batch", tracked_encode)
    monkeypatch.setattr(engine, "trace_batch", counted_trace)
    if cache:
        monkeypatch.delenv("ATTRIB_BENCH_NO_CACHE")
    config = RunConfig(
        model=str(tiny_bert), dataset="default", limit=24, batch_size=4, device="cpu",
        attributors=["attention", "saliency"], evaluators=["spearman"], floor=False,
    )  # fmt: skip
    document = run_benchmark(config, quiet=True, cache=cache)
    assert len(document["example_ids"]) == 24
    assert alive == [1] * 6, alive  # six batches of four, one alive at a time
