"""``attrib-bench attribute``: attributions as JSONL, one record per (example, method).

Batches run in length order (less padding); records are written in dataset order, through a
spool file indexed by example, so memory stays bounded by one batch.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from attrib_bench.runner.engine import attribution_stream, prepare, selected_specs
from attrib_bench.runner.state import MethodState, Prepared, RunConfig


def write_attributions(config: RunConfig, output: Path, quiet: bool = False) -> bool:
    """Write every selected method's rows for every example; False if a method failed.

    ``aggregated``: a list over layers of target-row scores over all real tokens, special tokens
    included (one entry for whole-model methods); ``local``: the single-layer rows, or null;
    ``target``: the run's attribution target (``--target``, resolved) and ``seed``: the run's
    seed, which ``evaluate`` adopts.
    """
    torch.manual_seed(config.seed)
    prepared = prepare(config, quiet)
    registry = prepared.registry
    specs = selected_specs(registry, config.attributors)
    methods = [MethodState(spec, registry.attributor(spec)) for spec in specs]
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(output.name + ".tmp")
    try:
        _write(prepared, methods, config.seed, temporary, quiet)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    temporary.replace(output)
    return not any(m.error for m in methods)


def _write(
    prepared: Prepared, methods: list[MethodState], seed: int, temporary: Path, quiet: bool
) -> None:
    spans: dict[str, list[tuple[int, int]]] = {}  # example id -> (offset, size) of its records
    target = str(prepared.target)  # the run's, resolved: what ``evaluate`` must score
    with tempfile.TemporaryFile("w+b") as spool:
        for trace, results in attribution_stream(prepared, methods, seed, quiet=quiet):
            batch = trace.batch
            for row, (example, length) in enumerate(
                zip(batch.examples, batch.lengths, strict=True)
            ):
                for spec, attribution in results.items():
                    record = {
                        "id": example.id,
                        "tokens": batch.tokens[row],
                        "method": spec,
                        "aggregated": attribution.example_rows("aggregated", row, length),
                        "local": attribution.example_rows("local", row, length),
                        "target": target,
                        "seed": seed,
                    }
                    line = (json.dumps(record) + "\n").encode()
                    spans.setdefault(example.id, []).append((spool.tell(), len(line)))
                    spool.write(line)
        with temporary.open("wb") as handle:
            for example in prepared.data.examples:
                for offset, size in spans.get(example.id, []):
                    spool.seek(offset)
                    handle.write(spool.read(size))
            for method in methods:
                if method.error:
                    line = json.dumps({"method": method.spec, "error": method.error}) + "\n"
                    handle.write(line.encode())
