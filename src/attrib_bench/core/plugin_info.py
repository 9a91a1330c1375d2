"""Each plugin's optional attributes, read once into a frozen record with their defaults.

An attributor or evaluator must have its protocol's attributes (attrib_bench.core.interfaces);
everything else it may declare is listed here, with its default and meaning, and read in one
place, what it documents included (its paper from the class docstring's ``Reference:`` line,
its ``family``, a line per parameter in ``parameter_docs``: ``attrib-bench list`` and the docs'
tables show them): :func:`attributor_info` and :func:`evaluator_info` check the types (a wrong
one is one UsageError naming the plugin) and return the record the core reads, never the
object's attributes. The registry reads it at registration (``Registered.info``); a configured
copy (``name:key=value``) is read again, since its ``params`` differ.

:class:`AttributorBase` and :class:`EvaluatorBase` declare every optional attribute with its
default and docstring, for plugin authors who want the whole contract in one place; subclassing
them is optional.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from attrib_bench.core.architecture_spec import needs_problem
from attrib_bench.core.errors import UsageError

#: Every target position a method can explain (attrib_bench.core.target).
POSITIONS = ("first", "last")
#: What a method's rows may declare they sum to (``completeness``): the explained score f(x),
#: or its change from the method's baseline f(x) - f(x') (attrib_bench.toolkit.completeness).
COMPLETENESS = ("score", "score-change")
#: The class docstring's ``Reference:`` paragraph: that line and the lines up to a blank one.
_REFERENCE = re.compile(r"^Reference:[ \t]*(?P<text>.+(?:\n[ \t]*\S.*)*)", flags=re.M)


@dataclass(frozen=True, kw_only=True)
class PluginInfo:
    """What every attributor and evaluator may declare besides its protocol's attributes."""

    name: str
    description: str
    #: False: a costly plugin, run only when selected by name.
    in_default_run: bool = True
    #: Parameter names and defaults, and the allowed values of closed string parameters.
    parameters: Mapping[str, Any] = field(default_factory=dict)
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The parameters of this configured copy (None: the plugin takes none).
    settings: Mapping[str, Any] | None = None
    #: Bumped by the plugin when its output changes without its source changing (the cache).
    version: str = "0"
    #: Its paper, from the class docstring's ``Reference:`` line ("": none given).
    reference: str = ""
    #: Parameter name -> its meaning and range (or what its choices mean); may leave some out.
    parameter_docs: Mapping[str, str] = field(default_factory=dict)
    #: A method's kind ("attention", "norm-based", "decomposition", "gradient", "perturbation",
    #: "baseline"...) or what an evaluator measures ("faithfulness", "plausibility", "sanity",
    #: "agreement"...): the docs' tables group by it ("": not given).
    family: str = ""


@dataclass(frozen=True, kw_only=True)
class AttributorInfo(PluginInfo):
    """What the core knows of an attributor besides ``attribute``."""

    #: Trace fields ``attribute`` reads; the runner captures their union once per batch.
    requires: frozenset[str]
    #: Capability -> value it needs of the model family (attrib_bench.core.architecture_spec);
    #: None when it declares none, so reads no family internals beyond what it ``requires``.
    needs: Mapping[str, str] | None = None
    #: The target positions it can explain (a classification head reads the first token).
    target_positions: tuple[str, ...] = POSITIONS
    #: It explains its own score, not the run's target (``explained_target(trace)``).
    explains_own_target: bool = False
    #: What each example's row sums to, one of ``COMPLETENESS``; None: it claims nothing.
    #: The ``completeness`` evaluator reports the gap, the conformance kit checks it.
    completeness: str | None = None
    #: The model passes it costs beyond the traced forward pass, in words ("" not stated).
    passes: str = ""


@dataclass(frozen=True, kw_only=True)
class EvaluatorInfo(PluginInfo):
    """What the core knows of an evaluator (or a ModelEvaluator) besides ``score``."""

    #: ``score`` reads ``context.reference`` (the reference method's attribution).
    needs_reference: bool = False
    #: How leaderboards sort and which way the gate looks.
    higher_is_better: bool = True
    #: A corpus-level score (not a mean): the extra columns ``score`` returns as ``kind/part``,
    #: which ``aggregate(values_EP)`` turns into the score of the examples given.
    parts: tuple[str, ...] = ()
    #: It announces its model calls with ``plan(attribution, context)`` before any ``score``.
    plans: bool = False
    #: A ModelEvaluator: ``score_models`` compares one method's rows across models.
    compares_models: bool = False
    #: A ModelEvaluator that also reads the rows under a random-init model.
    needs_floor: bool = False
    #: False: its score thresholds the attribution, so float noise of re-batching may move it.
    batch_independent: bool = True


def _named(obj: Any) -> list[str]:
    problems = []
    if not isinstance(getattr(obj, "name", None), str) or not obj.name:
        problems.append("set `name`, a non-empty string: what users select the plugin by")
    if not isinstance(getattr(obj, "description", None), str) or not obj.description:
        problems.append("set `description`, a non-empty string: the line `attrib-bench list` shows")
    return problems


def _common(obj: Any, problems: list[str]) -> dict[str, Any]:
    """The attributes every plugin kind may declare: default run, parameters, version."""
    in_default_run = getattr(obj, "in_default_run", True)
    if not isinstance(in_default_run, bool):
        problems.append(f"`in_default_run` must be True or False, not {in_default_run!r}")
    parameters = getattr(obj, "parameters", {})
    choices = getattr(obj, "choices", {})
    if not isinstance(parameters, Mapping) or not isinstance(choices, Mapping):
        problems.append("`parameters` and `choices` must be dicts (name -> default / values)")
        parameters, choices = {}, {}
    settings = getattr(obj, "params", None)
    family = getattr(obj, "family", "")
    if not isinstance(family, str):
        problems.append(f"`family` must be a string, not {family!r}")
        family = ""
    return {
        "name": getattr(obj, "name", type(obj).__name__),
        "description": getattr(obj, "description", ""),
        "in_default_run": in_default_run,
        "parameters": MappingProxyType(dict(parameters)),
        "choices": MappingProxyType({k: tuple(v) for k, v in choices.items()}),
        "settings": MappingProxyType(dict(settings)) if isinstance(settings, Mapping) else None,
        "version": str(getattr(obj, "version", "0")),
        "reference": reference(obj),
        "parameter_docs": MappingProxyType(_parameter_docs(obj, parameters, problems)),
        "family": family,
    }


def reference(obj: Any) -> str:
    """The ``Reference:`` paragraph of the class docstring (a subclass without a docstring of
    its own inherits its base's), its lines joined; "" when there is none."""
    match = _REFERENCE.search(inspect.getdoc(type(obj)) or "")
    return " ".join(match["text"].split()) if match else ""


def _parameter_docs(obj: Any, parameters: Mapping[str, Any], problems: list[str]) -> dict:
    """``parameter_docs``: non-empty strings, each for a parameter the plugin has."""
    docs = getattr(obj, "parameter_docs", {})
    if not isinstance(docs, Mapping) or not all(
        isinstance(text, str) and text.strip() for text in docs.values()
    ):
        problems.append(
            "`parameter_docs` must be a dict of parameter name -> its meaning and range (a "
            f"non-empty string), not {docs!r}"
        )
        return {}
    unknown = sorted(set(docs) - set(parameters))
    if unknown:
        problems.append(f"`parameter_docs` documents parameters it does not have: {unknown}")
    return {key: docs[key] for key in parameters if key in docs}


def attributor_problems(obj: Any) -> tuple[dict[str, Any], list[str]]:
    """The record's fields as read from ``obj``, and what is wrong with its declarations."""
    problems = _named(obj)
    values = _common(obj, problems)
    requires = getattr(obj, "requires", None)
    if not isinstance(requires, (set, frozenset)):
        problems.append(
            f"set `requires`, a frozenset of the trace fields attribute() reads, not {requires!r}"
        )
        requires = frozenset()
    needs = getattr(obj, "needs", None)
    if needs is not None and not isinstance(needs, Mapping):
        problems.append(f"`needs` must be a dict (capability -> value), not {needs!r}")
        needs = None
    elif needs is not None and needs_problem(needs) is not None:
        problems.append(f"bad `needs`: {needs_problem(needs)}")
    positions = getattr(obj, "target_positions", POSITIONS)
    if not isinstance(positions, tuple) or not set(positions) <= set(POSITIONS) or not positions:
        problems.append(f"`target_positions` must be a tuple among {POSITIONS}, not {positions!r}")
        positions = POSITIONS
    if not callable(getattr(obj, "attribute", None)):
        problems.append("define `attribute(self, trace) -> attrib_bench.Attribution`")
    completeness = getattr(obj, "completeness", None)
    if completeness is not None and completeness not in COMPLETENESS:
        problems.append(
            f"`completeness` must be None or one of {COMPLETENESS}, not {completeness!r}"
        )
        completeness = None
    elif completeness == "score-change" and not callable(
        getattr(obj, "completeness_baseline", None)
    ):
        problems.append(
            "with completeness='score-change', define `completeness_baseline(self, trace)`: the "
            "baseline's token ids (B, N)"
        )
    passes = getattr(obj, "passes", "")
    if not isinstance(passes, str):
        problems.append(
            f"`passes` must be a string (the passes it costs, in words), not {passes!r}"
        )
        passes = ""
    values |= {
        "passes": passes,
        "requires": frozenset(requires),
        "needs": None if needs is None else MappingProxyType(dict(needs)),
        "target_positions": positions,
        "explains_own_target": callable(getattr(obj, "explained_target", None)),
        "completeness": completeness,
    }
    return values, problems


def evaluator_problems(obj: Any) -> tuple[dict[str, Any], list[str]]:
    """As :func:`attributor_problems`, for an evaluator or a ModelEvaluator."""
    problems = _named(obj)
    values = _common(obj, problems)
    compares = callable(getattr(obj, "score_models", None))
    for key in ("higher_is_better", "batch_independent"):
        value = getattr(obj, key, True)
        if not isinstance(value, bool):
            problems.append(f"`{key}` must be True or False, not {value!r}")
        values[key] = value is not False
    # Required by its protocol: declared, never defaulted.
    required, why = (
        ("needs_floor", "score_models reads the floor")
        if compares
        else ("needs_reference", "score() reads context.reference")
    )
    value = getattr(obj, required, None)
    if not isinstance(value, bool):
        problems.append(f"set `{required}` to True ({why}) or False")
    values[required] = value is True
    if not compares and not callable(getattr(obj, "score", None)):
        problems.append("define `score(self, attribution, context) -> dict[str, np.ndarray]`")
    parts = getattr(obj, "parts", ())
    if not isinstance(parts, tuple) or not all(isinstance(part, str) for part in parts):
        problems.append(f"`parts` must be a tuple of column names, not {parts!r}")
        parts = ()
    elif parts and not callable(getattr(obj, "aggregate", None)):
        problems.append(
            "with `parts`, define `aggregate(values_EP) -> float`: the corpus-level score of "
            "rows (examples, parts)"
        )
    values |= {
        "parts": parts,
        "plans": callable(getattr(obj, "plan", None)),
        "compares_models": compares,
    }
    return values, problems


def _checked(obj: Any, values: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    if problems:
        name = getattr(obj, "name", type(obj).__name__)
        raise UsageError(f"plugin object {name!r} ({type(obj).__qualname__}): {problems[0]}")
    return values


#: The language models a segment method may declare it explains (``model_kinds``).
SEGMENT_MODEL_KINDS = ("causal", "seq2seq")


@dataclass(frozen=True, kw_only=True)
class SegmentInfo(PluginInfo):
    """A segment method's or evaluator's record."""

    #: The kinds of language model it explains: "causal", "seq2seq" (encoder-decoder).
    model_kinds: tuple[str, ...] = SEGMENT_MODEL_KINDS


def segment_info(obj: Any) -> SegmentInfo:
    """A segment method's or evaluator's record: what every plugin may declare (parameters,
    choices, their docs, ``model_kinds``); the registry checked its protocol when it was
    collected. One UsageError when a declaration has the wrong type."""
    problems: list[str] = []
    values = _common(obj, problems)
    kinds = getattr(obj, "model_kinds", SEGMENT_MODEL_KINDS)
    if not isinstance(kinds, tuple) or not kinds or not set(kinds) <= set(SEGMENT_MODEL_KINDS):
        problems.append(f"`model_kinds` must be a tuple among {SEGMENT_MODEL_KINDS}, not {kinds!r}")
    return SegmentInfo(**_checked(obj, values | {"model_kinds": kinds}, problems))


def attributor_info(obj: Any) -> AttributorInfo:
    """The attributor's record; one UsageError when a declaration has the wrong type."""
    return AttributorInfo(**_checked(obj, *attributor_problems(obj)))


def evaluator_info(obj: Any) -> EvaluatorInfo:
    """The evaluator's record; one UsageError when a declaration has the wrong type."""
    values = _checked(obj, *evaluator_problems(obj))
    return EvaluatorInfo(**values)


class AttributorBase:
    """Optional base class: every attribute an attributor may declare, with its default.

    Required: ``name``, ``description``, ``requires`` and ``attribute(trace)``. Cite the
    method's paper in the class docstring, on a line of its own that starts with
    ``Reference:`` (authors, year, "title", venue; or say that there is none and why), as
    Inseq's method classes do: ``attrib-bench list`` and the docs show it.
    """

    name: ClassVar[str]
    #: One line for ``attrib-bench list``; cite the paper in the class docstring's
    #: ``Reference:`` line.
    description: ClassVar[str]
    #: Trace fields ``attribute`` reads (``attrib_bench.TRACE_FIELDS`` and plugins' fields).
    requires: ClassVar[frozenset[str]] = frozenset()
    #: Leave False for a method cheap enough for every plain run; True keeps it out of them.
    in_default_run: ClassVar[bool] = True
    #: The target positions it can explain; another one fails it before any batch.
    target_positions: ClassVar[tuple[str, ...]] = POSITIONS
    #: Bump when the output changes though the plugin's source did not (the cache reads it).
    version: ClassVar[str] = "0"
    #: Parameter name -> its meaning and its range, or what each choice means (the default
    #: is in ``parameters``, see attrib_bench.Configurable): ``attrib-bench list`` and the
    #: docs show them.
    parameter_docs: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: The kind of method: "attention", "norm-based", "decomposition", "gradient",
    #: "perturbation", "baseline" or your own word; the docs' methods table shows it.
    family: ClassVar[str] = ""
    #: What each example's row sums to (``COMPLETENESS``): "score", the explained score f(x);
    #: "score-change", f(x) - f(x') with ``completeness_baseline(trace)`` giving x' as token ids
    #: (B, N). None claims nothing; a claim is checked by the conformance kit.
    completeness: ClassVar[str | None] = None
    #: The model passes it costs beyond the traced forward pass, in words ("1 backward",
    #: "n + 1 forward per example of n tokens"): ``attrib-bench list`` shows it.
    passes: ClassVar[str] = ""


class EvaluatorBase:
    """Optional base class: every attribute an evaluator may declare, with its default.

    Required: ``name``, ``description``, ``needs_reference`` and ``score(attribution,
    context)``; cite the paper as :class:`AttributorBase` says. Optional methods:
    ``plan(attribution, context)`` (announce pooled model calls) and, with ``parts``,
    ``aggregate(values_EP) -> float``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    #: ``score`` reads ``context.reference``, the reference method's attribution.
    needs_reference: ClassVar[bool] = False
    #: How leaderboards sort and which way the gate looks.
    higher_is_better: ClassVar[bool] = True
    #: False keeps a costly evaluator out of plain runs.
    in_default_run: ClassVar[bool] = True
    #: A corpus-level score's extra columns, returned by ``score`` as ``kind/part`` arrays.
    parts: ClassVar[tuple[str, ...]] = ()
    #: False when the score thresholds the attribution (re-batching may move it).
    batch_independent: ClassVar[bool] = True
    version: ClassVar[str] = "0"
    #: As :attr:`AttributorBase.parameter_docs`.
    parameter_docs: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: What it measures: "faithfulness", "plausibility", "sanity", "agreement" or your own word.
    family: ClassVar[str] = ""
