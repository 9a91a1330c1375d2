"""The types plugins see: examples, batches, attributions, and the Attributor/Evaluator protocols.

Shape key used in names and docstrings across the project:
B batch, L layers, H heads, N query tokens, K key tokens, D hidden size, E head size, C classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from attrib_bench.core.batch import Batch, Example
from attrib_bench.core.plugin_info import attributor_info

if TYPE_CHECKING:
    from attrib_bench.core.trace import Trace

__all__ = [
    "KINDS",
    "Attribution",
    "Attributor",
    "Batch",
    "EvalContext",
    "Evaluator",
    "Example",
    "ModelEvaluator",
]


#: Keys an evaluator returns: per-example scores, one array (L, B) per attribution kind.
KINDS = ("aggregated", "local")


@dataclass
class Attribution:
    """Scores of the classification token's row over all tokens, for every layer.

    ``aggregated_BLN``: the row after aggregating layers 1..l (rollout); a whole-model method
    (saliency, random) has L = 1. ``local_BLN``: the single-layer row of layer l, where a method
    has one. Padded positions hold zeros and are never read.
    """

    aggregated_BLN: torch.Tensor
    local_BLN: torch.Tensor | None = None

    def rows(self, kind: str) -> torch.Tensor | None:
        return self.aggregated_BLN if kind == "aggregated" else self.local_BLN

    def example_rows(self, kind: str, row: int, length: int) -> list[list[float]] | None:
        """Example ``row``'s rows of ``kind`` over its ``length`` real tokens, as JSON lists."""
        rows_BLN = self.rows(kind)
        return None if rows_BLN is None else rows_BLN[row, :, :length].detach().cpu().tolist()

    def problem(self, batch: Batch) -> str | None:
        """What makes this attribution unusable for ``batch`` (one line), or None when it fits.

        The runner checks every attribution it receives, so a plugin's mistake fails that
        plugin with this line instead of crashing the cache, the evaluators or the report.
        """
        B, N = batch.input_ids_BN.shape
        real_BN = batch.attention_mask_BN.bool()
        for kind in KINDS:
            rows = self.rows(kind)
            if rows is None:
                if kind == "aggregated":
                    return "aggregated_BLN is None"
                continue
            name = f"{kind}_BLN"
            if not isinstance(rows, torch.Tensor):
                return f"{name} is a {type(rows).__name__}, not a torch.Tensor"
            if rows.dim() != 3 or rows.shape[0] != B or rows.shape[2] != N or rows.shape[1] < 1:
                return (
                    f"{name} has shape {tuple(rows.shape)}; expected (B={B}, L or 1, N={N}) "
                    "for this batch"
                )
            if not rows.is_floating_point():
                return f"{name} has dtype {rows.dtype}; expected a floating-point tensor"
            real_BLN = real_BN[:, None, :].expand_as(rows).to(rows.device)
            if not torch.isfinite(rows[real_BLN]).all():
                return f"{name} holds NaN or infinite values at real tokens"
            if rows[~real_BLN].count_nonzero():
                return f"{name} is not zero at padded positions"
        return None


@runtime_checkable
class Attributor(Protocol):
    """A token-attribution method.

    ``requires`` names the trace fields it reads: the built-ins ("attentions", "hidden_states",
    "values", "pre_layernorm") and any field a plugin registers with the
    ``attrib_bench_trace_fields`` hook (a TraceField, read with ``trace.need(name)``); the runner
    captures their union in one forward pass per batch. A costly method may set
    ``in_default_run = False``: it then runs only when selected by name. A method that can
    explain only some target positions (a classification head reads the first token) sets
    ``target_positions`` (default: ``("first", "last")``); under another position the runner
    fails it with one line before any batch, and the conformance kit skips that target. A
    method that explains another score than the run's target (a gradient method's
    ``target=gold``) says which with ``explained_target(trace) -> (classes_B, foils_B or
    None)``: the removal evaluators then score that class (``scored_classes``).
    """

    name: str
    description: str
    requires: frozenset[str]

    def attribute(self, trace: Trace) -> Attribution: ...


@dataclass
class EvalContext:
    """What an evaluator may use besides the attribution it scores.

    ``trace`` gives the batch, the model (``trace.loaded``) and its internals; ``attributor`` is
    the method being scored, for evaluators that must re-attribute (model randomisation).
    """

    trace: Trace
    reference: Attribution | None
    seed: int
    attributor: Any = None


@runtime_checkable
class Evaluator(Protocol):
    """Scores an attribution per example; the runner summarises (mean, std, CI) per layer.

    ``score`` returns, for each kind it scores ("aggregated", "local"), an array (L, B) of
    per-example scores, L the rows it scored (1 when it reads one row); NaN marks an example
    that cannot be scored (it is counted, not averaged). The runner checks the shape; a wrong
    one, or an exception, fails this (method, evaluator) pair only, while a UsageError (settings
    that cannot work: no mask token, no rationales) fails the evaluator for every method.

    Optional ``plan(attribution, context) -> None``: the runner calls it for every (method,
    evaluator) pair of a batch before any ``score`` on the batch, so an evaluator can announce
    the model calls its scores will need and run them pooled with the others' (the erasure
    evaluators: ``attrib_bench.toolkit.erasure.plan_erasures``). It must not change what
    ``score`` returns; a failure fails the pair as ``score``'s would.

    Optional attributes: ``higher_is_better`` (default True: how leaderboards sort and which
    way the gate looks), ``in_default_run`` (default True; False: runs only when selected, for
    costly evaluators), and for a corpus-level score that is not a mean of per-example values
    (ERASER's macro F1) ``parts`` (names of extra columns ``score`` returns as ``kind/part``
    arrays (L, B)) with ``aggregate(values_EP) -> float`` (the score of the examples given, one
    row each with its parts): the runner reports ``aggregate`` of the defined examples, and its
    CI by bootstrapping examples.
    """

    name: str
    description: str
    needs_reference: bool

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]: ...


@runtime_checkable
class ModelEvaluator(Protocol):
    """Scores how a method's attributions of one input agree across models (seeds).

    A run over several models (``run --models A,B,...``) attributes every example under each
    model; for each method and example, ``score_models`` receives the method's rows over the
    example's real tokens under every model, in ``--models`` order, as arrays (L, N) (one per
    model; L layers, N real tokens), and, when ``needs_floor`` is True, the rows under a
    randomly initialised model of the same architecture (else None). It returns (L,) scores;
    NaN marks an example it cannot score. The runner summarises them per layer as it does any
    evaluator's (mean, std, bootstrap CI). ``in_default_run`` (default True) selects it in runs
    over several models; a single-model run cannot select it.
    """

    name: str
    description: str
    needs_floor: bool

    def score_models(self, rows: list[np.ndarray], floor: np.ndarray | None) -> np.ndarray: ...


def compares_models(evaluator: Any) -> bool:
    """True for a :class:`ModelEvaluator` (it scores across models, not one attribution)."""
    return callable(getattr(evaluator, "score_models", None))


def position_problem(attributor: Any, position: str) -> str | None:
    """Why ``attributor`` cannot explain the resolved target ``position``, or None."""
    positions = attributor_info(attributor).target_positions
    if position in positions:
        return None
    return (
        f"{attributor.name} explains only --target position={'|'.join(positions)}, "
        f"not position={position}"
    )


def scored_classes(attributor: Any, trace: Trace) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The classes (and contrastive foils) whose score ``attributor`` explains on ``trace``:
    its own ``explained_target`` where it has one, else (also for no attributor: a context
    built without one) the run's target. Read from the trace, so cached attributions are scored
    on the class they were computed for."""
    if attributor is not None and attributor_info(attributor).explains_own_target:
        return attributor.explained_target(trace)
    return trace.target_classes_B, trace.target_foils_B
