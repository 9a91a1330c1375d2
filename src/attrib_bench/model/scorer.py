"""In-distribution removal: erased inputs scored by a copy of the run's model fine-tuned with
random masking (``attrib-bench finetune --masking``), not by the model explained.

An input with tokens erased is one a classifier never saw in training, so a removal score
mixes how much the erased tokens mattered with how the model reacts to the unfamiliar input
(Hooker et al. 2019, "A Benchmark for Interpretability Methods in Deep Neural Networks",
NeurIPS; Madsen et al. 2024, "Faithfulness Measurable Masked Language Models", ICML; Zheng et
al. 2025, "F-Fidelity", ICLR). A copy fine-tuned on randomly erased inputs reads them in
distribution. The method's attribution still comes from the run's model; only the scores f(x)
and f(x with tokens erased) come from the copy.

An evaluator with ``scorer=DIR`` scores through :func:`scoring_trace`, a view of the batch's
trace whose model is the copy and whose per-batch memo is a namespace of the trace's own keyed by
the copy's weights hash: the erasure caches (attrib_bench.toolkit.erasure) of different scorers
never mix, and those of the run's model are untouched.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attrib_bench.core.errors import UsageError
from attrib_bench.core.loaded_model import LoadedModel, target_logits

if TYPE_CHECKING:
    from attrib_bench.core.interfaces import EvalContext
    from attrib_bench.core.trace import Trace

#: Where a scorer's namespace of a batch's memo lives in ``Trace.shared``: this, then its
#: weights hash.
SCORER_PREFIX = "scorer:"
#: The scorer's logits on the unmodified batch, inside its namespace.
LOGITS_KEY = "scorer.logits"
SCORER_DOC = (
    "a model directory that scores f(x) and every erased input instead of the run's model: "
    "the run's model fine-tuned with random masking (attrib-bench finetune --model RUN_MODEL "
    "--masking 0.1), same tokenizer; the attribution still comes from the run's model; empty "
    "(default): the run's model"
)


def _tokenizer_identity(loaded: LoadedModel) -> tuple:
    tokenizer = loaded.tokenizer
    specials = ("mask", "pad", "cls", "sep", "bos", "eos", "unk")
    return (
        type(tokenizer).__name__,
        tuple(getattr(tokenizer, f"{name}_token_id") for name in specials),
        tokenizer.get_vocab(),
    )


def load_scorer(path: str, run: LoadedModel, who: str) -> LoadedModel:
    """The scorer at ``path``, on the run's device with the run's model families; one
    UsageError when it cannot score the run's inputs: another tokenizer (an erased input's ids
    would be other tokens to it), other classes, or another kind of model."""
    from attrib_bench.model.load import load_model  # transformers: not at `list` time

    scorer = load_model(path, str(run.device), architectures=run.architectures)
    fix = "fine-tune it from the run's model (attrib-bench finetune --masking 0.1 --model MODEL)"
    if _tokenizer_identity(scorer) != _tokenizer_identity(run):
        raise UsageError(
            f"{who}:scorer={path} has another tokenizer than the run's model {run.name}: {fix}"
        )
    if (scorer.is_language_model, scorer.class_count) != (run.is_language_model, run.class_count):
        raise UsageError(
            f"{who}:scorer={path} has {scorer.class_count} outputs, the run's model "
            f"{run.class_count}: {fix}"
        )
    return scorer


def scoring_trace(trace: Trace, scorer: LoadedModel) -> Trace:
    """``trace`` as ``scorer`` sees it: its model, its logits on the unmodified batch, and its
    namespace of the batch's memo (kept in ``trace.shared``, so it lasts the batch).

    The logits run under sdpa, as the erased inputs do; a scorer with the run's model's weights
    takes the trace's own logits, so its numbers are the run's model's to the last bit.
    """
    shared = trace.shared.setdefault(SCORER_PREFIX + scorer.weights_sha256, {})
    if LOGITS_KEY not in shared:
        if scorer.weights_sha256 == trace.loaded.weights_sha256:
            shared[LOGITS_KEY] = trace.logits_BC
        else:
            inputs = trace.batch.model_inputs()
            with torch.no_grad(), scorer.fast_attention():
                logits = scorer.model(**inputs).logits
            shared[LOGITS_KEY] = target_logits(scorer, logits, trace.target_positions_B)
    return dataclasses.replace(trace, loaded=scorer, logits_BC=shared[LOGITS_KEY], shared=shared)


class ScoredByCopy:
    """For an evaluator with a ``scorer`` parameter: the trace its scores come from, the scorer
    loaded once per evaluator (and again only on another device), and what scored them."""

    params: dict[str, Any]
    name: str
    _scorer: LoadedModel | None = None
    _files: str | None = None

    def check_scorer(self) -> None:
        """``validate``'s check: a scorer, when given, is a directory."""
        path = self.params["scorer"]
        if path and not Path(path).expanduser().is_dir():
            raise UsageError(
                f"{self.name}:scorer={path} is not a model directory; make one with "
                "attrib-bench finetune --model RUN_MODEL --masking 0.1"
            )

    def scoring(self, context: EvalContext) -> Trace:
        """The batch's trace, or its view through the scorer (``scoring_trace``)."""
        trace = context.trace
        if not self.params["scorer"]:
            return trace
        if self._scorer is None or self._scorer.device != trace.loaded.device:
            path = str(Path(self.params["scorer"]).expanduser())
            self._scorer = load_scorer(path, trace.loaded, self.name)
        return scoring_trace(trace, self._scorer)

    @property
    def scored_by(self) -> dict[str, str] | None:
        """The scorer's identity for the result's provenance, None without one: its directory,
        the sha256 of its files (known also when every score came from the result cache and
        the scorer was never loaded) and, once loaded, of its weights (``weights_hash``, as the
        run's model's provenance has it)."""
        path = self.params["scorer"]
        if not path:
            return None
        if self._files is None:
            from attrib_bench.model.finetune import source_fingerprint

            self._files = source_fingerprint(str(Path(path).expanduser()))
        identity = {"model": path, "files_sha256": self._files}
        if self._scorer is not None:
            identity["weights_sha256"] = self._scorer.weights_sha256
        return identity
