"""The runner: one traced forward pass per batch feeds every attributor; evaluators score them.

A method that raises is marked failed with its error and dropped; the others go on. Scores are
kept per example (keyed by example id) and summarised per layer at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from attrib_bench import console
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import LoadedData, load_examples
from attrib_bench.data.rationales import rationale_words_lost
from attrib_bench.errors import UsageError, unknown_choice
from attrib_bench.interfaces import KINDS, Attribution, Batch, EvalContext
from attrib_bench.memory import PeakMemory, standalone_megabytes
from attrib_bench.model.load import LoadedModel, load_model
from attrib_bench.model.trace import Trace, trace_batch
from attrib_bench.plugins import Registry, Spec, load_registry
from attrib_bench.stats import summarize

DEFAULT_REFERENCE = "saliency"
#: The attributor every leaderboard carries as its floor (added when not selected).
FLOOR = "random"


@dataclass
class RunConfig:
    """Everything that decides a run's numbers (batch size and device do not)."""

    model: str | None = None
    dataset: str | None = None
    split: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    limit: int | None = None
    max_length: int | None = None
    attributors: list[str] | None = None
    evaluators: list[str] | None = None
    reference: str = DEFAULT_REFERENCE
    seed: int = 0
    batch_size: int = 16
    device: str = "auto"
    plugins: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MethodState:
    """Running state of one method: timing, per-example scores, failure."""

    spec: str
    attributor: Any
    seconds: float = 0.0
    examples: int = 0
    #: Largest standalone memory of one batch (see attrib_bench.memory.standalone_megabytes).
    peak_memory_mb: float = 0.0
    #: Not selected by the user: added as the leaderboard's floor.
    added: bool = False
    error: str | None = None
    #: evaluator -> kind -> example id -> scores over layers
    scores: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)


@dataclass
class Prepared:
    """A run's resolved inputs: plugins, model, data and batches."""

    registry: Registry
    loaded: LoadedModel
    data: LoadedData
    batches: list[Batch]
    truncated: int
    max_length: int


def resolve_model(name: str | None, device: str, quiet: bool = False) -> LoadedModel:
    if name is not None:
        return load_model(name, device)
    from attrib_bench.model.finetune import ensure_default_model

    loaded = load_model(str(ensure_default_model(device, quiet)), device)
    loaded.name = "default MiniLM-L6 (fine-tuned on the generated data)"
    return loaded


def prepare(config: RunConfig, quiet: bool = False) -> Prepared:
    """Resolve plugins first (cheap, catches typos), then the model and the data."""
    registry = load_registry(config.plugins)
    for spec in config.attributors or []:
        registry.attributor(spec)
    for spec in config.evaluators or []:
        registry.evaluator(spec)
    if Spec.parse(config.reference).name not in registry.attributors:
        raise unknown_choice("reference attributor", config.reference, registry.attributors)
    if config.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {config.batch_size}")
    data = load_examples(
        config.dataset,
        config.split,
        config.text_column,
        config.text_pair_column,
        config.label_column,
        config.limit,
    )
    loaded = resolve_model(config.model, config.device, quiet)
    max_length = loaded.max_length
    if config.max_length is not None:
        if config.max_length < 3:
            raise UsageError(f"--max-length must be at least 3, got {config.max_length}")
        max_length = min(config.max_length, max_length)
    batches, truncated = make_batches(
        data.examples, loaded.tokenizer, config.batch_size, max_length
    )
    if truncated:
        console.warn(f"{truncated} of {len(data.examples)} inputs truncated to {max_length} tokens")
        lost = rationale_words_lost(batches)
        if lost:
            console.warn(f"truncation cut off {lost:.1%} of the rationale words")
    return Prepared(registry, loaded, data, batches, truncated, max_length)


def attribution_stream(
    prepared: Prepared,
    methods: Sequence[MethodState],
    seed: int,
    description: str = "attributing",
    quiet: bool = False,
    skip: Callable[[Batch], set[str]] | None = None,
) -> Iterator[tuple[Trace, dict[str, Attribution]]]:
    """Per batch: one trace, then every still-working method's attribution of it.

    Each method is charged its standalone cost: the shared forward pass, its own time, and
    every shared intermediate it read (whichever method computed it first); its peak memory is
    counted the same way (attrib_bench.memory.standalone_megabytes). ``skip(batch)`` names
    methods whose results for the batch are known already (the cache, which fills them in):
    they do not run, and a batch with nothing left to run is not traced at all.
    """
    with console.progress(disable=quiet) as bar:
        task = bar.add_task(description, total=len(prepared.data.examples))
        for batch in prepared.batches:
            known = skip(batch) if skip is not None else set()
            todo = [m for m in methods if m.spec not in known]
            if known and not todo:
                bar.advance(task, len(batch.examples))
                continue
            requires = set().union(*(m.attributor.requires for m in todo))
            batch = batch.to(prepared.loaded.device)
            start = time.perf_counter()
            trace = trace_batch(prepared.loaded, batch, requires, seed)
            trace_seconds = time.perf_counter() - start
            results: dict[str, Attribution] = {}
            for method in todo:
                if method.error is not None:
                    continue
                computed_before = set(trace.memo_seconds)
                trace.accessed = set()
                start = time.perf_counter()
                try:
                    with PeakMemory(prepared.loaded.device) as peak:
                        results[method.spec] = method.attributor.attribute(trace)
                except UsageError:
                    raise
                except Exception as error:  # one method failing must not sink the run
                    method.error = f"{type(error).__name__}: {error}"
                    console.warn(f"{method.spec} failed and is dropped: {method.error}")
                    continue
                elapsed = time.perf_counter() - start
                method.seconds += trace.standalone_seconds(elapsed, computed_before) + trace_seconds
                method.examples += len(batch.examples)
                memory = standalone_megabytes(
                    trace, method.attributor.requires, peak.megabytes, computed_before
                )
                method.peak_memory_mb = max(method.peak_memory_mb, memory)
            yield trace, results
            bar.advance(task, len(batch.examples))


def _store(method: MethodState, evaluator: str, scores: dict, batch: Batch) -> None:
    table = method.scores.setdefault(evaluator, {})
    for kind, values_LB in scores.items():
        by_id = table.setdefault(kind, {})
        for column, example in enumerate(batch.examples):
            by_id[example.id] = np.asarray(values_LB)[:, column]


def run_benchmark(config: RunConfig, quiet: bool = False, cache: bool = True) -> dict[str, Any]:
    """Run every selected attributor and evaluator; return the result document (see results).

    With ``cache`` (and no ``ATTRIB_BENCH_NO_CACHE=1``), per-example results found on disk are
    reused and new ones written after each batch (attrib_bench.cache).
    """
    from attrib_bench import cache as result_cache
    from attrib_bench.results import build_result

    torch.manual_seed(config.seed)
    prepared = prepare(config, quiet)
    registry = prepared.registry
    specs = [Spec.parse(s) for s in (config.attributors or registry.defaults("attributors"))]
    methods = [MethodState(str(s), registry.attributor(s)) for s in specs]
    if FLOOR in registry.attributors and all(s.name != FLOOR for s in specs):
        methods.append(MethodState(FLOOR, registry.attributor(FLOOR), added=True))
    evaluators = {
        str(Spec.parse(s)): registry.evaluator(s)
        for s in (config.evaluators or registry.defaults("evaluators"))
    }
    reference_spec = str(Spec.parse(config.reference))
    reference_method = next((m for m in methods if m.spec == reference_spec), None)
    extra = []
    if reference_method is None and any(e.needs_reference for e in evaluators.values()):
        reference_method = MethodState(reference_spec, registry.attributor(config.reference))
        extra = [reference_method]
    evaluator_errors: dict[str, str] = {}
    store = None
    if result_cache.enabled(cache):
        store = result_cache.ResultCache(
            prepared, methods, extra, evaluators, reference_spec, config.seed
        )
    skip = store.restore if store is not None else None
    for trace, results in attribution_stream(
        prepared, methods + extra, config.seed, quiet=quiet, skip=skip
    ):
        reference = results.get(reference_spec)
        cached_reference = reference_method is not None and reference_method.error is None
        if reference is None and store is not None and cached_reference:
            reference = store.attribution(reference_spec, trace.batch)  # not run on this batch
        for name, evaluator in evaluators.items():
            if name in evaluator_errors:
                continue
            if evaluator.needs_reference and reference is None:
                evaluator_errors[name] = f"reference {reference_spec} failed: " + str(
                    reference_method.error
                )
                continue
            for method in methods:
                if method.spec not in results:
                    continue
                context = EvalContext(trace, reference, config.seed, method.attributor)
                try:
                    scores = evaluator.score(results[method.spec], context)
                except Exception as error:
                    evaluator_errors[name] = f"{type(error).__name__}: {error} (on {method.spec})"
                    console.warn(f"evaluator {name} failed: {evaluator_errors[name]}")
                    break
                _store(method, name, scores, trace.batch)
        if store is not None:
            store.save(trace.batch, results)
    document = build_result(config, prepared, methods, evaluators, evaluator_errors)
    if store is not None:
        document["cache"] = store.describe()
    return document


def summarize_scores(method: MethodState, example_ids: list[str], seed: int) -> tuple[dict, dict]:
    """Per evaluator and kind: per-layer summaries, and the per-example scores in data order."""
    summaries: dict[str, dict[str, list]] = {}
    per_example: dict[str, dict[str, list]] = {}
    for evaluator, kinds in method.scores.items():
        for kind in KINDS:
            if kind not in kinds:
                continue
            matrix = np.stack([kinds[kind][i] for i in example_ids], axis=1)  # (L, examples)
            summaries.setdefault(evaluator, {})[kind] = [
                {"layer": layer + 1, **summarize(matrix[layer], seed)}
                for layer in range(matrix.shape[0])
            ]
            per_example.setdefault(evaluator, {})[kind] = [
                [None if np.isnan(v) else float(v) for v in row] for row in matrix
            ]
    return summaries, per_example
