"""Segment attribution: methods that score a context's segments, and their evaluators.

The explained score is the answer's log-probability given the prompt (``SegmentScorer``; the
math and the references: docs/segments.md). Methods:

- ``leave-one-segment-out``: the score's drop when the segment is removed; by default through
  the key-value cache of the prefix the ablated prompt shares (``cache=false``: each ablated
  prompt runs whole; the same numbers up to float rounding).
- ``context-cite`` (Cohen-Wang et al., NeurIPS 2024): a LASSO fit of the answer's score on
  ``ablations`` random keep/drop masks (each segment kept with probability ``keep``), the
  official code's defaults and conventions: masks from ``RandomState(seed + i)``, the answer's
  logit-probability (``output=log-prob`` for the log-probability) divided by its token count,
  standardised masks, ``Lasso(alpha)``, coefficients scaled back.
- ``input-x-gradient``, ``integrated-gradients``: Captum's token attributions of the answer's
  log-probability to the input embeddings (summed over the hidden size), summed over each
  segment's tokens.

Under ``--per-step`` the methods that can also return a step x segment matrix (each answer
step's log-probability attributed; its rows sum to the summed row) do: leave-one-segment-out
and the two gradient methods, which also attribute each step to the answer's earlier tokens
(the prefix, kept apart: for an encoder-decoder model, the decoder's input).
- ``random``: seeded per example, the floor.

Evaluators: ``topk-drop`` (the score's drop when the k top-scored segments are removed;
ContextCite's top-k log-probability drop; NaN for a k not below the segment count), ``lds``
(the linear datamodeling score: Spearman of the summed scores of kept segments with the true
score, over held-out random ablations) and
``evidence-auprc`` (the area under the precision-recall curve of the scores against the human
evidence segments).
"""

from __future__ import annotations

import functools
import hashlib
import math

import numpy as np
import torch

from attrib_bench import Configurable, SegmentScorer, StepScores, hookimpl
from attrib_bench.toolkit.ranking import auprc


def random_masks(count: int, ablations: int, keep: float, seed: int) -> np.ndarray:
    """ContextCite's ablation masks, (M, S): row i from ``RandomState(seed + i)``, each segment
    kept with probability ``keep``."""
    return np.stack(
        [
            np.random.RandomState(seed + i).choice([False, True], size=count, p=[1 - keep, keep])
            for i in range(ablations)
        ]
    )


class LeaveOneSegmentOut(Configurable):
    name = "leave-one-segment-out"
    description = "drop of the answer's log-probability when the segment is removed"
    reference = "exact leave-one-out; cached as AttriBoT (Liu et al., ICLR 2025)"
    parameters = {"cache": True}
    parameter_docs = {"cache": "reuse the key-value cache of the unchanged prefix (same numbers)"}

    def attribute_segments(self, scorer: SegmentScorer) -> np.ndarray:
        without_S = scorer.leave_one_out(cached=self.params["cache"]).sum(axis=1)
        return scorer.full_score - without_S

    def attribute_steps(self, scorer: SegmentScorer) -> np.ndarray:
        """Each answer step's log-probability drop, (T, S): the same passes, kept per step
        (the answer's own tokens are never removed: no prefix part)."""
        without_ST = scorer.leave_one_out(cached=self.params["cache"])
        full_T = scorer.steps(np.ones((1, scorer.count), dtype=bool))[0]
        return (full_T[None, :] - without_ST).T


class ContextCite(Configurable):
    name = "context-cite"
    description = "LASSO surrogate of the answer's score over random segment ablations"
    reference = "Cohen-Wang et al., NeurIPS 2024 (context-cite 0.0.4)"
    parameters = {"ablations": 64, "keep": 0.5, "alpha": 0.01, "output": "logit-prob", "seed": 0}
    choices = {"output": ("logit-prob", "log-prob")}
    parameter_docs = {
        "ablations": "random keep/drop masks the surrogate is fitted on; at least 2",
        "keep": "each segment's probability of being kept in a mask; in (0, 1)",
        "alpha": "the LASSO's L1 weight (scikit-learn's alpha); > 0",
        "output": "logit-prob: log P - log(1 - P) of the answer (the package's default); "
        "log-prob: log P",
        "seed": "mask m is drawn from RandomState(seed + m)",
    }

    def validate(self) -> None:
        if self.params["ablations"] < 2:
            raise self.out_of_range("ablations", "at least 2")
        if not 0 < self.params["keep"] < 1:
            raise self.out_of_range("keep", "in (0, 1)")
        if self.params["alpha"] <= 0:
            raise self.out_of_range("alpha", "> 0")

    def attribute_segments(self, scorer: SegmentScorer) -> np.ndarray:
        try:
            from sklearn.linear_model import Lasso
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler
        except ImportError:
            raise RuntimeError(
                "context-cite fits its LASSO with scikit-learn: pip install "
                "'attrib-bench[perturbation]'"
            ) from None

        p = self.params
        masks_MS = random_masks(scorer.count, p["ablations"], p["keep"], p["seed"])
        log_probs_M = scorer.scores(masks_MS)
        outputs_M = log_probs_M
        # log P - log(1 - P), ContextCite's default output; a contrastive score is no
        # log-probability, and is fitted as it is.
        if p["output"] == "logit-prob" and scorer.foil_ids is None:
            outputs_M = log_probs_M - np.log1p(-np.exp(log_probs_M))
        steps = len(scorer.answer_ids)
        scaler = StandardScaler()
        lasso = Lasso(alpha=p["alpha"], random_state=0, fit_intercept=True)
        make_pipeline(scaler, lasso).fit(masks_MS.astype(np.float32), outputs_M / steps)
        return lasso.coef_ / scaler.scale_ * steps


class TokenGradients(Configurable):
    """Captum's token attributions of the answer's log-probability, summed over segments."""

    parameters = {"steps": 50, "internal_batch_size": 8}

    def __init__(self, name: str, method: str) -> None:
        super().__init__()
        self.name = name
        self.method = method
        self.description = f"Captum {method} of the answer's log-probability, summed per segment"
        self.reference = "sum of token attributions over the segment's tokens"
        if method != "IntegratedGradients":
            self.parameters = {}
            self.params = {}

    def attribute_segments(self, scorer: SegmentScorer) -> np.ndarray:
        """Captum's attribution of the score; a contrastive example's is the sum of each
        continuation's part attributed alone (the attributions are linear in the score, and
        one graph at a time bounds the memory)."""
        import captum.attr

        inputs = tuple(e.requires_grad_() for e in scorer.embedded())
        extra = {}
        if self.method == "IntegratedGradients":
            extra = {
                "n_steps": self.params["steps"],
                "internal_batch_size": self.params["internal_batch_size"],
            }
        tokens = 0
        for c in range(len(scorer.continuations)):
            read = scorer.inputs_of(c)
            part = functools.partial(_part, scorer, c, inputs)
            method = getattr(captum.attr, self.method)(part)
            with scorer.loaded.fast_attention():
                attributions = method.attribute(tuple(inputs[i] for i in read), **extra)
            tokens = tokens + attributions[0][0].sum(dim=-1)  # the prompt's sequence
        return scorer.to_segments(tokens[None].detach().cpu().double().numpy())[0]

    def attribute_steps(self, scorer: SegmentScorer) -> StepScores:
        """Each answer step's log-probability attributed, to the segments (T, S) and to the
        answer's earlier tokens (T, T - 1): per chunk of path points one forward pass and T
        backward passes (Captum's IG with ``target=t`` would run the forward T times). Input x
        gradient is the one-point path at the input, weight 1; IG takes Captum's
        Gauss-Legendre points and weights with its zero baseline for every input, so each row
        equals Captum's attribution of that step, and the rows sum to the summed row."""
        inputs = scorer.embedded()
        alphas, weights = [1.0], [1.0]
        chunk = 1
        if self.method == "IntegratedGradients":
            from captum.attr._utils.approximation_methods import approximation_parameters

            step_sizes, points = approximation_parameters("gausslegendre")
            alphas, weights = points(self.params["steps"]), step_sizes(self.params["steps"])
            chunk = self.params["internal_batch_size"]
        device, dtype = inputs[0].device, inputs[0].dtype
        tokens = [
            torch.zeros(scorer.step_count, x.shape[1], dtype=dtype, device=device) for x in inputs
        ]
        with scorer.loaded.fast_attention():
            for first in range(0, len(alphas), chunk):
                a = torch.tensor(alphas[first : first + chunk], dtype=dtype).to(device)
                # Captum rounds its step sizes to float32 (IntegratedGradients._attribute).
                w = torch.tensor(weights[first : first + chunk], dtype=torch.float32)
                w = w.to(device, dtype)[:, None, None]
                row = 0  # each continuation's pass alone: one graph in memory at a time
                for c, (ids, _) in enumerate(scorer.continuations):
                    paths = [(a[:, None, None] * x).requires_grad_() for x in inputs]
                    steps_XT = scorer.steps_from_embeddings(*paths, only=c)
                    T = len(ids)
                    for t in range(T):
                        grads = torch.autograd.grad(
                            steps_XT[:, t].sum(), paths, retain_graph=t < T - 1, allow_unused=True
                        )
                        for total, grad, x in zip(tokens, grads, inputs, strict=True):
                            if grad is not None:  # None: an input this pass does not read
                                total[row + t] += (w * grad * x).sum(dim=(0, 2))
                    row += T
        tokens_np = [t.detach().cpu().double().numpy() for t in tokens]
        return StepScores(scorer.to_segments(tokens_np[0]), scorer.answer_columns(tokens_np))


def _part(
    scorer: SegmentScorer,
    continuation: int,
    embedded: tuple[torch.Tensor, ...],
    *read: torch.Tensor,
) -> torch.Tensor:
    """One continuation's part of the score from the inputs its pass reads
    (``scorer.inputs_of``), the others as ``embedded`` (unread)."""
    inputs = list(embedded)
    for i, x in zip(scorer.inputs_of(continuation), read, strict=True):
        inputs[i] = x
    return scorer.score_from_embeddings(*inputs, only=continuation)


class RandomSegments(Configurable):
    name = "random"
    description = "uniform random scores seeded per example: the floor"
    reference = "baseline"
    parameters = {"seed": 0}

    def attribute_segments(self, scorer: SegmentScorer) -> np.ndarray:
        digest = hashlib.sha256(f"{self.params['seed']}/{scorer.example.id}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        return rng.random(scorer.count)


class TopKDrop(Configurable):
    name = "topk-drop"
    description = "drop of the answer's log-probability when the top-k segments are removed"
    reference = "ContextCite's top-k log-probability drop"
    parameters = {"ks": "1,3,5"}

    def validate(self) -> None:
        try:
            ks = [int(k) for k in self.params["ks"].split(",")]
        except ValueError:
            raise self.out_of_range("ks", "comma-separated integers") from None
        if not ks or min(ks) < 1:
            raise self.out_of_range("ks", "integers >= 1")

    def evaluate_segments(self, scorer: SegmentScorer, scores_S: np.ndarray) -> dict[str, float]:
        ks = [int(k) for k in self.params["ks"].split(",")]
        order = np.argsort(-scores_S, kind="stable")
        masks, names = [], []
        for k in ks:
            if k >= scorer.count:  # removing every segment would score all methods alike
                continue
            keep = np.ones(scorer.count, dtype=bool)
            keep[order[:k]] = False
            masks.append(keep)
            names.append(k)
        values = {f"top{k}-drop": math.nan for k in ks}
        if masks:
            drops = scorer.full_score - scorer.scores(np.stack(masks))
            values.update({f"top{k}-drop": float(d) for k, d in zip(names, drops, strict=True)})
        return values


class LinearDatamodelingScore(Configurable):
    name = "lds"
    description = "Spearman of summed kept-segment scores with the true score on held-out ablations"
    reference = "Cohen-Wang et al., NeurIPS 2024 (linear datamodeling score)"
    # Seeds far from context-cite's 0..63, so that its training ablations are not reused.
    parameters = {"ablations": 64, "keep": 0.5, "seed": 1_000_000}

    def evaluate_segments(self, scorer: SegmentScorer, scores_S: np.ndarray) -> dict[str, float]:
        from scipy.stats import spearmanr  # not at import: `attrib-bench list` stays light

        p = self.params
        masks_MS = random_masks(scorer.count, p["ablations"], p["keep"], p["seed"])
        predicted_M = masks_MS.astype(float) @ scores_S
        actual_M = scorer.scores(masks_MS)
        if np.ptp(predicted_M) == 0 or np.ptp(actual_M) == 0:
            return {"lds": math.nan}
        return {"lds": float(spearmanr(predicted_M, actual_M).statistic)}


class EvidenceAuprc(Configurable):
    name = "evidence-auprc"
    description = "AUPRC of the segment scores against the human evidence segments"
    reference = "ERASER's AUPRC, at segment level"

    def evaluate_segments(self, scorer: SegmentScorer, scores_S: np.ndarray) -> dict[str, float]:
        evidence = scorer.example.evidence
        if evidence is None:
            return {"evidence-auprc": math.nan}
        return {"evidence-auprc": auprc(np.array(evidence, dtype=bool), scores_S)}


@hookimpl
def attrib_bench_segment_attributors() -> list:
    return [
        LeaveOneSegmentOut(),
        ContextCite(),
        TokenGradients("input-x-gradient", "InputXGradient"),
        TokenGradients("integrated-gradients", "IntegratedGradients"),
        RandomSegments(),
    ]


@hookimpl
def attrib_bench_segment_evaluators() -> list:
    return [TopKDrop(), LinearDatamodelingScore(), EvidenceAuprc()]
