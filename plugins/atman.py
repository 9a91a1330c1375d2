"""AtMan (Deiseroth et al., NeurIPS 2023): a token's relevance is how much the explained score
drops when every layer's attention to it is suppressed (docs/math/atman.md).

As the official code (github.com/Aleph-Alpha/AtMan, ``atman-magma``: ``manipulate_attention.py``
and ``explainer.py``), in every layer and head each row of attention scores s (before the
softmax and the masks) is shifted by its minimum m over the row's keys, and the suppressed
token's column is multiplied by the suppression factor f: s_j <- m + f (s_j - m), which leaves
every other probability's ratio to the rest unchanged. Conceptual suppression (on by default,
the official ``Explainer``'s threshold 0.6) also suppresses the tokens whose input embeddings
have cosine similarity at least the threshold with the suppressed one, each by
(1 - f)(1 - cos) + f. The relevance is the explained score of the clean pass minus that of the
suppressed one: the paper's sign (the rise of the target's cross-entropy); the official
``get_delta_cross_entropies`` returns the opposite sign and its examples square it
(``square=true``).

Each example runs alone over its real tokens, one copy per suppressed token and one clean copy,
the copies in passes of at most ``chunk_tokens`` tokens, behind a registered transformers
attention implementation: any family whose attention goes through transformers' attention
interface is covered, and one whose attention bypasses it is refused with one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace
from attrib_bench.core.errors import UsageError
from attrib_bench.core.target import target_score
from attrib_bench.toolkit.budget import per_pass
from attrib_bench.toolkit.captum_inputs import example_arguments, explained_classes

#: The attention implementation name AtMan registers with transformers.
IMPLEMENTATION = "attrib_bench_atman"
#: While a pass is in flight: its (V, N) suppression factors, one row per copy of the input,
#: and how many attention calls applied them.
_ACTIVE: list[dict[str, Any]] = []


def _attention(module: nn.Module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Eager attention with the rows' suppression factors applied to the scores' columns."""
    if kwargs.get("softcap") is not None:
        raise UsageError("atman does not know attention with a soft cap on its scores")
    active = _ACTIVE[-1]
    active["calls"] += 1
    groups = query.shape[1] // key.shape[1]  # grouped-query attention shares keys and values
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = query @ key.transpose(2, 3) * scale
    low = scores.amin(dim=-1, keepdim=True)  # over every key, as the official code (unmasked)
    factors = active["factors"][:, None, None, : scores.shape[-1]].to(scores.dtype)
    scores = low + factors * (scores - low)
    if attention_mask is not None:
        scores = scores + attention_mask[..., : scores.shape[-1]]
    dtype = torch.promote_types(scores.dtype, torch.float32)
    probabilities = scores.softmax(dim=-1, dtype=dtype).to(query.dtype)
    output = (probabilities @ value).transpose(1, 2).contiguous()
    return output, probabilities


def _register() -> None:
    """Register the suppressing attention (and eager's additive masks), once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if IMPLEMENTATION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(IMPLEMENTATION, _attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, eager_mask)


@contextmanager
def suppressing(model: nn.Module) -> Iterator[dict[str, Any]]:
    """``model`` with AtMan's attention inside the block, restored afterwards, also on error.
    Yields the record whose ``factors`` the passes set and whose ``calls`` they count."""
    _register()
    previous = model.config._attn_implementation
    record: dict[str, Any] = {"factors": None, "calls": 0}
    _ACTIVE.append(record)
    try:
        model.set_attn_implementation(IMPLEMENTATION)
        yield record
    finally:
        _ACTIVE.pop()
        model.set_attn_implementation(previous)


def suppression_factors(
    embeddings_ND: torch.Tensor, factor: float, threshold: float | None, neighbours: str
) -> torch.Tensor:
    """The (N, N) factors of the N suppressed copies: row i suppresses token i by ``factor``
    and, unless ``threshold`` is None, every other token whose embedding has cosine similarity
    cos >= ``threshold`` with token i's, by (1 - f)(1 - cos) + f (``neighbours=cosine``, the
    official default) or by f (``same``)."""
    n = embeddings_ND.shape[0]
    factors_NN = torch.ones(n, n, dtype=torch.float64, device=embeddings_ND.device)
    if threshold is not None:
        unit = nn.functional.normalize(embeddings_ND.double(), dim=-1, eps=1e-8)
        cosine_NN = (unit @ unit.T).clamp(-1.0, 1.0)
        near_NN = cosine_NN >= threshold
        if neighbours == "cosine":
            scaled = (1.0 - factor) * (1.0 - cosine_NN) + factor
        else:
            scaled = torch.full_like(cosine_NN, factor)
        factors_NN = torch.where(near_NN, scaled, factors_NN)
    factors_NN.fill_diagonal_(factor)
    return factors_NN


class AtMan(Configurable):
    """The explained score's drop when attention to a token is suppressed in every layer.

    Reference: Deiseroth, Deb, Weinbach, Brack, Schramowski & Kersting 2023, "AtMan:
    Understanding Transformer Predictions Through Memory Efficient Attention Manipulation",
    NeurIPS.
    """

    name = "atman"
    passes = "n + 1 forward per example of n tokens, batched"
    description = (
        "AtMan (Deiseroth 2023): drop of the target's log-probability when attention to a token "
        "(and its cosine neighbours) is suppressed in every layer"
    )
    requires = frozenset()
    family = "perturbation"
    #: One pass per token per example, batched: select it by name.
    in_default_run = False
    parameters = {
        "target": "run",
        "factor": 0.1,
        "threshold": 0.6,
        "conceptual": True,
        "neighbours": "cosine",
        "score": "logprob",
        "square": False,
        "chunk_tokens": 8192,
    }
    choices = {
        "target": ("run", "predicted", "gold"),
        "neighbours": ("cosine", "same"),
        "score": ("logprob", "logit"),
    }
    parameter_docs = {
        "target": "the score explained: run, the run's --target score; predicted or gold, "
        "that class's",
        "factor": "f, the suppressed column's shifted scores are multiplied by it (the "
        "official default 0.1; the paper's 'suppression 0.9' is 1 - f); in [0, 1)",
        "threshold": "conceptual suppression's cosine similarity of input embeddings above "
        "which a token is suppressed with the explained one (official default 0.6); in [0, 1]",
        "conceptual": "suppress each token's cosine neighbours too (the official Explainer's "
        "default); false: the token alone",
        "neighbours": "a neighbour's factor: cosine, (1 - f)(1 - cos) + f (official); same, f",
        "score": "logprob: the drop of the target's log-probability (the official cross-entropy "
        "difference); logit: of the run's target logit (the contrastive score included)",
        "square": "square each drop, as the official examples' heatmaps do (loses the sign)",
        "chunk_tokens": "the most tokens in one pass of suppressed copies; bounds memory; an "
        "integer >= 1",
    }

    def validate(self) -> None:
        if not 0.0 <= self.params["factor"] < 1.0:
            raise self.out_of_range("factor", "in [0, 1)")
        if not 0.0 <= self.params["threshold"] <= 1.0:
            raise self.out_of_range("threshold", "in [0, 1]")
        if self.params["chunk_tokens"] < 1:
            raise self.out_of_range("chunk_tokens", ">= 1")

    def explained_target(self, trace: Trace) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The classes (and foils) whose score AtMan explains: what the removal evaluators
        score (attrib_bench.core.interfaces.scored_classes)."""
        return explained_classes(trace, self.params["target"])

    def attribute(self, trace: Trace) -> Attribution:
        loaded, batch = trace.loaded, trace.batch
        classes_B, foils_B = self.explained_target(trace)
        scores_BN = torch.zeros(batch.input_ids_BN.shape, dtype=torch.float64)
        threshold = self.params["threshold"] if self.params["conceptual"] else None
        lookup = loaded.model.get_input_embeddings()
        with suppressing(loaded.model) as record, torch.no_grad():
            for row in range(batch.input_ids_BN.shape[0]):
                ids_1N, arguments = example_arguments(trace, row, classes_B, foils_B)
                factors_NN = suppression_factors(
                    lookup(ids_1N)[0], self.params["factor"], threshold, self.params["neighbours"]
                )
                clean_1N = torch.ones_like(factors_NN[:1])
                values_V = self.scores(
                    loaded, record, ids_1N, arguments, torch.cat([clean_1N, factors_NN])
                )
                drops_N = values_V[0] - values_V[1:]
                real_N = batch.attention_mask_BN[row].bool().cpu()
                scores_BN[row, real_N] = drops_N.square() if self.params["square"] else drops_N
        return Attribution(aggregated_BLN=scores_BN[:, None, :].to(trace.logits_BC.device))

    def scores(
        self,
        loaded: Any,
        record: dict[str, Any],
        ids_1N: torch.Tensor,
        arguments: dict,
        factors_VN: torch.Tensor,
    ) -> torch.Tensor:
        """The explained score (V,) of one example under each row of suppression factors, in
        passes of at most ``chunk_tokens`` tokens; float64."""
        mask_1N, positions_1, types_1N, position_ids_1N, *contrast = arguments[
            "additional_forward_args"
        ]
        classes, foils = contrast if contrast else (arguments["target"], None)
        rows = per_pass(factors_VN.shape[0], ids_1N.shape[1], self.params["chunk_tokens"])
        inputs = {
            "input_ids": ids_1N,
            "attention_mask": mask_1N,
            "token_type_ids": types_1N,
            "position_ids": position_ids_1N,
        }
        inputs = {name: value for name, value in inputs.items() if value is not None}
        values = []
        for part_VN in factors_VN.split(rows):
            copies = part_VN.shape[0]
            record["factors"] = part_VN.to(ids_1N.device)
            out = loaded.model(**{name: v.expand(copies, -1) for name, v in inputs.items()})
            if record["calls"] == 0:
                raise UsageError(
                    f"atman: the attention of {loaded.model.config.model_type} does not go "
                    "through transformers' attention interface, so it cannot be suppressed"
                )
            logits_VC = loaded.target_logits(out.logits, positions_1.expand(copies)).double()
            if self.params["score"] == "logprob":
                logits_VC = logits_VC.log_softmax(dim=-1)
            foils_V = None if foils is None else foils.expand(copies)
            values.append(target_score(logits_VC, classes.expand(copies), foils_V))
        return torch.cat(values).cpu()


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [AtMan()]
