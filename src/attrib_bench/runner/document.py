"""The result document built from a run's state: per method its scores, summaries and status,
and the run's provenance (packages, model, data, hardware). Written and read as JSON by
attrib_bench.results."""

from __future__ import annotations

import os
import platform
from collections import Counter
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attrib_bench.core.interfaces import KINDS
from attrib_bench.core.plugin_info import evaluator_info
from attrib_bench.results.document import SCHEMA_VERSION
from attrib_bench.results.evaluator_agreement import evaluator_agreement_section
from attrib_bench.results.paired import paired_section
from attrib_bench.results.stats import summarize_by_answer, summarize_corpus, summarize_layers
from attrib_bench.runner.cache import package_version

if TYPE_CHECKING:
    from attrib_bench.runner.state import MethodState, Prepared, RunConfig

PACKAGES = ("attrib-bench", "torch", "transformers", "captum", "datasets", "pluggy", "scipy")


def hardware(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def build_result(
    config: RunConfig,
    prepared: Prepared,
    methods: list[MethodState],
    evaluators: dict[str, Any],
    evaluator_errors: dict[str, str],
    right: dict[str, bool] | None = None,
) -> dict[str, Any]:
    """The result document. ``right``: per example id, whether the model gets the example
    right (next-token data, ``runner.engine.right_answers``): recorded as ``model_right``, and
    every mean-summarised score is also summarised over the right and the wrong ones."""
    registry = prepared.registry
    example_ids = [e.id for e in prepared.data.examples]
    right_E = None if right is None else np.array([right[i] for i in example_ids], dtype=bool)
    method_docs: dict[str, Any] = {}
    for method in methods:
        name = method.spec.partition(":")[0]
        doc: dict[str, Any] = {
            "name": name,
            "plugin": registry.attributors[name].source,
            "status": "failed" if method.error else "ok",
            "error": method.error,
            "seconds_per_example": (
                method.seconds / method.examples if method.examples and not method.error else None
            ),
            "peak_memory_mb": (
                round(method.peak_memory_mb, 2) if method.examples and not method.error else None
            ),
            "added_as_floor": method.added_as == "floor",
            "added_as_reference": method.added_as == "reference",
            "evaluators": {},
            "scores": {},
            "per_example": {},
        }
        if not method.error:
            for evaluator in evaluators:
                if evaluator in evaluator_errors:
                    method.scores.pop(evaluator, None)
                    continue
                doc["evaluators"][evaluator] = _pair_status(method, evaluator)
                if evaluator in method.evaluator_errors:
                    method.scores.pop(evaluator, None)
            doc["scores"], doc["per_example"], parts = summarize_scores(
                method, example_ids, config.seed, evaluators
            )
            if parts:
                doc["per_example_parts"] = parts
            if right_E is not None:
                doc["scores_by_answer"] = scores_by_answer(
                    doc["per_example"], right_E, config.seed, evaluators
                )
        method_docs[method.spec] = doc
    data = prepared.data
    loaded = prepared.loaded
    dataset: dict[str, Any] = {
        "name": data.name,
        "split": data.split,
        "fingerprint": data.fingerprint,
        "examples": len(data.examples),
        "text_column": data.text_column,
        "text_pair_column": data.text_pair_column,
        "label_column": data.label_column,
        "truncated": prepared.truncated,
        "max_length": prepared.max_length,
        "rationale_words_lost": prepared.rationale_words_lost,
        "rationale_words": dict(zip(("lost", "total"), prepared.rationale_words, strict=True)),
        "contentless": len(prepared.contentless),
    }
    if prepared.positions is not None:
        dataset["positions"] = prepared.positions
    if data.next_tokens is not None:
        words = data.next_tokens.words
        dataset["next_token"] = {
            "unmatched": data.next_tokens.unmatched,
            "shared_first_token": prepared.shared_first_token,
            "paradigms": dict(Counter(words[i].paradigm for i in example_ids)),
        }
        if right_E is not None:
            dataset["next_token"] |= {"right": int(right_E.sum()), "wrong": int((~right_E).sum())}
    document = {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        # The resolved target (position=auto -> the family's): results stay comparable with
        # runs that named the position.
        "config": {**config.to_dict(), "target": str(prepared.target)},
        "provenance": {
            "packages": {name: package_version(name) for name in PACKAGES},
            "python": platform.python_version(),
            "model": {
                "id": loaded.model_id,
                "name": loaded.name,
                "type": loaded.model.config.model_type,
                "weights_sha256": loaded.weights_sha256,
                "fresh_head": loaded.fresh_head,
                "language_model": loaded.is_language_model,
                "gguf": loaded.gguf,
            },
            "dataset": dataset,
            "seed": config.seed,
            "hardware": hardware(loaded.device),
            "evaluator_plugins": {n: reg.source for n, reg in registry.evaluators.items()},
            # The set a run without --attributors takes (attrib-bench's own), whether this run
            # took it, and the installed methods it leaves out: installing a plugin never
            # changes a plain run silently.
            "default_attributors": {
                "used": config.attributors is None,
                "names": registry.defaults("attributors"),
                "left_out": registry.left_out_of_default(),
            },
        },
        "reference": config.reference,
        "target": prepared.target.to_dict(),
        "evaluators": {
            name: {
                "status": "failed" if name in evaluator_errors else "ok",
                "error": evaluator_errors.get(name),
            }
            for name in evaluators
        },
        "evaluator_info": {
            name: {
                "description": evaluator.description,
                "needs_reference": info.needs_reference,
                "higher_is_better": info.higher_is_better,
                # Summarised by an aggregate of per-example parts, not a mean (see stats).
                "corpus_level": bool(info.parts),
            }
            for name, evaluator in evaluators.items()
            if (info := evaluator_info(evaluator))
        },
        "example_ids": example_ids,
        "methods": method_docs,
    }
    if right_E is not None:
        document["model_right"] = right_E.tolist()
    # Which model copy scored the in-distribution removal evaluators (``scorer=``, their
    # ``scored_by``: attrib_bench.model.scorer); absent when none had one.
    scorers = {n: e.scored_by for n, e in evaluators.items() if getattr(e, "scored_by", None)}
    if scorers:
        document["provenance"]["scorers"] = scorers
    # Every two methods on the same examples: is rank i really ahead of rank i + 1?
    corpus = [name for name, info in document["evaluator_info"].items() if info["corpus_level"]]
    ran = {spec: doc["per_example"] for spec, doc in method_docs.items() if doc["status"] == "ok"}
    document["paired"] = paired_section(ran, corpus, config.seed)
    # Every two evaluators: do they order the methods alike (results.evaluator_agreement)?
    document["evaluator_agreement"] = evaluator_agreement_section(
        ran,
        document["evaluator_info"],
        {config.reference, *(m.spec for m in methods if m.added_as == "reference")},
        config.seed,
    )
    return document


def summarize_scores(
    method: MethodState, example_ids: list[str], seed: int, evaluators: dict[str, Any]
) -> tuple[dict, dict, dict]:
    """Per evaluator and kind: per-layer summaries, the per-example scores in data order, and
    the per-example parts of corpus-level evaluators (evaluator -> kind -> part -> per layer).

    An evaluator with ``parts`` is summarised by its ``aggregate`` over the parts' columns (a
    corpus-level score such as ERASER's macro F1), not by the mean of its per-example scores;
    the result keeps the parts so that ``merge`` can summarise the union of shards the same way.
    """
    summaries: dict[str, dict[str, list]] = {}
    per_example: dict[str, dict[str, list]] = {}
    per_example_parts: dict[str, dict[str, dict[str, list]]] = {}
    for name, kinds in method.scores.items():
        parts = evaluator_info(evaluators[name]).parts if name in evaluators else ()
        for kind in KINDS:
            if kind not in kinds:
                continue
            matrix = np.stack([kinds[kind][i] for i in example_ids], axis=1)  # (L, examples)
            if parts:
                columns = [[kinds[f"{kind}/{p}"][i] for i in example_ids] for p in parts]
                parts_LEP = np.stack(columns, axis=-1).transpose(1, 0, 2)
                per_example_parts.setdefault(name, {})[kind] = {
                    part: _rows(parts_LEP[:, :, index]) for index, part in enumerate(parts)
                }
                aggregate = evaluators[name].aggregate
                layers = [summarize_corpus(values_EP, aggregate, seed) for values_EP in parts_LEP]
                layers = [{"layer": layer + 1, **summary} for layer, summary in enumerate(layers)]
            else:
                layers = summarize_layers(matrix, seed)
            summaries.setdefault(name, {})[kind] = layers
            per_example.setdefault(name, {})[kind] = _rows(matrix)
    return summaries, per_example, per_example_parts


def _rows(values_LE: np.ndarray) -> list[list[float | None]]:
    """Per layer, the examples' values as JSON numbers (null: undefined)."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in values_LE]


def scores_by_answer(
    per_example: dict[str, dict[str, list]],
    right_E: np.ndarray,
    seed: int,
    evaluators: dict[str, Any],
) -> dict[str, dict[str, dict[str, list]]]:
    """Per answer (``right``, ``wrong``), per evaluator and kind: the summaries over the
    examples the model gets right, or wrong; corpus-level evaluators are left out (their
    aggregate needs parts the result does not keep)."""
    by_answer: dict[str, dict[str, dict[str, list]]] = {"right": {}, "wrong": {}}
    for name, kinds in per_example.items():
        if name in evaluators and evaluator_info(evaluators[name]).parts:
            continue
        rows = {kind: np.array(values, dtype=float) for kind, values in kinds.items()}
        for answer, summaries in summarize_by_answer(rows, right_E, seed).items():
            by_answer[answer][name] = summaries
    return by_answer


def _pair_status(method: MethodState, evaluator: str) -> dict[str, Any]:
    """One (method, evaluator) pair: ok, failed (its error), or undefined on every example."""
    if evaluator in method.evaluator_errors:
        return {"status": "failed", "error": method.evaluator_errors[evaluator]}
    if method.undefined(evaluator):
        return {"status": "undefined", "error": "NaN on every example"}
    return {"status": "ok", "error": None}
