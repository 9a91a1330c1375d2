"""One result from runs over disjoint examples: what a sharded run puts back together.

Per-example scores are concatenated in the order the parts are given, and every summary is
recomputed from them with the run's own statistics (``attrib_bench.results.stats.summarize``, same
seed), so merging the runs over two halves of a dataset gives the result of one run over the
whole (tested), the summaries over the examples the model gets right and wrong included
(``model_right``); a corpus-level score (``iou-f1``'s macro F1) by its evaluator's own
``aggregate`` over the union's per-example parts (``per_example_parts``). What cannot be
recomputed from a result file is refused, not approximated.

Shards (``run --shard i/N``) are the special case of one run's data cut in N: their configs may
differ only in ``shard`` and ``device`` (a shard is a slice of the batches, which the batch size
makes, so shards of different batch sizes would not partition the data), they must hold the same
data (dataset fingerprint) and all N shards once each; they are joined into the result of the
unsharded run (``shard`` null, the data's own fingerprint), its examples in dataset order again:
a shard holds whole batches of the length-sorted run, and records each example's index in the
data (``provenance.dataset.positions``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from attrib_bench.core.errors import UsageError
from attrib_bench.core.shards import parse_shard
from attrib_bench.results.evaluator_agreement import (
    EvaluatorAgreement,
    evaluator_agreement_section,
)
from attrib_bench.results.paired import Paired, paired_section
from attrib_bench.results.stats import summarize_by_answer, summarize_corpus, summarize_layers
from attrib_bench.results.typed import LayerScore, MethodResult, Result

#: Config keys that may differ between the parts (they choose the examples or the hardware).
PER_PART_CONFIG = frozenset({"dataset", "split", "limit", "batch_size", "device"})
#: Config keys that may differ between the shards of one run (the data is the same).
#: Not the batch size: shard i is a slice of the run's batches, so shards made at different batch
#: sizes can leave examples out or hold some twice.
PER_SHARD_CONFIG = frozenset({"shard", "device"})


def _same(parts: Sequence[Result], what: str, value: Any) -> None:
    values = [value(part) for part in parts]
    if any(v != values[0] for v in values[1:]):
        raise UsageError(f"cannot merge results with different {what}: {values}")


def _check_mergeable(parts: Sequence[Result]) -> None:
    if not parts:
        raise UsageError("nothing to merge: give at least one result")
    _same(parts, "model weights", lambda r: r.provenance["model"].get("weights_sha256"))
    _same(parts, "references", lambda r: r.reference)
    _same(parts, "methods", lambda r: sorted(r.methods))
    _same(parts, "evaluators", lambda r: sorted(r.evaluators))
    shards = _shards(parts)
    _same_settings(parts, PER_PART_CONFIG if shards is None else PER_SHARD_CONFIG)
    _same(parts, "package versions (code)", lambda r: r.provenance.get("packages"))
    _same(
        parts,
        "code (provenance.code: attrib-bench's numeric core and the methods' plugin sources)",
        lambda r: r.provenance.get("code"),
    )
    if shards is not None:
        _same(parts, "data (dataset fingerprint)", lambda r: r.provenance["dataset"]["fingerprint"])
    seen: dict[str, int] = {}
    for index, part in enumerate(parts):
        if not part.example_ids:  # optional in the schema, but the rows are matched by them
            raise UsageError(
                f"cannot merge: part {index + 1} has no example_ids, which merge needs to join "
                "and order its per-example scores"
            )
        for example in part.example_ids:
            if example in seen:
                raise UsageError(
                    f"cannot merge: example id {example!r} is in parts {seen[example] + 1} and "
                    f"{index + 1}; the parts must hold disjoint examples"
                )
            seen[example] = index
    if shards is not None:
        count = shards[0][1]
        missing = sorted(set(range(1, count + 1)) - {i for i, _ in shards})
        if missing:
            raise UsageError(
                f"cannot merge: shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing; "
                f"merge all {count} shards of the run"
            )
    corpus = [name for name, info in parts[0].evaluator_info.items() if info.get("corpus_level")]
    lacking = [
        name
        for name in corpus
        if any(
            name in method.per_example and name not in method.per_example_parts
            for part in parts
            for method in part.methods.values()
        )
    ]
    if lacking:
        raise UsageError(
            f"cannot merge {', '.join(lacking)}: a corpus-level score needs per-example parts "
            "that the result file does not hold (made before attrib-bench kept them); run it "
            "again, or merge without it"
        )


def _shards(parts: Sequence[Result]) -> list[tuple[int, int]] | None:
    """Each part's (i, N) when the parts are shards, None when none is; refuses a mix."""
    given = [part.config.get("shard") for part in parts]
    if all(shard is None for shard in given):
        return None
    if any(shard is None for shard in given):
        whole = [str(index + 1) for index, shard in enumerate(given) if shard is None]
        raise UsageError(
            f"cannot merge shards (--shard) with results that are not shards (parts "
            f"{', '.join(whole)}): merge the shards of one run"
        )
    shards = [parse_shard(shard) for shard in given]
    if len({count for _, count in shards}) > 1:
        raise UsageError(f"cannot merge shards of different counts: {', '.join(given)}")
    return shards


def _same_settings(parts: Sequence[Result], free: frozenset[str]) -> None:
    """The parts' configs agree on every key but ``free``; the first difference is named."""
    first = parts[0].config
    for index, part in enumerate(parts[1:], start=2):
        for key in sorted((set(first) | set(part.config)) - free):
            if first.get(key) != part.config.get(key):
                raise UsageError(
                    f"cannot merge results with different settings: {key} is "
                    f"{first.get(key)!r} in part 1 and {part.config.get(key)!r} in part {index}"
                )


def _merged_pair(statuses: list[dict[str, Any]], rows: list[list[float]] | None) -> dict:
    failed = next((s for s in statuses if s.get("status") == "failed"), None)
    if failed is not None:
        return dict(failed)
    if rows is not None and all(math.isnan(v) for row in rows for v in row):
        return {"status": "undefined", "error": "NaN on every example"}
    return {"status": "ok", "error": None}


def _dataset_order(parts: Sequence[Result]) -> list[int] | None:
    """Where each example of the parts (concatenated) goes in the merged result: shards' by
    their positions in the data; None (as concatenated) for parts without positions."""
    found = [part.provenance["dataset"].get("positions") for part in parts]
    if all(positions is None for positions in found):
        return None
    positions = [p for part in found for p in part or []]
    if any(p is None for p in found) or sorted(positions) != list(range(len(positions))):
        raise UsageError(
            "cannot merge: the shards' example positions (provenance.dataset.positions) do not "
            "cover the data once each; merge all shards of one run"
        )
    return sorted(range(len(positions)), key=positions.__getitem__)


def _reordered(values: list[Any], order: list[int] | None) -> list[Any]:
    return values if order is None else [values[i] for i in order]


def _concatenated(
    by_part: list[list[list[float]]], order: list[int] | None, what: str
) -> list[list[float]]:
    """Per layer, the parts' per-example values one after the other (in dataset order)."""
    layers = {len(rows) for rows in by_part}
    if len(layers) != 1:
        raise UsageError(f"cannot merge {what}: the parts hold {sorted(layers)} layers")
    (count,) = layers
    return [_reordered([v for rows in by_part for v in rows[i]], order) for i in range(count)]


def _corpus_scorers(parts: Sequence[Result]) -> dict[str, Any]:
    """The corpus-level evaluators whose parts the results hold, from the installed plugins
    (their ``parts`` and ``aggregate``), the registry loaded once and only when needed."""
    names = {n for m in parts[0].methods.values() for n in m.per_example_parts}
    if not names:
        return {}
    from attrib_bench.core.registry import load_registry  # imports the plugins

    registry = load_registry()
    scorers = {}
    for name in sorted(names):
        try:
            scorers[name] = registry.evaluator(name)
        except UsageError as error:
            raise UsageError(f"cannot merge {name}: {error}") from None
    return scorers


def _corpus_scores(
    spec: str,
    evaluator: str,
    scorer: Any,
    methods: list[MethodResult],
    seed: int,
    order: list[int] | None,
) -> tuple[dict[str, dict[str, list]], dict[str, list[LayerScore]]]:
    """A corpus-level evaluator's per-example parts over the union, and its summary: the
    evaluator's own ``aggregate`` of the parts' columns, as the run summarises it."""
    kinds = [m.per_example_parts[evaluator] for m in methods]
    parts: dict[str, dict[str, list]] = {}
    scores: dict[str, list[LayerScore]] = {}
    for kind in kinds[0]:
        if any(set(k.get(kind, {})) != set(scorer.parts) for k in kinds):
            raise UsageError(f"cannot merge {spec}: {evaluator}'s parts differ from {scorer.parts}")
        parts[kind] = {
            p: _concatenated([k[kind][p] for k in kinds], order, f"{spec}: {evaluator}")
            for p in scorer.parts
        }
        values_LEP = np.stack([np.array(parts[kind][p], dtype=float) for p in scorer.parts], -1)
        scores[kind] = [
            LayerScore.from_json(
                {"layer": layer + 1, **summarize_corpus(values_EP, scorer.aggregate, seed)}
            )
            for layer, values_EP in enumerate(values_LEP)
        ]
    return parts, scores


def _merge_method(
    spec: str,
    methods: list[MethodResult],
    sizes: list[int],
    seed: int,
    right_E: np.ndarray | None,
    order: list[int] | None,
    scorers: dict[str, Any],
):
    first = methods[0]
    failed = next((m for m in methods if m.status != "ok"), None)
    merged = MethodResult(
        spec=spec,
        name=first.name,
        plugin=first.plugin,
        status="failed" if failed else "ok",
        error=failed.error if failed else None,
        seconds_per_example=None,
        peak_memory_mb=None,
        added_as_floor=first.added_as_floor,
        added_as_reference=first.added_as_reference,
        extra=copy.deepcopy(first.extra),
    )
    if failed:
        return merged
    merged.seconds_per_example = float(
        np.average([m.seconds_per_example or 0.0 for m in methods], weights=sizes)
    )
    merged.peak_memory_mb = max(m.peak_memory_mb or 0.0 for m in methods)
    evaluators = {name for m in methods for name in (*m.evaluators, *m.per_example)}
    for evaluator in sorted(evaluators):
        kinds = [m.per_example.get(evaluator, {}) for m in methods]
        complete = all(kinds) and all(set(k) == set(kinds[0]) for k in kinds)
        statuses = [m.evaluators.get(evaluator, {"status": "ok"}) for m in methods]
        if not complete and not any(s.get("status") == "failed" for s in statuses):
            statuses.append({"status": "failed", "error": "scores missing from a merged part"})
        per_kind = {}
        if complete:
            per_kind = {
                kind: _concatenated([k[kind] for k in kinds], order, f"{spec}: {evaluator}")
                for kind in kinds[0]
            }
        pair = _merged_pair(statuses, [r for rows in per_kind.values() for r in rows] or None)
        merged.evaluators[evaluator] = pair
        if pair["status"] == "failed":
            continue
        merged.per_example[evaluator] = per_kind
        if evaluator in first.per_example_parts:  # corpus-level: aggregated, not averaged
            merged.per_example_parts[evaluator], merged.scores[evaluator] = _corpus_scores(
                spec, evaluator, scorers[evaluator], methods, seed, order
            )
            continue  # nor split by answer: the run leaves corpus-level scores out there too
        rows = {kind: np.array(values, dtype=float) for kind, values in per_kind.items()}
        merged.scores[evaluator] = {
            kind: [LayerScore.from_json(x) for x in summarize_layers(values_LE, seed)]
            for kind, values_LE in rows.items()
        }
        if right_E is not None:
            by_answer = merged.scores_by_answer = merged.scores_by_answer or {}
            for answer, kinds in summarize_by_answer(rows, right_E, seed).items():
                by_answer.setdefault(answer, {})[evaluator] = {
                    kind: [LayerScore.from_json(x) for x in layers]
                    for kind, layers in kinds.items()
                }
    return merged


def _merge_provenance(parts: Sequence[Result], sharded: bool) -> dict[str, Any]:
    provenance = copy.deepcopy(parts[0].provenance)
    datasets = [part.provenance["dataset"] for part in parts]
    dataset = provenance["dataset"]
    dataset["examples"] = sum(len(part.example_ids) for part in parts)
    for key in ("truncated", "contentless"):
        if all(key in d for d in datasets):
            dataset[key] = sum(d[key] for d in datasets)
    fingerprints = [d.get("fingerprint") for d in datasets]
    if not sharded:  # shards share the data's fingerprint, kept as it is
        dataset["fingerprint"] = hashlib.sha256(json.dumps(fingerprints).encode()).hexdigest()
    if all("next_token" in d for d in datasets):  # counts over disjoint parts add up
        counts = [d["next_token"] for d in datasets]
        merged = dataset["next_token"]
        for key in merged:
            if key == "unmatched" and sharded:  # rows dropped before sharding: counted by each
                continue
            if key != "paradigms":
                merged[key] = sum(c.get(key, 0) for c in counts)
        merged["paradigms"] = dict(sum((Counter(c["paradigms"]) for c in counts), Counter()))
    dataset.pop("positions", None)  # the merged result holds the data in its own order
    counts = [d.get("rationale_words") for d in datasets]
    if all(counts):  # the share over the union, from the parts' counts
        lost, total = (sum(c[key] for c in counts) for key in ("lost", "total"))
        dataset["rationale_words"] = {"lost": lost, "total": total}
        dataset["rationale_words_lost"] = lost / total if total else None
    elif any(
        d.get("rationale_words_lost") != datasets[0].get("rationale_words_lost") for d in datasets
    ):
        dataset.pop("rationale_words", None)
        dataset["rationale_words_lost"] = None  # shares without counts (older results)
    return provenance


def _merge_cache(parts: Sequence[Result]) -> dict[str, Any] | None:
    caches = [part.extra.get("cache") for part in parts]
    if not all(caches) or any(c["methods"] != caches[0]["methods"] for c in caches):
        return None
    merged = copy.deepcopy(caches[0])
    for cache in caches[1:]:
        merged["examples"].update(cache["examples"])
        for spec, hits in cache["hits"].items():
            merged["hits"][spec] = merged["hits"].get(spec, 0) + hits
    return merged


def merge(parts: Sequence[Result]) -> Result:
    """The result of one run over the union of the parts' examples (see the module doc)."""
    _check_mergeable(parts)
    shards = _shards(parts)
    if shards is not None:  # in shard order, whatever order they were given in
        parts = [part for _, part in sorted(zip(shards, parts, strict=True), key=lambda x: x[0])]
    seed = int(parts[0].config.get("seed", 0))
    order = _dataset_order(parts) if shards is not None else None
    sizes = [len(part.example_ids) for part in parts]
    first = parts[0]
    evaluators = {}
    for name in first.evaluators:  # an evaluator failed in any part failed in the whole
        states = [p.evaluators[name] for p in parts]
        evaluators[name] = next((s for s in states if s["status"] != "ok"), states[0])
    extra = {k: copy.deepcopy(v) for k, v in first.extra.items() if k != "cache"}
    cache = _merge_cache(parts)
    if cache is not None:
        extra["cache"] = cache
    extra["merged_from"] = [
        {
            "created": part.created,
            "dataset": part.provenance["dataset"].get("name"),
            "split": part.provenance["dataset"].get("split"),
            "fingerprint": part.provenance["dataset"].get("fingerprint"),
            "examples": len(part.example_ids),
            "shard": part.config.get("shard"),
        }
        for part in parts
    ]
    answers = [part.model_right for part in parts]
    model_right = None if None in answers else _reordered([r for a in answers for r in a], order)
    right_E = None if model_right is None else np.array(model_right, dtype=bool)
    scorers = _corpus_scorers(parts)
    methods = {
        spec: _merge_method(
            spec, [p.methods[spec] for p in parts], sizes, seed, right_E, order, scorers
        )
        for spec in first.methods
    }
    # The paired comparison is recomputed over all examples; the agreement matrix needs the
    # attributions themselves, which a result does not hold, so a merged result has none.
    corpus = [name for name, info in first.evaluator_info.items() if info.get("corpus_level")]
    ran = {spec: m.per_example for spec, m in methods.items() if m.status == "ok"}
    paired = Paired.from_json(paired_section(ran, corpus, seed))
    # So is the agreement between evaluators: the same scores give the unsharded run's.
    references = {first.reference, *(s for s, m in methods.items() if m.added_as_reference)}
    evaluators_agree = EvaluatorAgreement.from_json(
        evaluator_agreement_section(ran, first.evaluator_info, references, seed)
    )
    return Result(
        schema_version=first.schema_version,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        config=copy.deepcopy(first.config) | ({"shard": None} if shards is not None else {}),
        provenance=_merge_provenance(parts, sharded=shards is not None),
        reference=first.reference,
        evaluators=evaluators,
        evaluator_info=copy.deepcopy(first.evaluator_info),
        example_ids=_reordered([e for part in parts for e in part.example_ids], order),
        model_right=model_right,
        methods=methods,
        extra=extra,
        paired=paired,
        evaluator_agreement=evaluators_agree,
    )
