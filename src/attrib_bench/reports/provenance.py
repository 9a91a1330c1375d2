"""What every report says of a result besides the scores: its title, its provenance, and which
examples it shows token by token."""

from __future__ import annotations

import json

from attrib_bench.results.typed import Result

#: Examples shown token by token (heatmaps, Markdown token tables) unless the caller says.
DEFAULT_EXAMPLES = 6


def provenance_rows(result: Result) -> list[tuple[str, str]]:
    provenance = result.provenance
    model = provenance.get("model", {})
    data = provenance.get("dataset", {})
    packages = ", ".join(f"{k} {v}" for k, v in provenance.get("packages", {}).items() if v)
    hardware = provenance.get("hardware", {})
    cache = result.extra.get("cache") or {}
    reused = sum((cache.get("hits") or {}).values())
    rows = [
        ("created", result.created),
        ("model", f"{model.get('name')} ({model.get('type')}) — {model.get('id')}"),
        ("weights sha256", model.get("weights_sha256")),
        (
            "dataset",
            f"{data.get('name')} / {data.get('split')}: {data.get('examples')} examples, "
            f"{data.get('truncated')} truncated to {data.get('max_length')} tokens",
        ),
        ("dataset fingerprint", data.get("fingerprint")),
        ("reference", result.reference),
        ("seed", provenance.get("seed")),
        ("packages", f"Python {provenance.get('python')}; {packages}"),
        (
            "hardware",
            f"{hardware.get('device')}, {hardware.get('cpu_count')} CPUs, "
            f"{hardware.get('torch_threads')} torch threads, {hardware.get('platform')}",
        ),
        ("config", json.dumps(result.config, sort_keys=True)),
    ]
    if cache:
        rows.append(("cache", f"{cache.get('dir')} ({reused} method-examples reused)"))
    for name, value in (
        ("GGUF file", model.get("gguf")),
        ("next-token data", data.get("next_token")),
    ):
        if value:
            rows.append((name, json.dumps(value, sort_keys=True)))
    if provenance.get("scorers"):  # in-distribution removal: scorer= on removal evaluators
        rows.append(("scorers", json.dumps(provenance["scorers"], sort_keys=True)))
    if result.extra.get("finetune"):
        rows.append(("fine-tuning", json.dumps(result.extra["finetune"], sort_keys=True)))
    return [(name, str(value)) for name, value in rows]


def title(result: Result) -> str:
    """``attrib-bench: MODEL on DATASET/SPLIT``; the model's id when it has no display name."""
    model = result.provenance["model"]
    data = result.provenance["dataset"]
    return f"attrib-bench: {model.get('name', model['id'])} on {data['name']}/{data['split']}"


def shown_examples(result: Result, count: int) -> list[str]:
    return [str(i) for i in result.example_ids[:count]]
