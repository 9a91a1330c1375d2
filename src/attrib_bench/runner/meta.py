"""Meta-evaluation by controlled degradation: which evaluators recover an order known in advance.

From a base method's scored row (its last aggregated row, the one every evaluator reads), the
explainers are, best first: the base itself (level 0), then the base with a share s = 25, 50,
75 and 100% of each example's candidate tokens (real, not special) given random scores, then
the reversed ranking (the base's scores negated). A faithful evaluator must score them in that
order. Random scores: the m = round(s * n) replaced positions (of n candidates) take m of the
row's own candidate scores drawn without replacement, in random order, from a generator seeded
by (seed, level, example id) (``toolkit.erasure.example_generator``). The row's values stay the
same set, so only the order degrades: magnitude-reading evaluators (the soft ones' min-max) see
the same scale, and s = 100% is a uniform random permutation of the row (pure noise). Gaussian
scores of the row's spread would change its range and signs as well as its order.

Per evaluator, with the explainers' known quality q = (6, 5, ..., 0) and its scores oriented by
``higher_is_better``: the per-example agreement, Kendall's tau-b (``scipy.stats.kendalltau``)
between q and the example's scores, averaged over the examples with a bootstrap CI over them;
and the corpus agreement, tau between q and the scores' means over the examples every explainer
scored, its CI a bootstrap over those examples (``results.stats.bootstrap_ci``). An evaluator
whose corpus CI does not lie above 0 is flagged unreliable: on this model and data it cannot
tell the base from noise and its reversal.

The explainers are scored as a run scores methods (``runner.engine``): one trace per batch, and
per evaluator every explainer's ``plan`` then ``score``, so that the erasures of all explainers
share passes, and the batch's erasure cache (keyed by the tokens erased) serves every later
evaluator too. Cost per evaluator, in the order scored (what it added to those before it):
seconds (``core.clock``), model passes, inputs run, and distinct erased inputs (new cache keys,
plus the soft evaluators' inputs, each a fresh random draw).

Two models: the run's own, and a synthetic bag-of-tokens classifier whose exact attribution is
known (``model.synthetic``), on the same texts labelled by that model. Only there is the order
certain: on the run's model it holds as far as the base beats noise, so a flag there says the
evaluator cannot tell this base from noise on this model (a base no better than random leaves
no order to recover).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attrib_bench.core import clock, console
from attrib_bench.core.errors import UsageError, unknown_choice
from attrib_bench.core.interfaces import Attribution, EvalContext, compares_models
from attrib_bench.core.plugin_info import attributor_info, evaluator_info
from attrib_bench.core.registry import Registry, Spec
from attrib_bench.core.target import DEFAULT_TARGET
from attrib_bench.core.trace import Trace, default_target_position
from attrib_bench.data.load import LoadedData
from attrib_bench.results.paired import paired_differences
from attrib_bench.results.stats import bootstrap_ci
from attrib_bench.runner.engine import _evaluate, attribution_stream
from attrib_bench.runner.state import MethodState, Prepared, RunConfig
from attrib_bench.toolkit.erasure import (
    CACHE_KEY,
    RUN_COUNT_KEY,
    candidates,
    example_generator,
)
from attrib_bench.toolkit.ranking import scored_row

#: Shares of each example's candidate tokens given random scores, best (the base) first.
LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
SCHEMA = "attrib-bench/meta"
SCHEMA_PATH = Path(__file__).parents[1] / "results" / "schema" / "meta.schema.json"
RULE = "flagged: the corpus tau's 95% bootstrap CI does not lie above 0"


def degrade(
    scores_BN: np.ndarray,
    candidates_BN: np.ndarray,
    level: float | None,
    seed: int,
    example_ids: Sequence[str],
) -> np.ndarray:
    """The scores with a share ``level`` of each row's candidates given m of the row's own
    candidate scores, drawn without replacement in random order (m = round(level * n), halves
    up); ``level=None``: the reversed ranking, every score negated. Seeded per (seed, level,
    example id), so neither the batch nor the other levels change a row."""
    if level is None:
        return -scores_BN
    out = scores_BN.copy()
    for b, example_id in enumerate(example_ids):
        positions = np.flatnonzero(candidates_BN[b])
        m = math.floor(level * len(positions) + 0.5)
        if m == 0:
            continue
        generator = example_generator(seed, f"{example_id}/meta-noise-{level}")
        replaced = positions[torch.randperm(len(positions), generator=generator)[:m].numpy()]
        drawn = torch.randperm(len(positions), generator=generator)[:m].numpy()
        out[b, replaced] = scores_BN[b, positions[drawn]]
    return out


class Degraded:
    """A base method's scored row, degraded (``degrade``). The base runs once per batch (a memo
    on the trace) whichever degraded explainer asks first."""

    def __init__(self, base: Any, base_spec: str, level: float | None, seed: int) -> None:
        self.base, self.base_spec, self.level, self.seed = base, base_spec, level, seed
        what = "reversed" if level is None else f"{round(level * 100)}% noise"
        self.name = f"{base_spec} ({what})"
        self.description = f"{base_spec}'s scored row, {what}"
        self.requires = base.requires
        for attribute in ("needs", "target_positions"):  # what the runner checks of the base
            if hasattr(base, attribute):
                setattr(self, attribute, getattr(base, attribute))

    def attribute(self, trace: Trace) -> Attribution:
        base = trace.memo(f"meta.base/{self.base_spec}", lambda: self.base.attribute(trace))
        scores_BN = scored_row(base, -1).detach().double().cpu().numpy()
        ids = [example.id for example in trace.batch.examples]
        degraded = degrade(scores_BN, candidates(trace), self.level, self.seed, ids)
        rows_BN = torch.as_tensor(degraded, device=trace.batch.input_ids_BN.device)
        rows_BN = rows_BN * trace.batch.attention_mask_BN.to(rows_BN.dtype)
        return Attribution(aggregated_BLN=rows_BN[:, None, :])


class DegradedOwnTarget(Degraded):
    """``Degraded`` of a base that explains its own target (``explained_target``): the
    removal evaluators then score the class the base explains."""

    def explained_target(self, trace: Trace) -> Any:
        return self.base.explained_target(trace)


def degraded_explainers(base: Any, base_spec: str, seed: int) -> list[Degraded]:
    """The explainers in the known order, best first: every level, then the reversal."""
    kind = DegradedOwnTarget if attributor_info(base).explains_own_target else Degraded
    return [kind(base, base_spec, level, seed) for level in (*LEVELS, None)]


def tau(known: np.ndarray, scores: np.ndarray) -> float:
    """Kendall's tau-b of the scores against the known quality; NaN for constant scores.

    tau-b reads only the order of each side, ties included, so it is taken of the scores'
    dense ranks and remembered per (known, ranks): a bootstrap of six explainers' means meets
    few distinct orders, and scipy's call costs a millisecond."""
    if len(scores) < 2 or np.ptp(scores) == 0:
        return math.nan
    ranks = np.unique(scores, return_inverse=True)[1]
    return _tau_of_ranks(tuple(known.tolist()), tuple(ranks.ravel().tolist()))


@functools.lru_cache(maxsize=1 << 14)
def _tau_of_ranks(known: tuple[float, ...], ranks: tuple[int, ...]) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(known, ranks).statistic)


@dataclass
class Cost:
    """What an evaluator added to the batches' work (see the module docstring)."""

    seconds: float = 0.0
    passes: int = 0
    inputs: int = 0
    distinct: int = 0

    def add(self, other: Cost) -> None:
        for name in ("seconds", "passes", "inputs", "distinct"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class MetaEvaluator:
    """One evaluator's agreement with the known order on one model."""

    name: str
    status: str
    error: str | None = None
    higher_is_better: bool = True
    #: Per explainer (known order), the mean score over the examples all of them scored.
    means: list[float] = field(default_factory=list)
    #: The per-example tau: mean, 95% CI, examples defined, examples undefined.
    tau_example: dict[str, Any] = field(default_factory=dict)
    #: The tau of the means: value, 95% CI, examples.
    tau_corpus: dict[str, Any] = field(default_factory=dict)
    flagged: bool = False
    #: No degraded explainer scores significantly better than the base (``base_best``).
    base_best: bool = False
    cost: Cost = field(default_factory=Cost)


@dataclass
class MetaRun:
    """The meta-evaluation on one model: each evaluator's agreement and the total cost."""

    model: str
    model_id: str
    #: The synthetic bag-of-tokens model (``model.synthetic``), not the run's own.
    synthetic: bool
    base: str
    explainers: list[str]
    examples: int
    evaluators: dict[str, MetaEvaluator]
    cost: Cost

    @property
    def flagged(self) -> list[str]:
        return [name for name, row in self.evaluators.items() if row.flagged]


@dataclass
class MetaResult:
    """What ``attrib_bench.meta`` returns: a run per model (synthetic first), and settings."""

    runs: list[MetaRun]
    seed: int
    dataset: str
    levels: tuple[float, ...] = LEVELS
    #: The JSON file it was written to or read from, if any.
    source: str | None = None

    def to_document(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": 1,
            "seed": self.seed,
            "dataset": self.dataset,
            "levels": list(self.levels),
            "rule": RULE,
            "runs": [_clean(dataclasses.asdict(run)) for run in self.runs],
        }

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> MetaResult:
        validate_meta(document, "meta result")
        runs = []
        for run in document["runs"]:
            evaluators = {
                name: MetaEvaluator(**{**row, "cost": Cost(**row["cost"])})
                for name, row in run["evaluators"].items()
            }
            runs.append(MetaRun(**{**run, "evaluators": evaluators, "cost": Cost(**run["cost"])}))
        return cls(runs, document["seed"], document["dataset"], tuple(document["levels"]))


def _clean(value: Any) -> Any:
    """NaN as null, tuples as lists: what the JSON holds."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(item) for item in value]
    return value


def validate_meta(document: Any, name: str) -> None:
    """One UsageError naming ``name`` and the field when the document breaks the schema
    (``results/schema/meta.schema.json``)."""
    import json

    from attrib_bench.results.typed import check_json, json_validator

    schema = json.loads(SCHEMA_PATH.read_text())
    check_json(document, json_validator(schema), f"{name!r} is not a valid meta result", "it")


def select_evaluators(registry: Registry, specs: Sequence[str] | None) -> dict[str, Any]:
    """The evaluators given, or every faithfulness evaluator (family ``faithfulness``); one
    that compares models or reads a reference method is a UsageError."""
    if specs is None:
        specs = [
            name
            for name, reg in sorted(registry.evaluators.items())
            if reg.info.family == "faithfulness"
            and not compares_models(reg.obj)
            and not reg.info.needs_reference
        ]
    evaluators = {str(Spec.parse(spec)): registry.evaluator(spec) for spec in specs}
    for name, evaluator in evaluators.items():
        if compares_models(evaluator):
            raise UsageError(
                f"evaluator {name} compares one method across models; the meta-evaluation "
                "scores one attribution at a time: leave it out of --evaluators"
            )
        if evaluator_info(evaluator).needs_reference:
            raise UsageError(
                f"evaluator {name} scores against a reference method, which the degraded "
                "explainers are made from: leave it out of --evaluators"
            )
    return evaluators


def base_attributor(registry: Registry, spec: str) -> Any:
    """The base method, a UsageError naming the known ones when it is not installed."""
    if Spec.parse(spec).name not in registry.attributors:
        raise unknown_choice("base method (--meta-base)", spec, registry.attributors)
    return registry.attributor(spec)


class PassCounter:
    """Counts the model's forward passes and the inputs they carry while ``counting``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.passes = 0
        self.inputs = 0
        self.active = False
        self.handles: dict[int, Any] = {}
        self.watch(model)

    def watch(self, model: torch.nn.Module) -> None:
        """Count ``model``'s passes too (a ``scorer=`` model), once however often asked."""
        if id(model) not in self.handles:
            self.handles[id(model)] = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def remove(self) -> None:
        for handle in self.handles.values():
            handle.remove()

    def _count(self, _module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not self.active:
            return
        first = kwargs.get("input_ids")
        if first is None:
            first = kwargs.get("inputs_embeds", args[0] if args else None)
        self.passes += 1
        self.inputs += 0 if first is None else int(first.shape[0])

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.active = True
        try:
            yield
        finally:
            self.active = False


def meta_run(
    prepared: Prepared,
    base_spec: str,
    base: Any,
    evaluators: Mapping[str, Any],
    seed: int,
    quiet: bool = True,
    synthetic: bool = False,
) -> MetaRun:
    """Score every degraded explainer of ``base_spec`` with every evaluator on ``prepared``'s
    batches; a failing evaluator is reported, the others go on."""
    explainers = degraded_explainers(base, base_spec, seed)
    methods = [MethodState(e.name, e) for e in explainers]
    costs = {name: Cost() for name in evaluators}
    errors: dict[str, str] = {}
    counter = PassCounter(prepared.loaded.model)
    try:
        for trace, results in attribution_stream(
            prepared, methods, seed, "meta-evaluating", quiet=quiet
        ):
            context = EvalContext(trace, None, seed)
            for name, evaluator in evaluators.items():
                if name in errors:
                    continue
                costs[name].add(
                    _evaluate_counted(name, evaluator, methods, results, context, errors, counter)
                )
    finally:
        counter.remove()
    failed = next((m for m in methods if m.error is not None), None)
    if failed is not None:
        raise UsageError(
            f"meta: base method {base_spec} failed on {prepared.loaded.name}: {failed.error}; "
            "choose another with --meta-base"
        )
    ids = [example.id for example in prepared.batches.examples]
    rows = {
        name: _agreement(name, evaluator, methods, ids, seed, errors.get(name))
        for name, evaluator in evaluators.items()
    }
    total = Cost()
    for name, row in rows.items():
        row.cost = costs[name]
        total.add(costs[name])
    return MetaRun(
        model=prepared.loaded.name or prepared.loaded.model_id,
        model_id=prepared.loaded.model_id,
        synthetic=synthetic,
        base=base_spec,
        explainers=[m.spec for m in methods],
        examples=len(ids),
        evaluators=rows,
        cost=total,
    )


def _evaluate_counted(
    name: str,
    evaluator: Any,
    methods: list[MethodState],
    results: dict[str, Attribution],
    context: EvalContext,
    errors: dict[str, str],
    counter: PassCounter,
) -> Cost:
    """One evaluator's plan then score of every explainer on the batch, and what it cost.
    An evaluator with ``scorer=`` runs its erasures on the scorer, cached in the scorer's
    namespace of the batch's memo: those passes and that cache are the ones counted."""
    shared = context.trace.shared
    if scored_by_copy(evaluator) and name not in errors:
        try:
            scoring = evaluator.scoring(context)  # loads the scorer; its logits on the batch
        except UsageError as error:
            errors[name] = str(error)
            console.warn(f"evaluator {name} failed: {error}")
            return Cost()
        counter.watch(scoring.loaded.model)
        shared = scoring.shared
    cached = len(shared.get(CACHE_KEY, {}))
    run_before = shared.get(RUN_COUNT_KEY, 0)
    passes, inputs = counter.passes, counter.inputs
    start = clock.now()
    with counter.counting():
        for stage in ("plan", "score"):
            if stage == "plan" and not evaluator_info(evaluator).plans:
                continue
            if name not in errors:
                _evaluate(name, evaluator, methods, results, context, errors, stage)
    seconds = clock.now() - start
    inputs = counter.inputs - inputs
    cache_inputs = shared.get(RUN_COUNT_KEY, 0) - run_before
    new_keys = len(shared.get(CACHE_KEY, {})) - cached
    return Cost(seconds, counter.passes - passes, inputs, new_keys + inputs - cache_inputs)


def _agreement(
    name: str,
    evaluator: Any,
    methods: list[MethodState],
    ids: list[str],
    seed: int,
    error: str | None,
) -> MetaEvaluator:
    """The evaluator's taus against the known order (best first: quality M-1 ... 0)."""
    higher = evaluator_info(evaluator).higher_is_better
    method_error = next(
        (m.evaluator_errors[name] for m in methods if name in m.evaluator_errors), None
    )
    if error is not None or method_error is not None:
        return MetaEvaluator(name, "failed", error or method_error, higher)
    scores_EM = np.full((len(ids), len(methods)), math.nan)
    for m, method in enumerate(methods):
        column = method.scores.get(name, {}).get("aggregated", {})
        for e, example_id in enumerate(ids):
            if example_id in column:
                scores_EM[e, m] = column[example_id][-1]
    oriented_EM = scores_EM if higher else -scores_EM
    known_M = np.arange(len(methods))[::-1].astype(float)
    per_example = []
    for row in oriented_EM:
        defined = ~np.isnan(row)
        per_example.append(tau(known_M[defined], row[defined]) if defined.sum() >= 2 else math.nan)
    per_example = np.array(per_example)
    finite = per_example[~np.isnan(per_example)]
    complete = oriented_EM[~np.isnan(oriented_EM).any(axis=1)]
    means = complete.mean(axis=0) if len(complete) else np.full(len(methods), math.nan)
    corpus = tau(known_M, means) if len(complete) else math.nan
    corpus_ci = bootstrap_ci(complete, seed, statistic=lambda rows: tau(known_M, rows.mean(axis=0)))
    return MetaEvaluator(
        name,
        "ok",
        None,
        higher,
        means=[float(v if higher else -v) for v in means],
        tau_example={
            "mean": float(finite.mean()) if len(finite) else math.nan,
            "ci95": bootstrap_ci(finite, seed),
            "n": len(finite),
            "nan": int(np.isnan(per_example).sum()),
        },
        tau_corpus={"value": corpus, "ci95": corpus_ci, "n": len(complete)},
        flagged=not corpus_ci[0] > 0,
        base_best=base_best(complete, seed),
    )


def base_best(oriented_EM: np.ndarray, seed: int) -> bool:
    """Whether no degraded explainer scores significantly better than the base (column 0):
    the paired bootstrap of base minus each (``results.paired``) has no 95% CI wholly below
    0. Not a strict order of the means: a score that saturates (Soft-NS clips at 1) ties the
    base with its mildest degradation up to float noise."""
    if len(oriented_EM) < 2:
        return False
    differences = paired_differences(oriented_EM[:, :1] - oriented_EM[:, 1:], seed)
    return all(not entry["ci95"][1] < 0 for entry in differences)


def synthetic_prepared(
    registry: Registry, data: LoadedData, max_length: int | None, config: RunConfig
) -> Prepared:
    """``data``'s texts on the synthetic bag-of-tokens model (MiniLM's tokenizer, weights
    seeded by the run's seed), each labelled by that model's prediction (its weight sum on
    the whole text), so that gold-label evaluators (masked accuracy) read its own classes."""
    from transformers import AutoTokenizer

    from attrib_bench.data.batches import plan_batches
    from attrib_bench.model.finetune import default_model_source
    from attrib_bench.model.load import resolve_device
    from attrib_bench.model.synthetic import synthetic_model, weight_sums

    if data.next_tokens is not None:
        raise UsageError(
            "meta: the synthetic model is a classifier and cannot read next-token data; "
            "use only=model (--only model)"
        )
    tokenizer = AutoTokenizer.from_pretrained(default_model_source())
    loaded = synthetic_model(
        tokenizer,
        config.seed,
        resolve_device(config.device),
        architectures=registry.architecture_specs(),
    )
    sums = weight_sums(loaded, [(e.text, e.text_pair) for e in data.examples])
    examples = [
        dataclasses.replace(e, label=int(d > 0)) for e, d in zip(data.examples, sums, strict=True)
    ]
    limit = loaded.max_length if max_length is None else min(max_length, loaded.max_length)
    batches = plan_batches(examples, tokenizer, config.batch_size, limit)
    return Prepared(
        registry,
        loaded,
        dataclasses.replace(data, examples=examples),
        batches,
        batches.truncated,
        limit,
        target=DEFAULT_TARGET.resolved(default_target_position(loaded)),
    )


#: ``only=``: the synthetic model, the run's model, or both (None).
ONLY = ("synthetic", "model")


def scored_by_copy(evaluator: Any) -> bool:
    """Whether the evaluator scores with a ``scorer=`` model: a fine-tune of the run's model,
    which cannot score the synthetic model's inputs in its place, so it is left out there."""
    return bool((evaluator_info(evaluator).settings or {}).get("scorer"))


def meta(
    config: RunConfig,
    base: str | None = None,
    evaluators: Sequence[str] | None = None,
    only: str | None = None,
    quiet: bool = True,
) -> MetaResult:
    """The meta-evaluation on the synthetic model (its exact attribution the base) and on the
    run's model (base: ``base``, default the run's reference method). Settings are checked
    before any model or data loads."""
    from attrib_bench.core.registry import load_registry
    from attrib_bench.data.load import load_examples
    from attrib_bench.model.synthetic import ExactAttributor
    from attrib_bench.runner.engine import prepare

    if only is not None and only not in ONLY:
        raise unknown_choice("meta only", only, ONLY)
    if config.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {config.batch_size}")
    registry = load_registry(config.plugins)
    base_spec = str(Spec.parse(base or config.reference))
    base_method = base_attributor(registry, base_spec)
    chosen = select_evaluators(registry, evaluators)
    torch.manual_seed(config.seed)
    prepared = None
    if only != "synthetic":
        prepared = prepare(dataclasses.replace(config, attributors=[base_spec]), quiet)
        data, max_length = prepared.data, prepared.max_length
    else:
        data = load_examples(
            config.dataset,
            config.split,
            config.text_column,
            config.text_pair_column,
            config.label_column,
            config.limit,
        )
        max_length = config.max_length
    runs = []
    if only != "model":
        synthetic = synthetic_prepared(registry, data, max_length, config)
        exact = ExactAttributor()
        unscored = {name: e for name, e in chosen.items() if not scored_by_copy(e)}
        runs.append(meta_run(synthetic, "exact", exact, unscored, config.seed, quiet, True))
    if prepared is not None:
        runs.append(meta_run(prepared, base_spec, base_method, chosen, config.seed, quiet))
    for run in runs:
        warn_flagged(run)
    return MetaResult(runs, config.seed, data.name)


def run_section(config: RunConfig, base: str | None, quiet: bool = True) -> dict[str, Any]:
    """``run --meta``: the meta-evaluation of the run's evaluators that score one attribution
    without a reference, as the result's ``meta`` section; a UsageError when none does."""
    from attrib_bench.core.registry import load_registry

    registry = load_registry(config.plugins)
    specs = config.evaluators or registry.defaults("evaluators")
    scoring = [
        spec
        for spec in specs
        if not compares_models(evaluator := registry.evaluator(spec))
        and not evaluator_info(evaluator).needs_reference
    ]
    if not scoring:
        raise UsageError(
            f"run --meta: none of the evaluators ({', '.join(specs)}) scores one attribution "
            "without a reference; add one, e.g. --evaluators comprehensiveness,sufficiency"
        )
    document = meta(config, base, scoring, quiet=quiet).to_document()
    validate_meta(document, "run --meta")
    return document


def warn_flagged(run: MetaRun) -> None:
    """One line per model naming the evaluators that could not order the degradations."""
    if run.flagged:
        console.warn(
            f"meta: on {run.model}, {', '.join(run.flagged)} could not order the known "
            "degradations (corpus tau CI not above 0): do not trust them on this model"
        )
