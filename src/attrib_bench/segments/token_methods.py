"""Registered token attributors (``attrib-bench run``'s methods) as segment methods.

A token attributor explains one next token at a time: the logit of the gold token at the last
position (``--target position=last,score=gold``, the run's protocol for a causal language model).
For an answer a_0..a_{T-1} after a prompt of P tokens, step t is the sequence of the prompt and
a_<t with a_t as its gold token; the method's last-layer row over those tokens is summed over
each segment's tokens (docs/segments.md: the stated rule, sum), and over the answer's tokens
a_<t kept apart (the prefix). The segment scores are the sum over the steps. So every token
method enters the segment evaluators beside the segment-native ones; what it explains is the
answer's logits, not its log-probability, which the others explain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from attrib_bench.core.batch import Batch, Example
from attrib_bench.core.segment_interfaces import StepScores
from attrib_bench.core.target import Target
from attrib_bench.core.trace_fields import TraceField
from attrib_bench.model.trace import trace_batch
from attrib_bench.segments.scorer import SegmentScorer

#: The target every step explains: the gold (answer) token's logit at the sequence's end.
STEP_TARGET = Target(position="last", score="gold")


class TokenMethodSegments:
    """A registered token attributor, aggregated to segments by sum (see the module)."""

    #: A token attributor explains a causal model's next token (an encoder-decoder model's
    #: attention: the cross-attention segment methods).
    model_kinds = ("causal",)

    def __init__(
        self, spec: str, attributor: Any, fields: Mapping[str, TraceField], seed: int = 0
    ) -> None:
        self.name = f"tokens/{spec}"
        self.description = f"token attributor {spec}, summed over each segment's tokens"
        self.attributor = attributor
        self.fields = fields
        self.seed = seed

    def attribute_segments(self, scorer: SegmentScorer) -> np.ndarray:
        return self.attribute_steps(scorer).segments_TS.sum(axis=0)

    def attribute_steps(self, scorer: SegmentScorer) -> StepScores:
        loaded = scorer.loaded
        if scorer.foil_ids is not None:
            raise RuntimeError(
                "token attributors explain one next token's logit; a contrastive target's "
                "answer and foil are two continuations"
            )
        problem = loaded.unmet_needs(self.attributor)
        if problem:
            raise RuntimeError(problem)
        P, T = len(scorer.prompt_ids), len(scorer.answer_ids)
        full = scorer.ids()
        rows: list[np.ndarray] = []
        for first in range(0, T, scorer.batch_size):
            steps = range(first, min(first + scorer.batch_size, T))
            batch = _batch(loaded, scorer.example.id, [full[: P + t] for t in steps], full)
            trace = trace_batch(
                loaded, batch, self.attributor.requires, self.seed, self.fields, STEP_TARGET
            )
            try:
                attribution = self.attributor.attribute(trace)
            finally:
                trace.release_graph()
            last = attribution.aggregated_BLN[:, -1].detach().double().cpu().numpy()
            rows += [last[b, : P + t] for b, t in enumerate(steps)]
        padded = np.zeros((T, P + T - 1))
        for t, row in enumerate(rows):
            padded[t, : len(row)] = row
        return StepScores(scorer.to_segments(padded), padded[:, P : P + T - 1])


def _batch(loaded: Any, example_id: str, sequences: list[list[int]], full: list[int]) -> Batch:
    """Right-padded sequences (prefixes of ``full``) with the next token of each as gold."""
    tokenizer = loaded.tokenizer
    width = max(map(len, sequences))
    pad = tokenizer.pad_token_id or 0
    examples = [
        Example(id=f"{example_id}#{len(s)}", text="", label=full[len(s)]) for s in sequences
    ]
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    special = torch.tensor(
        [
            tokenizer.get_special_tokens_mask(s, already_has_special_tokens=True)
            + [1] * (width - len(s))
            for s in sequences
        ]
    )
    tokens = [tokenizer.convert_ids_to_tokens(s) for s in sequences]
    return Batch(examples, ids, mask, None, special, tokens).to(loaded.device)
