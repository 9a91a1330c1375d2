"""The explained score of a context example under any choice of kept segments.

The score is the answer's log-probability given the prompt, ``sum_t log p(a_t | prompt, a_<t)``
(docs/segments.md), kept per step too. A prompt is the template filled with the kept segments
and the query, tokenised whole (segments are dropped as text, as ContextCite drops them), and
the answer's token ids follow it unchanged. Every segment method and evaluator asks this object
for scores, so an ablation two of them share is run once (``memo``).

Leave-one-segment-out has a cheaper exact form: an ablated prompt shares its tokens with the
full prompt up to the dropped segment, so the key-value cache of that prefix is reused and only
the rest runs (``leave_one_out``). Equal to running each ablated prompt whole, up to float
rounding (tests/test_segments.py).

An encoder-decoder model (``LoadedModel.is_seq2seq``: T5, BART, Marian) takes the prompt as its
encoder's input and the answer as its decoder's (shifted right after the start token), so the
answer's tokenisation does not depend on the prompt; its encoder is bidirectional, so no prefix
is shared and leave-one-out runs each ablated prompt whole.

A **contrastive** example (``SegmentExample.foil``: a foil continuation) explains the answer's
log-probability minus the foil's, each after the same prompt; its steps are the answer's terms
then the foil's, negated, so that they still sum to the score.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from attrib_bench.core.errors import UsageError
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.segments.data import DEFAULT_TEMPLATE, SegmentExample

_MARK = "\x00"


class AttentionMaps(NamedTuple):
    """An encoder-decoder model's attention probabilities, per layer (1, H, n, m) as the model
    returns them (the tensors its pass used, so gradients can be taken at them): the encoder's
    self-attention (S x S), the decoder's (T x T, causal) and its cross-attention (T x S) for one
    continuation; the score's terms of that continuation from the same pass, (T,): its
    log-probabilities times ``sign`` (+1 the answer, -1 a foil)."""

    encoder: list[torch.Tensor]
    decoder: list[torch.Tensor]
    cross: list[torch.Tensor]
    steps_T: torch.Tensor
    sign: float


def generate_answer(loaded: LoadedModel, example: SegmentExample, template: str, steps: int) -> str:
    """The model's greedy continuation of ``steps`` tokens after the full prompt, as text
    (special tokens left out); it is explained as the tokenizer tokenises that text, which
    may split it otherwise than the model generated it (``"\n\n"`` as one token or two)."""
    prompt = template.format(context=example.context(), query=example.query)
    ids = loaded.tokenizer(prompt, return_tensors="pt")["input_ids"].to(loaded.device)
    with torch.no_grad(), loaded.fast_attention():
        out = loaded.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=loaded.tokenizer.pad_token_id,
        )
    # A decoder-only model returns the prompt and the answer; an encoder-decoder one the start
    # token and the answer (perhaps a forced first token, special like the start token).
    generated = out[0, 1 if loaded.is_seq2seq else ids.shape[1] :]
    return loaded.tokenizer.decode(generated, skip_special_tokens=True)


class SegmentScorer:
    """One example's prompt, its answer, and its scores under ablations.

    Constructing it checks the example (one line naming it, a UsageError): no empty segment,
    every segment with a token of its own, an answer that tokenises the same after the prompt
    as alone, and a prompt plus answer within the model's length.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        example: SegmentExample,
        template: str = DEFAULT_TEMPLATE,
        batch_size: int = 8,
    ) -> None:
        if example.answer is None:
            raise ValueError("generate the answer first (generate_answer)")
        self.loaded = loaded
        self.example = example
        self.template = template
        self.batch_size = batch_size
        self.memo: dict[bytes, np.ndarray] = {}
        self.forward_tokens = 0  # tokens run through the model: a cost the benchmarks read
        tokenizer = loaded.tokenizer
        where = f"example {example.id!r}"
        empty = [i for i, s in enumerate(example.segments) if not s.strip()]
        if not example.segments:
            raise UsageError(f"{where} has no segment")
        if empty:
            raise UsageError(f"{where}: segment {empty[0]} is empty")
        prompt = self.prompt()
        encoded = tokenizer(prompt, return_offsets_mapping=True)
        self.prompt_ids: list[int] = list(encoded["input_ids"])
        self.answer_ids = self._continuation_ids("answer", example.answer, prompt, where)
        self.foil_ids: list[int] | None = None
        if example.foil is not None:
            if example.foil == example.answer:
                raise UsageError(
                    f"{where}: the foil equals the answer ({example.answer!r}), whose "
                    "contrastive score would be 0; choose another foil"
                )
            self.foil_ids = self._continuation_ids("foil", example.foil, prompt, where)
        self.token_segments = self._token_segments(prompt, encoded["offset_mapping"])
        count = len(example.segments)
        if count > len(self.prompt_ids):
            raise UsageError(
                f"{where} has more segments ({count}) than prompt tokens ({len(self.prompt_ids)})"
            )
        owned = set(self.token_segments.tolist())
        lacking = [i for i in range(count) if i not in owned]
        if lacking:
            raise UsageError(
                f"{where}: segment {lacking[0]} ({example.segments[lacking[0]][:40]!r}) has no "
                "token of its own (it merges into a neighbour's tokens)"
            )

    def _continuation_ids(self, what: str, text: str, prompt: str, where: str) -> list[int]:
        """The token ids of a continuation (the answer or the foil) after ``prompt``, checked:
        at least one token, the same ids after the prompt as alone, within the length limit."""
        tokenizer = self.loaded.tokenizer
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise UsageError(f"{where}: the {what} {text!r} has no token")
        if self.loaded.is_seq2seq:  # the prompt is the encoder's, the continuation the decoder's
            total, joined = max(len(self.prompt_ids), len(ids) + 1), f"prompt or {what}"
        else:
            joint = tokenizer(prompt + text)["input_ids"]
            if list(joint) != self.prompt_ids + ids:
                raise UsageError(
                    f"{where}: the {what} {text!r} tokenises differently after the prompt than "
                    "alone (a token merges across the boundary); start it with a space or end "
                    "the query where a token ends"
                )
            total, joined = len(joint), f"prompt plus {what}"
        limit = self.loaded.max_length
        if total > limit:
            raise UsageError(
                f"{where}: {joined} is {total} tokens, longer than the model's limit of {limit}"
            )
        return ids

    @property
    def count(self) -> int:
        return len(self.example.segments)

    @property
    def continuations(self) -> list[tuple[list[int], float]]:
        """The explained continuations and their signs: the answer (+1), then the foil (-1)
        of a contrastive example."""
        both = [(self.answer_ids, 1.0)]
        return both if self.foil_ids is None else [*both, (self.foil_ids, -1.0)]

    @property
    def step_count(self) -> int:
        """The terms of the score, T: the answer's tokens (and the foil's, when contrastive)."""
        return sum(len(ids) for ids, _ in self.continuations)

    @property
    def prefix_count(self) -> int:
        """The continuation tokens that are inputs of later steps: each continuation's but
        its last (the columns of a step x prefix matrix)."""
        return sum(len(ids) - 1 for ids, _ in self.continuations)

    def prompt(self, keep: Sequence[bool] | None = None) -> str:
        context = self.example.context(None if keep is None else tuple(keep))
        return self.template.format(context=context, query=self.example.query)

    def _token_segments(self, prompt: str, offsets: Sequence[tuple[int, int]]) -> np.ndarray:
        """Per prompt token, the segment holding its last character; -1 outside the context."""
        start = self.template.format(context=_MARK, query=self.example.query).index(_MARK)
        bounds, position = [], start
        for segment in self.example.segments:
            bounds.append((position, position + len(segment)))
            position += len(segment) + len(self.example.separator)
        owner = np.full(len(offsets), -1)
        for t, (a, b) in enumerate(offsets):
            if b <= a:
                continue
            for s, (lo, hi) in enumerate(bounds):
                if lo <= b - 1 < hi:
                    owner[t] = s
                    break
        return owner

    def ids(self, keep: Sequence[bool] | None = None) -> list[int]:
        """The token ids of the prompt with the kept segments, then the answer's (an
        encoder-decoder model: the prompt's alone, the encoder's input)."""
        prompt = self._prompt_ids(keep)
        return prompt if self.loaded.is_seq2seq else prompt + self.answer_ids

    def _prompt_ids(self, keep: Sequence[bool] | None = None) -> list[int]:
        if keep is None:
            return self.prompt_ids
        return list(self.loaded.tokenizer(self.prompt(keep))["input_ids"])

    def _decoder_inputs(self, rows: int, continuation: list[int] | None = None) -> torch.Tensor:
        """An encoder-decoder model's decoder input: a continuation (the answer by default)
        shifted right after the start token, the same for every row, (rows, T)."""
        ids = self.answer_ids if continuation is None else continuation
        labels = torch.tensor([ids], device=self.loaded.device)
        return self.loaded.model.prepare_decoder_input_ids_from_labels(labels=labels).expand(
            rows, -1
        )

    def _seq2seq_log_probs(self, logits_XTV: torch.Tensor, continuation: list[int]) -> torch.Tensor:
        """Per row, a continuation's log-probability at each step from the decoder's logits."""
        ids = torch.as_tensor(continuation, device=logits_XTV.device)
        logits = logits_XTV if logits_XTV.dtype == torch.float64 else logits_XTV.float()
        log_probs = torch.log_softmax(logits, -1)
        return log_probs.gather(-1, ids.expand(len(logits), -1)[..., None])[..., 0]

    def _log_probs(
        self, hidden_XND: torch.Tensor, rows: Sequence[int], continuation: list[int]
    ) -> torch.Tensor:
        """Per row, a continuation's log-probability at each step, (X, T), from the last hidden
        states of sequences whose continuation ends at column ``rows[x]`` (exclusive)."""
        T = len(continuation)
        steps = torch.arange(T, device=hidden_XND.device)
        ends = torch.as_tensor(list(rows), device=hidden_XND.device)
        columns_XT = ends[:, None] - T - 1 + steps  # the positions that predict each token
        picked = hidden_XND[torch.arange(len(rows))[:, None], columns_XT]
        logits = self.loaded.model.get_output_embeddings()(picked)
        ids = torch.as_tensor(continuation, device=logits.device)
        log_probs = torch.log_softmax(
            logits if logits.dtype == torch.float64 else logits.float(), -1
        )
        return log_probs.gather(-1, ids.expand(len(rows), T)[..., None])[..., 0]

    def _run(self, prompts: list[list[int]]) -> np.ndarray:
        """Per-step log-probabilities, (X, T), after whole prompts: each continuation's, signed
        and side by side; right-padded batches."""
        return np.concatenate(
            [sign * self._run_one(prompts, ids) for ids, sign in self.continuations], axis=1
        )

    def _run_one(self, prompts: list[list[int]], continuation: list[int]) -> np.ndarray:
        """A continuation's per-step log-probabilities after each prompt, (X, T)."""
        model = self.loaded.model
        seq2seq = self.loaded.is_seq2seq
        sequences = prompts if seq2seq else [p + continuation for p in prompts]
        out = []
        for first in range(0, len(sequences), self.batch_size):
            chunk = sequences[first : first + self.batch_size]
            width = max(map(len, chunk))
            pad = self.loaded.tokenizer.pad_token_id or 0
            ids = torch.tensor([s + [pad] * (width - len(s)) for s in chunk])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in chunk])
            self.forward_tokens += sum(map(len, chunk))
            if seq2seq:
                with torch.no_grad(), self.loaded.fast_attention():
                    logits = model(
                        input_ids=ids.to(self.loaded.device),
                        attention_mask=mask.to(self.loaded.device),
                        decoder_input_ids=self._decoder_inputs(len(chunk), continuation),
                        use_cache=False,
                    ).logits
                out.append(self._seq2seq_log_probs(logits, continuation).cpu())
                continue
            with torch.no_grad(), self.loaded.fast_attention():
                hidden = model.base_model(
                    input_ids=ids.to(self.loaded.device),
                    attention_mask=mask.to(self.loaded.device),
                    use_cache=False,
                ).last_hidden_state
                ends = [len(s) for s in chunk]
                out.append(self._log_probs(hidden, ends, continuation).cpu())
        return torch.cat(out).double().numpy()

    def steps(self, masks_MS: np.ndarray) -> np.ndarray:
        """The score's per-step terms with each mask's segments kept, (M, T): the answer's
        log-probabilities (then the foil's, negated); masks already scored come from ``memo``,
        the others run together."""
        masks_MS = np.asarray(masks_MS, dtype=bool).reshape(-1, self.count)
        keys = [m.tobytes() for m in masks_MS]
        missing = list(dict.fromkeys(k for k in keys if k not in self.memo))
        if missing:
            masks = [np.frombuffer(k, dtype=bool) for k in missing]
            values = self._run([self._prompt_ids(m.tolist()) for m in masks])
            self.memo.update(zip(missing, values, strict=True))
        return np.stack([self.memo[k] for k in keys])

    def scores(self, masks_MS: np.ndarray) -> np.ndarray:
        """The score with each mask's segments kept, (M,): the answer's log-probability (minus
        the foil's)."""
        return self.steps(masks_MS).sum(axis=1)

    @property
    def full_score(self) -> float:
        return float(self.scores(np.ones((1, self.count), dtype=bool))[0])

    def leave_one_out(self, cached: bool = True) -> np.ndarray:
        """Per segment, the score's per-step terms without it, (S, T).

        ``cached``: per continuation, the full prompt and it run once with a key-value cache;
        for each segment, from the last to the first, the cache is cut back to the tokens the
        ablated sequence shares with the full one and only the rest runs. Otherwise each
        ablated prompt runs whole. Either way the results enter ``memo``.
        """
        masks = ~np.eye(self.count, dtype=bool)
        if not cached or self.loaded.is_seq2seq:  # a bidirectional encoder shares no prefix
            return self.steps(masks)
        prompts = [self._prompt_ids(mask.tolist()) for mask in masks]
        full_T, without_ST = (
            np.concatenate(parts, axis=-1)
            for parts in zip(
                *(
                    (sign * full, sign * without)
                    for ids, sign in self.continuations
                    for full, without in [self._cached_leave_one_out(prompts, ids)]
                ),
                strict=True,
            )
        )
        self.memo.setdefault(np.ones(self.count, dtype=bool).tobytes(), full_T)
        for s in range(self.count):
            self.memo.setdefault(masks[s].tobytes(), without_ST[s])
        return without_ST

    def _cached_leave_one_out(
        self, prompts: list[list[int]], continuation: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """A continuation's per-step log-probabilities after the full prompt, (T,), and after
        each prompt of ``prompts`` (the full one less segment s), (S, T), through the cache."""
        full = self.prompt_ids + continuation
        model = self.loaded.model.base_model
        device = self.loaded.device
        results: dict[int, np.ndarray] = {}
        with torch.no_grad(), self.loaded.fast_attention():
            out = model(input_ids=torch.tensor([full], device=device), use_cache=True)
            self.forward_tokens += len(full)
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            keyword = _cache_keyword(model)
            valid = len(full)  # leading cache positions holding the full sequence's tokens
            full_T = self._log_probs(out.last_hidden_state, [len(full)], continuation)[0]
            for s in reversed(range(self.count)):
                ids = prompts[s] + continuation
                shared = _common_prefix(full, ids)
                keep = min(shared, valid, len(ids) - len(continuation) - 1)
                current = cache.get_seq_length()
                if current > keep:
                    cache.crop(keep - current)  # a negative count: transformers 4 and 5 agree
                suffix = torch.tensor([ids[keep:]], device=device)
                positions = torch.arange(keep, len(ids), device=device)[None]
                self.forward_tokens += len(ids) - keep
                out = model(
                    input_ids=suffix,
                    position_ids=positions,
                    use_cache=True,
                    **{keyword: cache},
                )
                values = self._log_probs(out.last_hidden_state, [len(ids) - keep], continuation)
                results[s] = values[0].cpu().double().numpy()
                valid = shared
        without = np.stack([results[s] for s in range(self.count)])
        return full_T.cpu().double().numpy(), without

    def embedded(self) -> tuple[torch.Tensor, ...]:
        """The inputs gradient methods attribute to, each (1, n, D), as the model embeds them
        itself: a causal model's one sequence (the prompt, then the answer); an encoder-decoder
        model's encoder input (the prompt) and decoder input (the start token, then the
        answer's tokens but the last), each as its stack takes it (``_stack_embedding``). A
        contrastive example adds the foil's input: a causal model's foil tokens (they follow
        the same prompt embeddings), an encoder-decoder model's second decoder input."""
        device = self.loaded.device
        model = self.loaded.model
        if not self.loaded.is_seq2seq:
            embed = model.get_input_embeddings()
            sequences = [self.ids()] + ([self.foil_ids] if self.foil_ids is not None else [])
            return tuple(embed(torch.tensor([ids], device=device)).detach() for ids in sequences)
        prompt = torch.tensor([self.prompt_ids], device=device)
        source = _stack_embedding(model.get_encoder(), prompt)
        targets = [
            _stack_embedding(
                model.get_decoder(),
                self._decoder_inputs(1, ids),
                lambda: model.get_encoder()(input_ids=prompt).last_hidden_state,
            ).detach()
            for ids, _ in self.continuations
        ]
        return (source.detach(), *targets)

    def attention_maps(self, continuation: int = 0, graph: bool = False) -> AttentionMaps:
        """An encoder-decoder model's attention probabilities over the full prompt and a
        continuation (``continuations[continuation]``: 0 the answer, 1 a contrastive example's
        foil), one forward pass (eager attention, as the model loads): per layer (1, H, n, m).
        ``graph``: run from ``embedded()``'s inputs with autograd on, so that the score's terms
        of that continuation (``steps_T``, signed) can be differentiated with respect to the
        maps."""
        if not self.loaded.is_seq2seq:
            raise RuntimeError("attention_maps reads an encoder-decoder model's three attentions")
        ids, sign = self.continuations[continuation]
        model = self.loaded.model
        if graph:
            embedded = self.embedded()
            source, target = embedded[0], embedded[1 + continuation]
            source.requires_grad_()
            target.requires_grad_()
            inputs = {"inputs_embeds": source, "decoder_inputs_embeds": target}
        else:
            inputs = {
                "input_ids": torch.tensor([self.prompt_ids], device=self.loaded.device),
                "decoder_input_ids": self._decoder_inputs(1, ids),
            }
        with torch.set_grad_enabled(graph):
            out = model(**inputs, output_attentions=True, use_cache=False)
        return AttentionMaps(
            list(out.encoder_attentions),
            list(out.decoder_attentions),
            list(out.cross_attentions),
            sign * self._seq2seq_log_probs(out.logits, ids)[0],
            sign,
        )

    def steps_from_embeddings(
        self, *embeddings: torch.Tensor, only: int | None = None
    ) -> torch.Tensor:
        """The score's per-step terms, (X, T), from ``embedded()``'s inputs (perhaps scaled or
        perturbed, X rows each): the answer's log-probabilities (then the foil's, negated).
        Inputs left out (only the first given) come from the continuations' ids. ``only``: the
        terms of ``continuations[only]`` alone, from its pass alone: a contrastive example's
        gradients taken one continuation at a time keep one graph in memory, not two."""
        first = embeddings[0]
        X = first.shape[0]
        model = self.loaded.model
        chosen = [
            (c, ids, sign)
            for c, (ids, sign) in enumerate(self.continuations)
            if only is None or c == only
        ]
        terms = []
        if self.loaded.is_seq2seq:
            memory = model.get_encoder()(inputs_embeds=first)
            for c, ids, sign in chosen:
                target = (
                    {"decoder_inputs_embeds": embeddings[c + 1]}
                    if len(embeddings) > c + 1
                    else {"decoder_input_ids": self._decoder_inputs(X, ids)}
                )
                logits = model(encoder_outputs=memory, use_cache=False, **target).logits
                terms.append(sign * self._seq2seq_log_probs(logits, ids))
            return torch.cat(terms, dim=1)
        for c, ids, sign in chosen:
            if c == 0:  # the answer: the input sequence itself
                sequence = first
            else:  # the foil after the same prompt embeddings
                if len(embeddings) > 1:
                    foil = embeddings[1]
                else:
                    foil_ids = torch.tensor([ids], device=first.device)
                    foil = model.get_input_embeddings()(foil_ids).expand(X, -1, -1)
                sequence = torch.cat([first[:, : len(self.prompt_ids)], foil], dim=1)
            hidden = model.base_model(inputs_embeds=sequence, use_cache=False).last_hidden_state
            terms.append(sign * self._log_probs(hidden, [sequence.shape[1]] * X, ids))
        return torch.cat(terms, dim=1)

    def inputs_of(self, continuation: int) -> tuple[int, ...]:
        """The indices of the ``embedded()`` inputs that ``continuations[continuation]``'s pass
        reads: the prompt's sequence (a causal model's, or the encoder's source) and, but for a
        causal model's answer (its sequence is the first input), its own decoder input or foil
        tokens."""
        if continuation == 0 and not self.loaded.is_seq2seq:
            return (0,)
        return (0, continuation if not self.loaded.is_seq2seq else continuation + 1)

    def score_from_embeddings(
        self, *embeddings: torch.Tensor, only: int | None = None
    ) -> torch.Tensor:
        """The score, (X,): what gradient methods differentiate (``only``: one continuation's
        part of it, as ``steps_from_embeddings``)."""
        return self.steps_from_embeddings(*embeddings, only=only).sum(dim=1)

    def answer_columns(self, tokens: Sequence[np.ndarray]) -> np.ndarray:
        """From token scores over ``embedded()``'s inputs, (Y, n) each, those of the answer's
        tokens but the last as inputs, then the foil's, (Y, prefix_count): the continuation
        prefix, kept apart from the segments."""
        T = len(self.answer_ids)
        if self.loaded.is_seq2seq:  # each decoder input: the start token, then c_0..c_{T-2}
            parts = [
                np.asarray(tokens[c])[:, 1 : len(ids)]
                for c, (ids, _) in enumerate(self.continuations, start=1)
            ]
        else:
            start = len(self.prompt_ids)
            parts = [np.asarray(tokens[0])[:, start : start + T - 1]]
            if self.foil_ids is not None:
                parts.append(np.asarray(tokens[1])[:, : len(self.foil_ids) - 1])
        return np.concatenate(parts, axis=1)

    def to_segments(self, tokens_YN: np.ndarray) -> np.ndarray:
        """Token scores over the prompt (and perhaps the answer after it), (Y, N), summed over
        each segment's tokens, (Y, S): the stated rule for a token method's segment score."""
        owner_P = self.token_segments
        prompt_YP = np.asarray(tokens_YN)[:, : len(owner_P)]
        return np.stack([prompt_YP[:, owner_P == s].sum(axis=1) for s in range(self.count)], 1)


#: Per encoder or decoder stack with an ``embed_scale``: whether ``inputs_embeds`` must carry
#: the scale (the stack applies it to ids only) or not (it applies it to any input).
_SCALED_INPUTS: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


def _stack_embedding(
    stack: torch.nn.Module,
    ids: torch.Tensor,
    memory: Callable[[], torch.Tensor] | None = None,
) -> torch.Tensor:
    """What an encoder or decoder stack takes as ``inputs_embeds`` to compute what it computes
    from ``ids``: its token embeddings, times its ``embed_scale`` (Marian) where the stack
    scales only the embeddings it looks up itself. transformers' Marian encoder does so and its
    decoder scales any input, so which holds is found once per stack by running it both ways
    (``memory`` gives the encoder's output, for a decoder). T5's and BART's stacks have no
    scale."""
    raw = stack.embed_tokens(ids)
    scale = getattr(stack, "embed_scale", None)
    if not scale or scale == 1.0:
        return raw
    if stack not in _SCALED_INPUTS:
        with torch.no_grad():
            extra = {} if memory is None else {"encoder_hidden_states": memory()}
            own = stack(input_ids=ids, **extra).last_hidden_state
            scaled = stack(inputs_embeds=raw * scale, **extra).last_hidden_state
        _SCALED_INPUTS[stack] = bool(torch.allclose(own, scaled))
    return raw * scale if _SCALED_INPUTS[stack] else raw


def _cache_keyword(model: torch.nn.Module) -> str:
    """How ``model.forward`` takes a key-value cache: ``cache`` from transformers 5.x on,
    ``past_key_values`` before (deprecated since)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
