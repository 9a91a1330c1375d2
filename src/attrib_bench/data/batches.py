"""Tokenise examples into padded batches, counting the inputs that had to be truncated."""

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


def make_batches(
    examples: Sequence[Example],
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    max_length: int,
) -> tuple[list[Batch], int]:
    """Batches of similar length (less padding), and how many examples were truncated.

    Order within the returned batches differs from ``examples``; results are keyed by example
    id, and an example's attribution does not depend on its batch companions.
    """
    full_lengths = [len(ids) for ids in _encode(tokenizer, examples)["input_ids"]]
    truncated = sum(length > max_length for length in full_lengths)
    order = sorted(range(len(examples)), key=lambda i: -full_lengths[i])
    batches = []
    for start in range(0, len(order), batch_size):
        chunk = [examples[i] for i in order[start : start + batch_size]]
        encoded = _encode(
            tokenizer,
            chunk,
            padding=True,
            truncation=True,
            max_length=max_length,
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
            tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())
            for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
        ]
        batches.append(
            Batch(
                examples=chunk,
                input_ids_BN=encoded["input_ids"],
                attention_mask_BN=encoded["attention_mask"],
                token_type_ids_BN=encoded.get("token_type_ids"),
                special_tokens_mask_BN=encoded["special_tokens_mask"],
                tokens=tokens,
                word_ids_BN=torch.tensor(word_ids, dtype=torch.long),
            )
        )
    return batches, truncated


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
