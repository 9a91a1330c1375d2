"""Attention through an encoder-decoder model's cross-attention, as segment methods
(docs/segments.md#attention-on-encoder-decoder-models).

An encoder-decoder model reads its source (the prompt, whose tokens the segments own) only
through the decoder's cross-attention. Each method builds a T x S map R^{ts} from the decoder
position that predicts answer token t to the source tokens, and a T x T map R^{tt} over the
decoder's inputs (the start token, then the answer's tokens); step t's row of R^{ts}, summed
over each segment's tokens, attributes that step, and its row of R^{tt} over a_0..a_{T-2}
attributes it to the answer prefix. A segment's score is the sum over the steps. Following
Chefer, Gur & Wolf's official code for encoder-decoder models (its DETR generator), with
head means written Ā:

- ``cross-attention``: the last decoder layer's cross-attention, Ā^{ts} (its raw attention
  baseline); R^{tt} is the last decoder self-attention Ā^{tt}.
- ``cross-rollout``: R^{ss} and R^{tt} the attention rollouts of the encoder's and the
  decoder's self-attention (each layer (A + I) with rows normalised, multiplied from the first
  layer up), then R^{ts} = (R^{tt})ᵀ Ā^{ts}_L R^{ss} with the last cross-attention.
- ``cross-gae``: their gradient-weighted rules, Ā = mean_h (∇A ⊙ A)^+ with the gradient of
  the step's log-probability: R^{ss} = I, R^{ss} += Ā^{ss} R^{ss} per encoder layer; R^{tt} = I,
  R^{ts} = 0, and per decoder layer R^{tt} += Ā^{tt} R^{tt}, R^{ts} += Ā^{tt} R^{ts} (both from
  the values before the layer), then R^{ts} += (R̄^{tt})ᵀ Ā^{ts} R̄^{ss}, where R̄ = (R - I)
  with rows normalised, plus I (NaN from an all-zero row set to 0, as the code does).

A contrastive example's foil is a second decoding with its own maps; its steps follow the
answer's. ``cross-gae`` differentiates the foil's terms, minus its log-probabilities, as they
are; the other two read no score and take the term's sign: the foil's rows negated.

The official code multiplies by (R^{tt})ᵀ, written for DETR's object queries, which attend to
each other both ways. On a causal decoder that form reads the wrong way: in ``cross-rollout``
step t gathers the cross-attention of the decoder positions after it, and in ``cross-gae`` the
positions after t get no gradient from step t, so their rows of R^{tt} stay I, R̄^{tt} divides
0 by 0 there, and the code's NaN-to-0 clears the whole product: every step but the last scores
0. So the default here multiplies by R^{tt} (``transpose=false``: step t reads the positions up
to itself, as a causal decoder computes; the project's variant), and ``transpose=true`` is the
official code.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import numpy as np
import torch

import attrib_bench
from attrib_bench import Configurable, SegmentScorer, StepScores

if TYPE_CHECKING:
    from attrib_bench.segments.scorer import AttentionMaps

TRANSPOSE_DOC = (
    "false: R^ts = R^tt ..., step t reads the decoder positions up to itself (a causal "
    "decoder); true: (R^tt)^T ..., the official code, written for bidirectional queries"
)


def head_mean(maps: torch.Tensor, grads: torch.Tensor | None = None) -> torch.Tensor:
    """Ā (n, m): the mean over heads of one example's (1, H, n, m) attention maps, or, given
    their gradients, of (∇A ⊙ A) clamped at 0 (Chefer et al.'s rule 5)."""
    return (maps if grads is None else (grads * maps).clamp(min=0))[0].mean(0)


def attention_rollout(layers: list[torch.Tensor]) -> torch.Tensor:
    """R = M^L ... M^1 with M^l = (Ā^l + I) rows normalised (the official code's rollout)."""
    eye = torch.eye(layers[0].shape[-1], dtype=layers[0].dtype, device=layers[0].device)
    joint = None
    for layer in layers:
        step = (layer + eye) / (layer + eye).sum(-1, keepdim=True)
        joint = step if joint is None else step @ joint
    return joint


def without_residual(relevance: torch.Tensor) -> torch.Tensor:
    """R̄ = (R - I) with rows normalised, plus I (the official code's eq. 8-9)."""
    eye = torch.eye(relevance.shape[-1], dtype=relevance.dtype, device=relevance.device)
    hat = relevance - eye
    return hat / hat.sum(-1, keepdim=True) + eye


def gae_relevance(
    maps: AttentionMaps, grads: list[torch.Tensor], transpose: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chefer et al.'s encoder-decoder rules (module docstring) from the maps and the
    gradients of one score at them (encoder, decoder, cross in order): (R^{ts}, R^{tt})."""
    L_e, L_d = len(maps.encoder), len(maps.decoder)
    enc_g, dec_g, cross_g = grads[:L_e], grads[L_e : L_e + L_d], grads[L_e + L_d :]
    T, S = maps.cross[0].shape[-2:]
    dtype, device = maps.cross[0].dtype, maps.cross[0].device
    source = torch.eye(S, dtype=dtype, device=device)
    for a, g in zip(maps.encoder, enc_g, strict=True):
        source = source + head_mean(a, g) @ source
    target = torch.eye(T, dtype=dtype, device=device)
    cross = torch.zeros(T, S, dtype=dtype, device=device)
    for a, g, x, xg in zip(maps.decoder, dec_g, maps.cross, cross_g, strict=True):
        cam = head_mean(a, g)
        target, cross = target + cam @ target, cross + cam @ cross
        mixed = without_residual(target)
        added = (mixed.T if transpose else mixed) @ head_mean(x, xg) @ without_residual(source)
        cross = cross + torch.nan_to_num(added, nan=0.0)
    return cross, target


class _CrossAttentionMethod(Configurable, abc.ABC):
    """Shared: per continuation one forward pass with the attention maps, its step rows to the
    segments and to its own prefix columns."""

    model_kinds = ("seq2seq",)
    reference = "Chefer, Gur & Wolf 2021 (ICCV), official encoder-decoder code"

    @abc.abstractmethod
    def relevance(self, scorer: SegmentScorer, continuation: int) -> tuple[torch.Tensor, ...]:
        """(R^{ts} (T, S), R^{tt} (T, T)) of one continuation (0: the answer, 1: the foil)."""

    def attribute_segments(self, scorer: SegmentScorer) -> np.ndarray:
        return self.attribute_steps(scorer).segments_TS.sum(axis=0)

    def attribute_steps(self, scorer: SegmentScorer) -> StepScores:
        """Rows: each continuation's steps in order (a contrastive example's foil after the
        answer); prefix columns: each continuation's own tokens but its last."""
        segments, prefix = [], np.zeros((scorer.step_count, scorer.prefix_count))
        row = column = 0
        for c, (ids, _) in enumerate(scorer.continuations):
            cross_TS, target_TT = (
                m.detach().cpu().double().numpy() for m in self.relevance(scorer, c)
            )
            T = len(ids)
            segments.append(scorer.to_segments(cross_TS))
            prefix[row : row + T, column : column + T - 1] = target_TT[:, 1:T]
            row, column = row + T, column + T - 1
        return StepScores(np.concatenate(segments), prefix)


class CrossAttention(_CrossAttentionMethod):
    name = "cross-attention"
    description = "the last decoder layer's cross-attention (head mean), summed per segment"

    def relevance(self, scorer: SegmentScorer, continuation: int) -> tuple[torch.Tensor, ...]:
        maps = scorer.attention_maps(continuation)
        return maps.sign * head_mean(maps.cross[-1]), maps.sign * head_mean(maps.decoder[-1])


class CrossRollout(_CrossAttentionMethod):
    name = "cross-rollout"
    description = "encoder and decoder rollouts joined by the last cross-attention"
    parameters = {"transpose": False}
    parameter_docs = {"transpose": TRANSPOSE_DOC}

    def relevance(self, scorer: SegmentScorer, continuation: int) -> tuple[torch.Tensor, ...]:
        maps = scorer.attention_maps(continuation)
        source = attention_rollout([head_mean(a) for a in maps.encoder])
        target = attention_rollout([head_mean(a) for a in maps.decoder])
        mixing = target.T if self.params["transpose"] else target
        return maps.sign * mixing @ head_mean(maps.cross[-1]) @ source, maps.sign * target


class CrossGae(_CrossAttentionMethod):
    name = "cross-gae"
    description = "Chefer et al.'s gradient-weighted encoder-decoder rules, per answer step"
    parameters = {"transpose": False}
    parameter_docs = {"transpose": TRANSPOSE_DOC}

    def relevance(self, scorer: SegmentScorer, continuation: int) -> tuple[torch.Tensor, ...]:
        """Row t of each map from the gradient of the continuation's term t (a foil's: of
        minus its log-probability): one forward pass and T backward passes through it."""
        maps = scorer.attention_maps(continuation, graph=True)
        every = [*maps.encoder, *maps.decoder, *maps.cross]
        T = len(maps.steps_T)
        cross_rows, target_rows = [], []
        for t in range(T):
            grads = torch.autograd.grad(maps.steps_T[t], every, retain_graph=t < T - 1)
            with torch.no_grad():
                cross, target = gae_relevance(maps, list(grads), self.params["transpose"])
            cross_rows.append(cross[t].detach())
            target_rows.append(target[t].detach())
        return torch.stack(cross_rows), torch.stack(target_rows)


@attrib_bench.hookimpl
def attrib_bench_segment_attributors() -> list:
    return [CrossAttention(), CrossRollout(), CrossGae()]
