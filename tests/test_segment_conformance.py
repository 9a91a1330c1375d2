"""The conformance kit for segment plugins: the built-ins pass it on the tiny causal and
encoder-decoder models, and each kind of defect a third-party segment method or evaluator can
have is named with its fix."""

from __future__ import annotations

import numpy as np
import pytest

from attrib_bench import SegmentScorer, StepScores
from attrib_bench.core.plugin_info import segment_info
from attrib_bench.core.registry import load_registry
from attrib_bench.testing import (
    ConformanceError,
    check_segment_attributor,
    check_segment_evaluator,
)

REGISTRY = load_registry()


@pytest.mark.parametrize("name", list(REGISTRY.segment_attributors))
def test_builtin_segment_methods_conform(name):
    obj = REGISTRY.segment_attributors[name].obj
    report = check_segment_attributor(obj)
    causal = {"llama", "gpt2"} if "causal" in segment_info(obj).model_kinds else set()
    assert set(report.shapes) == causal | {"t5", "bart", "marian"}
    assert all(s == {"kit-cat": (4,), "kit-drink": (2,)} for s in report.shapes.values())
    assert report.steps == hasattr(REGISTRY.segment_attributors[name].obj, "attribute_steps")


@pytest.mark.parametrize("name", list(REGISTRY.segment_evaluators))
def test_builtin_segment_evaluators_conform(name):
    report = check_segment_evaluator(REGISTRY.segment_evaluators[name].obj)
    assert set(report.shapes) == {"llama", "gpt2", "t5", "bart", "marian"}


class Drop:
    """The drop of the answer's score without each segment: a conforming method."""

    name = "drop"
    description = "leave-one-out"

    def attribute_segments(self, scorer: SegmentScorer) -> np.ndarray:
        return scorer.full_score - scorer.leave_one_out().sum(axis=1)


class WrongShape(Drop):
    def attribute_segments(self, scorer):
        return np.zeros(scorer.count + 1)


class Unseeded(Drop):
    def attribute_segments(self, scorer):
        return np.random.default_rng().random(scorer.count)


class ReadsState(Drop):
    def attribute_segments(self, scorer):
        return super().attribute_segments(scorer) + len(scorer.memo)


class StepsOff(Drop):
    def attribute_steps(self, scorer):
        return np.zeros((len(scorer.answer_ids), scorer.count))


class PeeksAhead(Drop):
    """Steps that sum right, but a prefix scoring the token each step predicts."""

    def attribute_steps(self, scorer):
        T = len(scorer.answer_ids)
        steps = np.zeros((T, scorer.count))
        steps[0] = self.attribute_segments(scorer)
        return StepScores(steps, np.ones((T, T - 1)))


class AnswerStepsOnly(Drop):
    """Per-step drops of the answer's steps alone: right without a foil, short with one."""

    def attribute_steps(self, scorer):
        T = len(scorer.answer_ids)
        full_T = scorer.steps(np.ones((1, scorer.count), dtype=bool))[0, :T]
        return (full_T[None] - scorer.leave_one_out()[:, :T]).T


class Raises(Drop):
    def attribute_segments(self, scorer):
        raise ValueError("no context here")


def _problems(obj, check=check_segment_attributor) -> str:
    with pytest.raises(ConformanceError) as caught:
        check(obj)
    return str(caught.value)


def test_a_conforming_method_passes():
    report = check_segment_attributor(Drop())
    assert report.shapes["gpt2"]["kit-drink"] == (2,) and not report.steps


@pytest.mark.parametrize(
    "method, message",
    [
        (WrongShape(), "returned shape (5,), not (4,)"),
        (Unseeded(), "a second call on a fresh scorer gives other scores"),
        (ReadsState(), "read only the scorer's scores, never its state"),
        (StepsOff(), "attribute_steps does not sum over its rows to attribute_segments"),
        (PeeksAhead(), "the prefix gives a step a score for a token it does not read"),
        (Raises(), "attribute_segments(scorer) raised ValueError: no context here (at "),
    ],
)
def test_each_defect_is_named(method, message):
    problems = _problems(method)
    assert message in problems
    assert "example 'kit-cat'" in problems
    assert all(family in problems for family in ("llama", "gpt2", "t5", "bart", "marian"))


def test_steps_that_ignore_a_foil_are_named_on_the_contrastive_example():
    problems = _problems(AnswerStepsOnly(), check_segment_attributor)
    assert "example 'kit-drink': attribute_steps(scorer) (T = scorer.step_count rows)" in problems
    assert "returned shape (1, 2), not (4, 2)" in problems
    assert "example 'kit-cat'" not in problems


def test_a_method_runs_on_the_model_kinds_it_declares():
    class Seq2SeqOnly(Drop):
        model_kinds = ("seq2seq",)

    assert set(check_segment_attributor(Seq2SeqOnly()).shapes) == {"t5", "bart", "marian"}

    class Misdeclared(Drop):
        model_kinds = ("encoder",)

    assert "`model_kinds` must be a tuple among ('causal', 'seq2seq')" in _problems(Misdeclared())


def test_interface_problems_come_first_and_together():
    class Nameless:
        description = ""

    problems = _problems(Nameless())
    assert "(3 problems)" in problems
    assert "`name` must be a non-empty string" in problems
    assert "`description` must be a non-empty string" in problems
    assert "`attribute_segments` must be a method" in problems


class Drops:
    """The drop when the top-scored segment is removed: a conforming evaluator."""

    name = "drops"
    description = "top-1 drop"

    def evaluate_segments(self, scorer: SegmentScorer, scores_S: np.ndarray) -> dict:
        keep = np.ones(scorer.count, dtype=bool)
        keep[np.argmax(scores_S)] = False
        return {"top1": scorer.full_score - float(scorer.scores(keep[None])[0])}


class NamesVary(Drops):
    def evaluate_segments(self, scorer, scores_S):
        return {f"top{int(np.argmax(scores_S))}": 0.0}


class NotADict(Drops):
    def evaluate_segments(self, scorer, scores_S):
        return [1.0]


class Noisy(Drops):
    def evaluate_segments(self, scorer, scores_S):
        return {"top1": float(np.random.default_rng().random())}


def test_evaluator_defects_are_named():
    assert set(check_segment_evaluator(Drops()).shapes["llama"]["kit-cat"]) == {"top1"}
    assert "the value names differ between inputs" in _problems(
        NamesVary(), check_segment_evaluator
    )
    assert "returned list, not a dict of names to floats" in _problems(
        NotADict(), check_segment_evaluator
    )
    assert "a second call on a fresh scorer gives other values" in _problems(
        Noisy(), check_segment_evaluator
    )
