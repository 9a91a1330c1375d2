"""Conformance kit for segment plugins (``attrib-bench context``): run a segment method or
evaluator on tiny random causal language models, say what to fix.

``check_segment_attributor`` and ``check_segment_evaluator`` (re-exported by
attrib_bench.testing) run a plugin on tiny random causal LMs (LLaMA, GPT-2) and encoder-decoder
LMs (T5, BART, Marian), seeded, built offline in a second with a byte-level BPE tokenizer
trained on a few sentences, over two context examples,
and raise one ConformanceError listing every problem with what to fix. What the runner cannot
see on one example and the report relies on: that the scores do not depend on what the scorer
has already scored or on its batch size (padding), that two fresh runs agree (a seed fixes
every random draw), and that ``attribute_steps``, where there is one, sums to the scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attrib_bench.core.errors import UsageError
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.plugin_info import segment_info
from attrib_bench.core.segment_interfaces import StepScores
from attrib_bench.segments.data import DEFAULT_TEMPLATE, SegmentExample
from attrib_bench.segments.scorer import SegmentScorer
from attrib_bench.testing.conformance import _failure, _mismatch, _raise, built_once

DECODER_FAMILIES = ("llama", "gpt2")
#: Encoder-decoder families: no seq2seq weights ship offline, so tiny random ones.
SEQ2SEQ_FAMILIES = ("t5", "bart", "marian")
FAMILIES = DECODER_FAMILIES + SEQ2SEQ_FAMILIES

#: The texts the tiny decoders' tokenizer is trained on.
DECODER_TEXTS = [
    "the cat sat on the mat",
    "a dog",
    "when mary and john went to the store , john gave a drink to",
]


def bpe_tokenizer():
    """A byte-level BPE tokenizer trained on DECODER_TEXTS: GPT-2's kind, with no pad token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(DECODER_TEXTS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def save_tiny_decoder(directory: Path, kind: str, tied: bool | None = None) -> Path:
    """A tiny random LlamaForCausalLM (``kind="llama"``, grouped-query) or GPT2LMHeadModel with
    its tokenizer, saved to ``directory``; seeded, so every call saves the same weights.
    ``tied``: whether the head shares the input embeddings (None: the config's default, untied
    for Llama, tied for GPT-2)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    tokenizer = bpe_tokenizer()
    tie = {} if tied is None else {"tie_word_embeddings": tied}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if kind == "llama":
            config = LlamaConfig(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                **tie,
            )
            model = LlamaForCausalLM(config)
        else:
            config = GPT2Config(
                vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64, **tie
            )
            model = GPT2LMHeadModel(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_tiny_seq2seq(directory: Path, kind: str) -> Path:
    """A tiny random T5ForConditionalGeneration (``kind="t5"``), BartForConditionalGeneration
    or MarianMTModel (scaled embeddings, sinusoidal positions) with the tiny BPE tokenizer,
    saved to ``directory``; seeded. The tokenizer's one special token starts, pads and ends."""
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        MarianConfig,
        MarianMTModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    tokenizer = bpe_tokenizer()
    special = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = dict(pad_token_id=special, eos_token_id=special, decoder_start_token_id=special)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if kind == "t5":
            config = T5Config(
                vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=48, num_layers=2,
                num_heads=4, relative_attention_num_buckets=8, **ids,
            )  # fmt: skip
            model = T5ForConditionalGeneration(config)
        else:
            sizes = dict(
                vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                decoder_ffn_dim=48, max_position_embeddings=64, bos_token_id=special, **ids,
            )  # fmt: skip
            if kind == "bart":
                model = BartForConditionalGeneration(BartConfig(**sizes))
            else:
                model = MarianMTModel(MarianConfig(scale_embedding=True, **sizes))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


#: Two contexts: four segments and a two-token answer; two segments and a one-token answer
#: against a two-token foil (a contrastive example: its steps are the answer's, then the foil's).
EXAMPLES = (
    SegmentExample(
        "kit-cat",
        ("the cat sat on the mat.", "a dog ran.", "mary gave a drink to john.", "the store"),
        "who sat?",
        " the cat",
        evidence=(1, 0, 0, 0),
    ),
    SegmentExample(
        "kit-drink",
        ("when mary and john went to the store.", "john gave a drink to mary."),
        "who gave a drink?",
        " john",
        evidence=(0, 1),
        foil=" mary gave",
    ),
)

_TINY_DECODERS: dict[str, LoadedModel] = {}


def tiny_decoder(family: str = "llama") -> LoadedModel:
    """The tiny random causal LM (``DECODER_FAMILIES``) or encoder-decoder LM
    (``SEQ2SEQ_FAMILIES``) of ``family`` on the CPU, built once per process."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    save = save_tiny_decoder if family in DECODER_FAMILIES else save_tiny_seq2seq
    return built_once(save, family, _TINY_DECODERS)


@dataclass
class SegmentReport:
    """What a segment check saw: per family, per example id, the shape of the scores (the
    method's (S,), or the evaluator's value names); ``steps``: whether ``attribute_steps`` was
    checked too."""

    name: str
    shapes: dict[str, dict[str, Any]]
    steps: bool = False


def _scorer(loaded: LoadedModel, example: SegmentExample, batch_size: int = 8) -> SegmentScorer:
    return SegmentScorer(loaded, example, DEFAULT_TEMPLATE, batch_size)


def _used(loaded: LoadedModel, example: SegmentExample) -> SegmentScorer:
    """A scorer that runs one ablation at a time and has scored other ablations already."""
    scorer = _scorer(loaded, example, batch_size=1)
    rng = np.random.default_rng(12345)
    scorer.scores(rng.random((3, scorer.count)) < 0.5)
    return scorer


def _answer_scale(loaded: LoadedModel, example: SegmentExample) -> float:
    """|s(all)|, the size of the log-probabilities the scores are differences of: float32
    rounding of those, not of the (perhaps tiny) differences, is what batching changes."""
    return max(abs(_scorer(loaded, example).full_score), 1e-12)


def _interface(obj: Any, method: str) -> list[tuple[str, str]]:
    problems = []
    for attribute in ("name", "description"):
        value = getattr(obj, attribute, None)
        if not isinstance(value, str) or not value.strip():
            problems.append(("", f"`{attribute}` must be a non-empty string, got {value!r}"))
    if not callable(getattr(obj, method, None)):
        problems.append(("", f"`{method}` must be a method"))
    return problems


def _call(run: Callable[[], Any], call: str) -> tuple[Any, str | None]:
    try:
        return run(), None
    except Exception as error:  # the plugin's failure, reported with its line
        return None, _failure(call, error)


def _scores(value: Any, shape: tuple[int, ...], call: str) -> tuple[np.ndarray | None, str | None]:
    """``value`` as a float array of ``shape``, or why not."""
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        return None, f"{call} returned {type(value).__name__}, not numbers"
    if array.shape != shape:
        return None, f"{call} returned shape {array.shape}, not {shape}"
    if not np.isfinite(array).all():
        return None, f"{call} returned a value that is not finite (NaN or inf)"
    return array, None


def check_segment_attributor(obj: Any, families: Sequence[str] = FAMILIES) -> SegmentReport:
    """Run a segment method on each family's tiny random language model (``FAMILIES``: causal
    and encoder-decoder; ``families`` narrows them, and so does the method's ``model_kinds``,
    "causal" and "seq2seq" by default); raise a ConformanceError
    naming every problem and its fix, or return the shapes seen.

    Checks: ``name`` and ``description``; ``attribute_segments`` returns (S,) finite scores;
    a second call on a fresh scorer gives the same (a seed fixes every random draw); a scorer
    that runs one ablation at a time and has scored other ablations already gives the same up
    to float32 rounding (relative 1e-4, absolute 1e-5 of the largest score or of the answer's
    log-probability, whichever is larger: the scores depend on the example, not on the
    scorer's memory or its batch padding); ``attribute_steps``, if
    the method has it, returns (T, S) finite rows summing to the scores (the same rounding),
    T the scorer's ``step_count``, and a ``StepScores`` prefix (T, ``prefix_count``) that is 0
    wherever a step would read a continuation's token at or after its own (row t of the answer
    reads its columns 0..t-1 alone; a foil's steps read the foil's columns alone).
    """
    problems = _interface(obj, "attribute_segments")
    _raise(obj, problems)
    try:
        kinds = segment_info(obj).model_kinds
    except UsageError as error:
        _raise(obj, [("", str(error))])
    steps = callable(getattr(obj, "attribute_steps", None))
    shapes: dict[str, dict[str, Any]] = {}
    for family in (f for f in families if _kind(f) in kinds):
        loaded = tiny_decoder(family)
        shapes[family] = {}
        for example in EXAMPLES:
            found = _attributor_problems(obj, loaded, example, steps)
            problems += [(family, f"example {example.id!r}: {message}") for message in found]
            shapes[family][example.id] = (len(example.segments),)
    _raise(obj, problems)
    return SegmentReport(obj.name, shapes, steps)


def _kind(family: str) -> str:
    """The ``model_kinds`` entry a family's tiny model is: "causal" or "seq2seq"."""
    return "causal" if family in DECODER_FAMILIES else "seq2seq"


def _attributor_problems(
    obj: Any, loaded: LoadedModel, example: SegmentExample, steps: bool
) -> list[str]:
    count = len(example.segments)
    call = "attribute_segments(scorer)"
    value, failure = _call(lambda: obj.attribute_segments(_scorer(loaded, example)), call)
    if failure is not None:
        return [failure]
    first, problem = _scores(value, (count,), call)
    if problem is not None:
        return [problem]
    scale = max(float(np.abs(first).max()), _answer_scale(loaded, example))
    problems = []
    for make, tolerance, message in (
        (
            lambda: _scorer(loaded, example),
            None,
            "a second call on a fresh scorer gives other scores ({}): seed every random draw "
            "from the method's parameters and the example",
        ),
        (
            lambda: _used(loaded, example),
            scale,
            "a scorer that batches one ablation at a time and has scored others already gives "
            "other scores ({}): read only the scorer's scores, never its state",
        ),
    ):
        value, failure = _call(lambda m=make: obj.attribute_segments(m()), call)
        other, problem = (None, failure) if failure else _scores(value, (count,), call)
        difference = problem or _mismatch(first, other, tolerance)
        if difference is not None:
            problems.append(message.format(difference))
    if steps:
        problems += _steps_problems(obj, loaded, example, first, scale)
    return problems


def _steps_problems(
    obj: Any, loaded: LoadedModel, example: SegmentExample, first: np.ndarray, scale: float
) -> list[str]:
    """``attribute_steps``: (T, S) rows summing to the scores; a prefix (T, P) that is 0 where a
    step would read a token it does not (``_readable``)."""
    scorer = _scorer(loaded, example)
    T, P = scorer.step_count, scorer.prefix_count
    call = "attribute_steps(scorer) (T = scorer.step_count rows)"
    value, failure = _call(lambda: obj.attribute_steps(_scorer(loaded, example)), call)
    if failure is not None:
        return [failure]
    matrix, prefix = value if isinstance(value, StepScores) else (value, None)
    matrix, problem = _scores(matrix, (T, len(first)), call)
    if problem is not None:
        return [problem]
    difference = _mismatch(first, matrix.sum(axis=0), scale)
    problems = []
    if difference is not None:
        problems.append(
            f"attribute_steps does not sum over its rows to attribute_segments "
            f"({difference}): row t attributes the score's term t alone"
        )
    if prefix is not None:
        prefix, problem = _scores(prefix, (T, P), f"{call}'s prefix")
        unread = ~_readable(scorer)
        if problem is None and np.abs(prefix[unread]).max(initial=0.0) > 1e-6 * scale:
            problem = (
                "the prefix gives a step a score for a token it does not read: row t of a "
                "continuation scores its tokens before t alone (c_0..c_(t-1)), 0 elsewhere"
            )
        if problem is not None:
            problems.append(problem)
    return problems


def _readable(scorer: SegmentScorer) -> np.ndarray:
    """(T, P): whether step t reads prefix column j. The columns are each continuation's
    tokens but its last, in order; a continuation's step t reads its own tokens before t."""
    readable = np.zeros((scorer.step_count, scorer.prefix_count), dtype=bool)
    row = column = 0
    for ids, _ in scorer.continuations:
        for t in range(len(ids)):
            readable[row + t, column : column + t] = True
        row, column = row + len(ids), column + len(ids) - 1
    return readable


def check_segment_evaluator(obj: Any, families: Sequence[str] = FAMILIES) -> SegmentReport:
    """Run a segment evaluator on each family's tiny random language model, on two score vectors
    per example (a ranking and its reverse); raise a ConformanceError naming every problem, or
    return the value names seen.

    Checks: ``name`` and ``description``; ``evaluate_segments`` returns a dict of names to
    floats (NaN allowed: undefined), the same names for every input; a second call on a fresh
    scorer gives the same values; a scorer that runs one ablation at a time and has scored
    others already gives the same up to float32 rounding.
    """
    problems = _interface(obj, "evaluate_segments")
    _raise(obj, problems)
    shapes: dict[str, dict[str, Any]] = {}
    for family in families:
        loaded = tiny_decoder(family)
        shapes[family] = {}
        for example in EXAMPLES:
            names, found = _evaluator_problems(obj, loaded, example)
            problems += [(family, f"example {example.id!r}: {message}") for message in found]
            shapes[family][example.id] = names
    _raise(obj, problems)
    return SegmentReport(obj.name, shapes)


def _values(value: Any, call: str) -> tuple[dict[str, float] | None, str | None]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return None, f"{call} returned {type(value).__name__}, not a dict of names to floats"
    try:
        return {k: float(v) for k, v in value.items()}, None
    except (TypeError, ValueError):
        return None, f"{call} returned a value that is not a number"


def _evaluator_problems(
    obj: Any, loaded: LoadedModel, example: SegmentExample
) -> tuple[tuple[str, ...], list[str]]:
    count = len(example.segments)
    ranking = np.linspace(1.0, -1.0, count)
    call = "evaluate_segments(scorer, scores)"
    problems: list[str] = []
    seen: tuple[str, ...] = ()
    for scores in (ranking, ranking[::-1].copy()):
        value, failure = _call(
            lambda s=scores: obj.evaluate_segments(_scorer(loaded, example), s), call
        )
        first, problem = (None, failure) if failure else _values(value, call)
        if problem is not None:
            return seen, [problem]
        names = tuple(sorted(first))
        if seen and names != seen:
            problems.append(f"the value names differ between inputs: {seen} and {names}")
        seen = names
        expected = np.array([first[n] for n in names])
        for what, scorer, scale in (
            ("a second call on a fresh scorer", lambda: _scorer(loaded, example), None),
            (
                "a scorer that batches one ablation at a time and has scored others already",
                lambda: _used(loaded, example),
                max(float(np.abs(np.nan_to_num(expected)).max()), _answer_scale(loaded, example)),
            ),
        ):
            value, failure = _call(lambda s=scores, f=scorer: obj.evaluate_segments(f(), s), call)
            other, problem = (None, failure) if failure else _values(value, call)
            actual = None if other is None else np.array([other.get(n, np.nan) for n in names])
            difference = problem or _mismatch(expected, actual, scale)
            if difference is not None:
                problems.append(f"{what} gives other values ({difference})")
    return seen, list(dict.fromkeys(problems))
