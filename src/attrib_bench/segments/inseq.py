"""Inseq's saved attributions of continuations, as a context run's examples and one method.

An Inseq user's ``FeatureAttributionOutput.save`` file (JSON, gzip-compressed or not) holds, per
prompt, the generated continuation and each generation step's scores (docs/segments.md, "Inseq
files"). Given as ``attrib-bench context --dataset``, each sequence becomes an example (its
prompt as it is, split by ``--split-by``; its continuation the answer) and the file becomes a
method named after it, whose step t attributes the prompt tokens (summed per segment, the stated
rule of every token method) and the continuation's earlier tokens (the prefix). The segment
evaluators then score Inseq's attributions beside any method the run adds.

- A decoder-only model's file: ``target_attributions`` (N, T) or (N, T, D) over the prompt and
  continuation tokens, one column per step; rows before ``attr_pos_start`` are the prompt's.
- An encoder-decoder model's: ``source_attributions`` (S, T[, D]) over the source tokens, and
  ``target_attributions`` (T + 1, T[, D]) over the decoder's inputs when Inseq attributed the
  target (``attribute_target=True``): row 0 is the start token, which no segment holds.

Inseq writes NaN where a step cannot read a continuation token (its own and later ones); those
read as 0, the project's form of a prefix matrix (row t zero from column t on).

A granular file's hidden dimension D is reduced by ``reduce`` (as ``evaluate`` reduces it). The
file's tokens must be the model tokenizer's for that text, prompt and continuation alike, and the
file must attribute every step of the continuation; else one line names the sequence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from attrib_bench.core.errors import UsageError
from attrib_bench.core.segment_interfaces import StepScores
from attrib_bench.runner.outside import inseq_scores, load_inseq
from attrib_bench.segments.data import RAW_TEMPLATE, SegmentExample, split_context
from attrib_bench.segments.scorer import SegmentScorer


class InseqFileSegments:
    """The steps an Inseq file holds, by example id: (T, N) over the prompt tokens and, where
    the file has them, (T, T - 1) over the continuation's tokens but its last."""

    description = "attributions read from an Inseq file (per step, summed per segment)"
    model_kinds = ("causal", "seq2seq")

    def __init__(self, name: str, steps: dict[str, tuple[np.ndarray, np.ndarray | None]]):
        self.name = name
        self.steps = steps

    def attribute_steps(self, scorer: SegmentScorer) -> StepScores | np.ndarray:
        prompt_TN, prefix_TP = self.steps[scorer.example.id]
        segments_TS = scorer.to_segments(prompt_TN)
        return segments_TS if prefix_TP is None else StepScores(segments_TS, prefix_TP)

    def attribute_segments(self, scorer: SegmentScorer) -> np.ndarray:
        prompt_TN, _ = self.steps[scorer.example.id]
        return scorer.to_segments(prompt_TN).sum(axis=0)


def _scores(encoded: str | None, where: str, what: str, reduce: str) -> torch.Tensor | None:
    """One of Inseq's attribution tensors, (rows, T), or None where the file has none."""
    return None if encoded is None else inseq_scores(encoded, f"{where}: {what}", reduce).double()


def _check_ids(where: str, what: str, file_ids: list[int], ours: list[int], tokenizer) -> None:
    if file_ids != ours:
        raise UsageError(
            f"{where}: the file's {what} tokens {tokenizer.convert_ids_to_tokens(file_ids)} are "
            f"not the model tokenizer's {tokenizer.convert_ids_to_tokens(ours)}: attribute with "
            "the same model and tokenizer"
        )


def read_inseq_continuations(
    path: Path,
    tokenizer: Any,
    is_seq2seq: bool,
    split_by: str,
    limit: int | None,
    reduce: str = "l2",
) -> tuple[list[SegmentExample], InseqFileSegments]:
    """The file's sequences as examples (ids ``0``, ``1``...) and its attributions as a method
    named after the file (see the module)."""
    attributes = load_inseq(path)
    texts = attributes["info"]["input_texts"]
    generated = attributes["info"]["generated_texts"]
    sequences = attributes["sequence_attributions"]
    if not len(texts) == len(generated) == len(sequences):
        raise UsageError(f"{path}: {len(texts)} input texts but {len(sequences)} attributions")
    examples, steps = [], {}
    rows = zip(texts, generated, sequences, strict=True)
    for number, (prompt, text, sequence) in enumerate(rows):
        if limit is not None and number >= limit:
            break
        where = f"{path.name}: sequence {number} ({prompt[:40]!r})"
        sequence = sequence["attributes"]
        encoder_decoder = sequence.get("source_attributions") is not None
        if encoder_decoder != is_seq2seq:
            kinds = ("a decoder-only", "an encoder-decoder")
            raise UsageError(
                f"{where}: attributions of {kinds[encoder_decoder]} model, but the model is "
                f"{kinds[is_seq2seq]} one"
            )
        target = [token["attributes"]["id"] for token in sequence["target"]]
        start = sequence["attr_pos_start"]
        if sequence["attr_pos_end"] != len(target):
            raise UsageError(
                f"{where}: the file attributes steps {start} to {sequence['attr_pos_end']} of "
                f"{len(target)} tokens; attribute the whole continuation"
            )
        source = sequence["source"] if encoder_decoder else sequence["target"][:start]
        source_ids = [token["attributes"]["id"] for token in source]
        if encoder_decoder:
            answer, answer_ids = text, target[1:]
        elif text.startswith(prompt):
            answer, answer_ids = text[len(prompt) :], target[start:]
        else:
            raise UsageError(f"{where}: the generated text does not start with the prompt")
        _check_ids(where, "prompt", source_ids, list(tokenizer(prompt)["input_ids"]), tokenizer)
        alone = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
        _check_ids(where, "continuation", answer_ids, alone, tokenizer)
        T = len(answer_ids)
        if encoder_decoder:
            prompt_NT = _scores(sequence["source_attributions"], where, "source", reduce)
            decoder = _scores(sequence.get("target_attributions"), where, "target", reduce)
            prefix_PT = None if decoder is None else decoder[1:T]
        else:
            full = _scores(sequence.get("target_attributions"), where, "target", reduce)
            if full is None:
                raise UsageError(f"{where}: no target_attributions")
            prompt_NT, prefix_PT = full[:start], full[start : start + T - 1]
        if prompt_NT.shape != (len(source_ids), T):
            raise UsageError(
                f"{where}: attributions of shape {tuple(prompt_NT.shape)} do not fit its "
                f"{len(source_ids)} prompt tokens and {T} steps"
            )
        if prefix_PT is not None:  # Inseq writes NaN where step t cannot read a_p (p >= t)
            prefix_PT = prefix_PT.masked_fill(torch.ones_like(prefix_PT).tril().bool(), 0.0)
        if not all(x is None or bool(x.isfinite().all()) for x in (prompt_NT, prefix_PT)):
            raise UsageError(f"{where}: a score a step can read is not finite")
        segments = tuple(split_context(prompt, split_by, tokenizer))
        example = SegmentExample(
            id=str(number),
            segments=segments,
            query="",
            answer=answer,
            separator="" if split_by == "tokens" else " ",
            raw=True,
        )
        if RAW_TEMPLATE.format(context=example.context(), query="") != prompt:
            raise UsageError(
                f"{where}: split by {split_by}, the prompt does not join back to the text Inseq "
                "attributed; use --split-by tokens to keep it as it is"
            )
        examples.append(example)
        steps[example.id] = (
            prompt_NT.T.numpy(),
            None if prefix_PT is None else prefix_PT.T.numpy(),
        )
    name = path.name.removesuffix(".gz").removesuffix(".json")
    return examples, InseqFileSegments(name, steps)
