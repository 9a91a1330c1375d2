"""Tokenise examples into padded batches of similar length, counting the inputs that had to be
truncated; a run reads its batches one at a time from a :class:`BatchPlan`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from attrib_bench.core.interfaces import Batch, Example
from attrib_bench.data.rationales import token_word_ids


def _encode(tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example], **kwargs):
    texts = [e.text for e in examples]
    pairs = [e.text_pair for e in examples]
    if any(p is not None for p in pairs):
        return tokenizer(texts, [p or "" for p in pairs], **kwargs)
    return tokenizer(texts, **kwargs)


class BatchPlan(Sequence[Batch]):
    """Batches of similar length (less padding), tokenised only when read.

    The plan holds which examples go together (``groups``: indices into ``examples``, longest
    first); each batch's tensors are made when it is read and freed with it, so a run streams
    its batches and its memory does not grow with the dataset. Order within the batches differs
    from ``examples``; results are keyed by example id.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        groups: list[list[int]],
        lengths: list[int],
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
    ) -> None:
        self.examples = examples
        self.groups = groups
        #: Each example's untruncated token count (what the batches are sorted by).
        self.lengths = lengths
        self.tokenizer = tokenizer
        self.max_length = max_length

    @property
    def truncated(self) -> int:
        """How many of the plan's examples are longer than ``max_length`` (cut to it)."""
        return sum(length > self.max_length for length in self.lengths)

    def padded_tokens(self) -> list[int]:
        """Each batch's tokens as padded (examples x its longest, cut to ``max_length``): what a
        pass over it costs, roughly, so a run's progress estimates the time left by them."""
        return [
            len(group) * min(max(self.lengths[i] for i in group), self.max_length)
            for group in self.groups
        ]

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, index: int) -> Batch:  # type: ignore[override]  # no slices
        return _encode_batch([self.examples[i] for i in self.groups[index]], self)

    def subset(self, indices: Sequence[int]) -> tuple[BatchPlan, list[int]]:
        """The plan of the batches at ``indices`` only (the same batches, their examples in
        this plan's order), and those examples' indices in this plan's ``examples``."""
        groups = [self.groups[i] for i in indices]
        kept = sorted(i for group in groups for i in group)
        where = {old: new for new, old in enumerate(kept)}
        plan = BatchPlan(
            [self.examples[i] for i in kept],
            [[where[i] for i in group] for group in groups],
            [self.lengths[i] for i in kept],
            self.tokenizer,
            self.max_length,
        )
        return plan, kept


def plan_batches(
    examples: Sequence[Example],
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    max_length: int,
) -> BatchPlan:
    """The examples in batches of ``batch_size`` sorted by length, longest first (ties keep
    the examples' order); nothing is padded until a batch is read."""
    return plan_grouped_batches([examples], tokenizer, batch_size, max_length)


def plan_grouped_batches(
    groups: Sequence[Sequence[Example]],
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    max_length: int,
) -> BatchPlan:
    """:func:`plan_batches` of each group in turn, as one plan: no batch mixes two groups (the
    cache batches examples by the methods they still miss)."""
    examples = [example for group in groups for example in group]
    lengths = [len(ids) for ids in _encode(tokenizer, examples)["input_ids"]] if examples else []
    batches: list[list[int]] = []
    start = 0
    for group in groups:
        members = range(start, start + len(group))
        order = sorted(members, key=lambda i: -lengths[i])
        batches += [order[at : at + batch_size] for at in range(0, len(order), batch_size)]
        start += len(group)
    return BatchPlan(examples, batches, lengths, tokenizer, max_length)


def make_batches(
    examples: Sequence[Example],
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    max_length: int,
) -> tuple[list[Batch], int]:
    """Every batch of :func:`plan_batches` tokenised at once, and how many examples were
    truncated: for the small sets of fine-tuning, analyses and tests."""
    plan = plan_batches(examples, tokenizer, batch_size, max_length)
    return list(plan), plan.truncated


def _encode_batch(chunk: list[Example], plan: BatchPlan) -> Batch:
    encoded = _encode(
        plan.tokenizer,
        chunk,
        padding=True,
        truncation=True,
        max_length=plan.max_length,
        return_tensors="pt",
        return_special_tokens_mask=True,
        return_offsets_mapping=True,
    )
    offsets = encoded.pop("offset_mapping").tolist()
    word_ids = [
        token_word_ids(e.text, offsets[row], encoded.sequence_ids(row))
        for row, e in enumerate(chunk)
    ]
    tokens = [
        plan.tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())
        for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
    ]
    return Batch(
        examples=chunk,
        input_ids_BN=encoded["input_ids"],
        attention_mask_BN=encoded["attention_mask"],
        token_type_ids_BN=encoded.get("token_type_ids"),
        special_tokens_mask_BN=encoded["special_tokens_mask"],
        tokens=tokens,
        word_ids_BN=torch.tensor(word_ids, dtype=torch.long),
    )


def contentless_ids(batches: Sequence[Batch], unk_token_id: int | None) -> list[str]:
    """Ids of examples with nothing to attribute: whitespace-only texts, or texts whose every
    token is special or unknown (emoji-only under a WordPiece vocabulary).

    They are still scored, but their scores rank [CLS], [SEP] and [UNK] only, so the run warns.
    """
    found = []
    for batch in batches:
        content_BN = batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool()
        if unk_token_id is not None:
            content_BN &= batch.input_ids_BN != unk_token_id
        for example, has_content in zip(batch.examples, content_BN.any(dim=1), strict=True):
            if not has_content or not (example.text + (example.text_pair or "")).strip():
                found.append(example.id)
    return found
