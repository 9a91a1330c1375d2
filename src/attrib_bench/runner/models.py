"""A run over several models of one architecture (seeds): ``run --models A,B,...``.

Each model gets a normal single-model run (attrib_bench.runner.engine.run_single): every batch
traced once per model, every per-example result cached under that model's key, so a later
``run --model B`` reuses them. The runs keep each method's rows per example; the evaluators that
compare models (attrib_bench.ModelEvaluator, such as ``seed-invariance``) then score, per method
and example, its rows under every model, and, for those that need a floor, under a randomly
initialised model of the same architecture (one more run, for its rows only).

The result is the first model's document (its leaderboard, per-model evaluators and all) with
the model-comparing evaluators' scores added to every method, and a ``models`` section: each
model's leaderboard summary and the stability of the method ranking across models (Kendall
tau of the methods ordered by the first per-model evaluator, the reference excluded).
"""

from __future__ import annotations

import dataclasses
from itertools import combinations
from typing import Any

import numpy as np
import torch
from scipy.stats import kendalltau

from attrib_bench.core import console
from attrib_bench.core.errors import UsageError
from attrib_bench.core.interfaces import KINDS, compares_models
from attrib_bench.core.registry import Spec, load_registry
from attrib_bench.model.finetune import warn_near_chance
from attrib_bench.runner.engine import SingleRun, prepare, run_benchmark, run_single
from attrib_bench.runner.state import MethodState, Prepared, RunConfig

#: Model-comparing evaluators a run over several models scores when none are selected.
DEFAULT_MODEL_EVALUATORS = (
    "seed-invariance",
    "seed-invariance:against=random-init",
    "seed-invariance:measure=jaccard",
    "seed-invariance:measure=jaccard,against=random-init",
)


def _check_models(config: RunConfig) -> list[str]:
    models = list(config.models or [])
    if config.model is not None:
        raise UsageError("give --model (one model) or --models (several), not both")
    if len(models) < 2:
        raise UsageError(f"--models needs at least 2 comma-separated models, got {models}")
    if len(set(models)) != len(models):
        raise UsageError(f"--models lists a model twice: {models}")
    return models


def split_evaluators(config: RunConfig) -> tuple[list[str] | None, dict[str, Any]]:
    """The per-model evaluator specs (None: the defaults) and the model-comparing ones."""
    registry = load_registry(config.plugins)
    if config.evaluators is None:
        defaults = registry.defaults("model_evaluators")
        specs = [s for s in DEFAULT_MODEL_EVALUATORS if Spec.parse(s).name in defaults]
        specs += [s for s in defaults if s not in specs]
        return None, {s: registry.evaluator(s) for s in specs}
    comparing = {}
    per_model = []
    for spec in config.evaluators:
        evaluator = registry.evaluator(spec)
        if compares_models(evaluator):
            comparing[str(Spec.parse(spec))] = evaluator
        else:
            per_model.append(spec)
    return per_model, comparing


def run_config(config: RunConfig, quiet: bool = False, cache: bool = True) -> dict[str, Any]:
    """The result document of a run: over several models when ``config.models`` names them
    (:func:`run_models`), else of one (engine.run_benchmark)."""
    if config.models is not None:
        return run_models(config, quiet, cache)
    return run_benchmark(config, quiet, cache)


def run_models(config: RunConfig, quiet: bool = False, cache: bool = True) -> dict[str, Any]:
    """Run every model, then score the model-comparing evaluators; the result document."""
    models = _check_models(config)
    per_model, comparing = split_evaluators(config)
    total = len(models) + any(e.needs_floor for e in comparing.values())
    configs = [
        dataclasses.replace(config, model=model, models=None, evaluators=per_model)
        for model in models
    ]
    prepared = [prepare(one, quiet) for one in configs]  # every model loads before the long part
    check_comparable(models, prepared)
    for model, inputs in zip(models, prepared, strict=True):  # seeds of an untrained model
        warn_near_chance(inputs.loaded.model_id, f"--models {model}")
    runs: list[SingleRun] = []
    for index, (one, inputs) in enumerate(zip(configs, prepared, strict=True)):
        description = f"attributing, model {index + 1}/{total}"
        runs.append(run_single(one, quiet, cache, True, description, inputs))
    floor = None
    floor_name = None
    if total > len(models):
        from attrib_bench.model.random_init import random_init_copy, random_init_name

        loaded = runs[0].prepared.loaded
        directory = random_init_copy(loaded, config.seed)
        floor_name = random_init_name(loaded.model_id, config.seed)
        one = dataclasses.replace(config, model=str(directory), models=None, evaluators=[])
        description = f"attributing, model {total}/{total} (random init)"
        floor = run_single(one, quiet, cache, keep_rows=True, description=description)
    primary = runs[0]
    for name, evaluator in comparing.items():
        _score_across(name, evaluator, runs, floor)
    primary.evaluators.update(comparing)
    primary.config = config
    document = primary.document()
    document["models"] = models_section(models, runs, floor_name, document, set(comparing))
    return document


def check_comparable(models: list[str], prepared: list[Prepared]) -> None:
    """One line (exit 2) unless every model tokenises the examples as the first does and has
    as many layers: the rows of one input under two models must line up token by token."""
    first = prepared[0]
    layers = getattr(first.loaded.model.config, "num_hidden_layers", None)
    model_type = first.loaded.model.config.model_type
    for model, other in zip(models[1:], prepared[1:], strict=True):
        same_tokens = len(other.batches) == len(first.batches) and all(
            torch.equal(a.input_ids_BN, b.input_ids_BN)
            for a, b in zip(first.batches, other.batches, strict=True)
        )
        if not same_tokens:
            raise UsageError(
                f"--models {models[0]!r} and {model!r} tokenise the examples differently: "
                "models compared per token must share the tokenizer"
            )
        other_layers = getattr(other.loaded.model.config, "num_hidden_layers", None)
        other_type = other.loaded.model.config.model_type
        if (other_type, other_layers) != (model_type, layers):
            raise UsageError(
                f"--models {models[0]!r} is a {model_type} of {layers} layers and {model!r} a "
                f"{other_type} of {other_layers}: seed models must share the architecture"
            )


def _score_across(
    name: str, evaluator: Any, runs: list[SingleRun], floor: SingleRun | None
) -> None:
    """Score every method of the first run with a model-comparing evaluator, per example."""
    states = [{m.spec: m for m in run.methods} for run in runs]
    floor_states = {m.spec: m for m in floor.methods} if floor is not None else {}
    for method in runs[0].methods:
        if method.error is not None:
            continue
        under = [by_spec[method.spec] for by_spec in states]
        base = floor_states.get(method.spec) if evaluator.needs_floor else None
        failed = [run.config.model for run, m in zip(runs, under, strict=True) if m.error]
        if base is not None and base.error:
            failed.append("the random-init model")
        if failed:
            method.evaluator_errors[name] = f"the method failed under {', '.join(failed)}"
            continue
        try:
            method.scores[name] = _per_example(evaluator, under, base)
        except UsageError:
            raise
        except Exception as error:  # one method's scores failing must not drop the others'
            method.evaluator_errors[name] = f"{type(error).__name__}: {error}"
            console.warn(f"evaluator {name} failed on {method.spec}: {error}")


def _per_example(
    evaluator: Any, under: list[MethodState], base: MethodState | None
) -> dict[str, dict[str, np.ndarray]]:
    """kind -> example id -> the evaluator's (L,) scores of that example's rows."""
    table: dict[str, dict[str, np.ndarray]] = {}
    for example_id, kinds in under[0].rows.items():
        for kind in KINDS:
            if kind not in kinds:
                continue
            rows = [state.rows[example_id][kind] for state in under]
            floor = base.rows[example_id][kind] if base is not None else None
            values = np.asarray(evaluator.score_models(rows, floor), dtype=float)
            if values.shape != (rows[0].shape[0],):
                raise ValueError(
                    f"score_models returned shape {values.shape}; expected ({rows[0].shape[0]},)"
                )
            table.setdefault(kind, {})[example_id] = values
    return table


def _last_means(document: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """method -> evaluator -> its last-layer aggregated mean (the leaderboard's column)."""
    summary = {}
    for spec, method in document["methods"].items():
        summary[spec] = {
            name: (kinds.get("aggregated") or [{}])[-1].get("mean")
            for name, kinds in method["scores"].items()
        }
    return summary


def models_section(
    models: list[str],
    runs: list[SingleRun],
    floor_name: str | None,
    document: dict[str, Any],
    comparing: set[str],
) -> dict[str, Any]:
    """Each model's leaderboard summary (the first model's from its finished ``document``,
    without the ``comparing`` evaluators) and the Kendall tau of the method ranking per pair."""
    per_model = []
    for index, (model, run) in enumerate(zip(models, runs, strict=True)):
        means = _last_means(document if index == 0 else run.document())
        if index == 0:
            means = {
                spec: {k: v for k, v in scores.items() if k not in comparing}
                for spec, scores in means.items()
            }
        per_model.append({"model": model, "name": run.prepared.loaded.name, "last_layer": means})
    return {
        "models": models,
        "floor_model": floor_name,
        "per_model": per_model,
        "ranking": ranking_stability(per_model, runs[0].config.reference),
    }


def ranking_stability(per_model: list[dict[str, Any]], reference: str) -> dict[str, Any] | None:
    """Kendall tau-b between the models' method rankings by the first per-model evaluator's
    last-layer aggregated mean (the reference, 1 by construction, left out); None without one."""
    first = per_model[0]["last_layer"]
    evaluators = next((list(scores) for scores in first.values() if scores), [])
    if not evaluators:
        return None
    by = evaluators[0]
    specs = [
        spec
        for spec in first
        if Spec.parse(spec).name != Spec.parse(reference).name
        and all((entry["last_layer"].get(spec) or {}).get(by) is not None for entry in per_model)
    ]
    count = len(per_model)
    tau = [[1.0 if i == j else None for j in range(count)] for i in range(count)]
    values = []
    for i, j in combinations(range(count), 2):
        x = [per_model[i]["last_layer"][s][by] for s in specs]
        y = [per_model[j]["last_layer"][s][by] for s in specs]
        value = float(kendalltau(x, y).statistic) if len(specs) >= 2 else float("nan")
        tau[i][j] = tau[j][i] = None if np.isnan(value) else value
        values.append(value)
    defined = [v for v in values if not np.isnan(v)]
    return {
        "evaluator": by,
        "kind": "aggregated",
        "layer": "last",
        "methods": specs,
        "kendall_tau": tau,
        "mean": float(np.mean(defined)) if defined else None,
        "min": float(np.min(defined)) if defined else None,
    }
