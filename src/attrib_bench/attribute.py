"""``attrib-bench attribute``: attributions as JSONL, one record per (example, method)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attrib_bench.plugins import Spec
from attrib_bench.run import MethodState, RunConfig, attribution_stream, prepare


def _rows(rows_BLN: torch.Tensor | None, row: int, length: int) -> list[list[float]] | None:
    if rows_BLN is None:
        return None
    return rows_BLN[row, :, :length].detach().cpu().tolist()


def write_attributions(config: RunConfig, output: Path, quiet: bool = False) -> bool:
    """Write every selected method's rows for every example; False if a method failed.

    ``aggregated``: a list over layers of [CLS]-row scores over all real tokens, special tokens
    included (one entry for whole-model methods); ``local``: the single-layer rows, or null.
    """
    torch.manual_seed(config.seed)
    prepared = prepare(config, quiet)
    registry = prepared.registry
    specs = [Spec.parse(s) for s in (config.attributors or registry.defaults("attributors"))]
    methods = [MethodState(str(s), registry.attributor(s)) for s in specs]
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(output.name + ".tmp")
    try:
        _write(prepared, methods, config.seed, temporary, quiet)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    temporary.replace(output)
    return not any(m.error for m in methods)


def _write(prepared, methods: list[MethodState], seed: int, temporary: Path, quiet: bool) -> None:
    with temporary.open("w") as handle:
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
                        "aggregated": _rows(attribution.aggregated_BLN, row, length),
                        "local": _rows(attribution.local_BLN, row, length),
                    }
                    handle.write(json.dumps(record) + "\n")
        for method in methods:
            if method.error:
                handle.write(json.dumps({"method": method.spec, "error": method.error}) + "\n")
