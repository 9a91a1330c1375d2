"""Erasure shared by the erasure-based evaluators (faithfulness, leave-one-out, soft
faithfulness) and the seeded random scores: which tokens may be erased, how an erased input is
built and run, and the score f they compare before and after."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from attrib_bench.core.errors import UsageError

if TYPE_CHECKING:
    from attrib_bench.core.interfaces import Batch
    from attrib_bench.core.trace import Trace

REMOVALS = ("auto", "mask", "pad", "zero", "zero-word", "delete", "retokenize")
#: The removals applied by a hook that zeroes an embedding module's output (``forward_erased``):
#: ``zero`` the embedding module's (``LoadedModel.embeddings``: an encoder's after its position
#: and token-type embeddings are added and its LayerNorm), ``zero-word`` the word (token)
#: embeddings' (``get_input_embeddings()``), before anything is added to them. The two are the
#: same module for a language model and a model without a spec.
ZEROING = ("zero", "zero-word")

#: Where erased predictions are kept within one batch's trace, shared by every evaluator here.
CACHE_KEY = "faithfulness.erased_log_probabilities"
#: Beside it, each erased prediction's log normaliser log Z = logsumexp of its target-position
#: logits (float64), one float a key: a class's logit is log p + log Z (``explained_logits``),
#: which the log-probabilities alone cannot give back.
NORMALISER_KEY = "faithfulness.erased_log_normalisers"
#: Erasures announced for the batch and not run yet (``plan_erasures``).
PENDING_KEY = "faithfulness.erasures_planned"
#: How many erased inputs ``erased_log_probs`` ran on the batch (a count for the
#: meta-evaluation's cost: attrib_bench.runner.meta).
RUN_COUNT_KEY = "faithfulness.erased_inputs_run"


def candidates(trace: Trace) -> np.ndarray:
    """(B, N) True at the tokens evaluators may perturb: real tokens that are not special."""
    batch = trace.batch
    return (batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool()).cpu().numpy()


def resolve_removal(removal: str, tokenizer) -> str:
    """``auto``: ``mask`` with a tokenizer that has a mask token (the encoders), else ``delete``
    (decoders have none): a causal LM reads the shortened prefix as text, where a pad (EOS)
    token or a zero vector inside it is an input it never saw."""
    has_mask = tokenizer.mask_token_id is not None
    if removal == "auto":
        return "mask" if has_mask else "delete"
    if removal == "mask" and not has_mask:
        raise UsageError(
            "removal=mask needs a tokenizer with a mask token; use removal=auto, pad, zero "
            "or delete"
        )
    return removal


def _start_token(tokenizer) -> int:
    """What an empty context is read as: BOS, or the pad token for a tokenizer without one."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id


def retokenized(
    inputs: dict[str, torch.Tensor], erase_VN: torch.Tensor, special_VN: torch.Tensor, tokenizer
) -> dict[str, torch.Tensor]:
    """ferret's deletion: the kept tokens decoded to text (``tokenizer.decode``, its defaults)
    and the text tokenised again, special tokens added anew, so that word pieces left side by
    side may merge and the token count may change.

    The texts are the runs of real non-special tokens (a pair's two texts are two runs, encoded
    again as a pair; ferret decodes a pair as one string, its middle separator included).
    """
    texts: list[list[str]] = []
    for ids_N, real_N, special_N, erased_N in zip(
        inputs["input_ids"].tolist(),
        inputs["attention_mask"].bool().tolist(),
        special_VN.bool().tolist(),
        erase_VN.bool().tolist(),
        strict=True,
    ):
        runs: list[list[int]] = []
        inside = False
        for token, real, special, erased in zip(ids_N, real_N, special_N, erased_N, strict=True):
            if not real or special:
                inside = False
                continue
            if not inside:
                runs.append([])
                inside = True
            if not erased:
                runs[-1].append(token)
        if len(runs) > 2:
            raise ValueError(f"removal=retokenize: an input of {len(runs)} texts (at most a pair)")
        texts.append([tokenizer.decode(run) for run in runs] or [""])
    firsts = [parts[0] for parts in texts]
    pairs = [parts[1] if len(parts) > 1 else "" for parts in texts]
    encoded = tokenizer(
        firsts,
        *([pairs] if any(len(parts) > 1 for parts in texts) else []),
        padding=True,
        truncation=True,
        return_tensors="pt",
    )
    device = inputs["input_ids"].device
    out = {name: encoded[name].to(device) for name in inputs if name in encoded}
    empty_V = out["attention_mask"].sum(dim=1) == 0  # a decoder's empty text: no token at all
    out["input_ids"][empty_V, 0] = _start_token(tokenizer)
    out["attention_mask"][empty_V, 0] = 1
    return out


def round_trip_restores(trace: Trace) -> np.ndarray:
    """(B,) True where ``retokenized`` with nothing erased gives back the example's own input,
    token for token: erasing nothing under ``removal=retokenize`` is then the input itself and
    needs no model call (ferret runs one). Computed once per batch (``trace.memo``)."""

    def compute() -> np.ndarray:
        batch = trace.batch
        inputs = batch.model_inputs()
        nothing_BN = torch.zeros_like(batch.input_ids_BN, dtype=torch.bool)
        tokenizer = trace.loaded.tokenizer
        again = retokenized(inputs, nothing_BN, batch.special_tokens_mask_BN, tokenizer)
        same = []
        for b in range(len(batch.examples)):
            real, real_again = inputs["attention_mask"][b].bool(), again["attention_mask"][b].bool()
            same.append(
                all(
                    torch.equal(inputs[name][b][real], again[name][b][real_again])
                    for name in again
                    if name != "attention_mask"
                )
            )
        return np.array(same, dtype=bool)

    return trace.memo("erasure.round_trip_restores", compute)


def erase(
    inputs: dict[str, torch.Tensor],
    erase_VN: torch.Tensor,
    removal: str,
    tokenizer,
    special_VN: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Model inputs with the marked tokens erased (``zero`` and ``zero-word`` are applied by a
    hook instead: ``forward_erased``).

    Replacements keep the other inputs, ``position_ids`` included; ``delete`` re-packs the
    sequence and leaves its positions to the model. An input with every token deleted (a
    decoder's has no special token to keep) is the empty context, which a language model reads
    as its start token alone: BOS, or the pad token for a tokenizer without one.
    ``retokenize`` (see ``retokenized``) needs the special-token mask ``special_VN``.
    """
    ids = inputs["input_ids"]
    if removal == "retokenize":
        if special_VN is None:
            raise ValueError("removal=retokenize needs the special-token mask")
        return retokenized(inputs, erase_VN, special_VN, tokenizer)
    if removal in ("mask", "pad"):
        token_id = tokenizer.mask_token_id if removal == "mask" else tokenizer.pad_token_id
        return {**inputs, "input_ids": torch.where(erase_VN, token_id, ids)}
    if removal in ZEROING:
        return inputs
    kept_VN = inputs["attention_mask"].bool() & ~erase_VN
    order = torch.sort((~kept_VN).to(torch.int32), dim=1, stable=True).indices  # kept first
    length = max(1, int(kept_VN.sum(dim=1).max()))
    kept = kept_VN.gather(1, order)[:, :length]
    ids = torch.where(kept, ids.gather(1, order)[:, :length], tokenizer.pad_token_id)
    empty_V = ~kept.any(dim=1)
    ids[empty_V, 0] = _start_token(tokenizer)
    kept[empty_V, 0] = True
    out = {"input_ids": ids, "attention_mask": kept.to(inputs["attention_mask"].dtype)}
    if "token_type_ids" in inputs:
        types = inputs["token_type_ids"].gather(1, order)[:, :length]
        out["token_type_ids"] = torch.where(kept, types, 0)
    return out


def forward_erased(
    trace: Trace,
    inputs: dict,
    erase_VN: torch.Tensor,
    removal: str,
    positions_V: torch.Tensor,
    target_logits: Callable[..., torch.Tensor],
    special_VN: torch.Tensor | None = None,
    *,
    normalisers: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the erased variants, (V, C) in float64, a language model's at the
    target position: ``positions_V`` (each variant's example's) where tokens stay in place, the
    target token of the re-packed input for ``delete`` and ``retokenize`` (which needs the
    variants' special-token mask ``special_VN``). With ``normalisers``, also their log
    normalisers (V,), logsumexp of the same float64 logits: a logit is log p + log Z.

    ``zero`` and ``zero-word`` multiply the output of the embedding module (``ZEROING``) by 0
    at the erased tokens; under ``zero-word`` an encoder then adds its position and token-type
    embeddings and applies its LayerNorm to the zero vector, as to any other word embedding.

    ``target_logits`` is ``attrib_bench.model.load.target_logits``, passed in by the caller:
    the toolkit sits below the model layer and may not import it. The model runs under sdpa
    (``LoadedModel.fast_attention``): an erased input is read for its logits alone.
    """

    handle = None
    if removal in ZEROING:
        keep_VN1 = (~erase_VN)[..., None]
        loaded = trace.loaded
        module = loaded.embeddings if removal == "zero" else loaded.model.get_input_embeddings()
        handle = module.register_forward_hook(
            lambda _module, _args, output: output * keep_VN1.to(output.dtype)
        )
    erased = erase(inputs, erase_VN, removal, trace.loaded.tokenizer, special_VN)
    if removal in ("delete", "retokenize"):
        positions_V = trace.target.positions(erased["attention_mask"])
    try:
        with torch.no_grad(), trace.loaded.fast_attention():
            logits = trace.model(**erased).logits
    finally:
        if handle is not None:
            handle.remove()
    logits = target_logits(trace.loaded, logits, positions_V)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    if normalisers:
        return log_probs, torch.logsumexp(logits.double(), dim=-1)
    return log_probs


#: Removals that pack each variant to its kept tokens: a pass is padded to its longest.
PACKING = ("delete", "retokenize")
#: At most this share of a packed pass's tokens is padding (``_passes``). Low, since the batch's
#: erasures are pooled over methods and evaluators (``plan_erasures``): passes of nearly one
#: length stay large. On 100 SST-2 sentences under ferret's protocol (three methods, two
#: evaluators, batches of 16), the evaluators took 19.7 s at 0.05 against 22.5 s at 0.25 and
#: 26.1 s at 0.05 unpooled (benchmarks/ferret_speed.py's ``Floor.evaluate``, one run each).
PADDING_SHARE = 0.05


def _passes(
    keys: list[tuple[str, int, bytes]], batch: Batch, chunk_tokens: int
) -> list[list[tuple[str, int, bytes]]]:
    """The erasure keys in model passes of at most ``chunk_tokens`` tokens, padding included.

    In place, every variant has the batch's length. Packed (``PACKING``), a variant keeps its
    example's real tokens less the erased ones: sorted by that length, a pass is closed when
    the next would make it longer than the budget or more than ``PADDING_SHARE`` padding, so
    passes of nearly one length carry little padding.
    """
    if not keys or keys[0][0] not in PACKING:
        step = max(1, chunk_tokens // batch.input_ids_BN.shape[1])
        return [keys[start : start + step] for start in range(0, len(keys), step)]
    real_B = batch.attention_mask_BN.sum(dim=1).tolist()
    length = {key: real_B[key[1]] - int(np.frombuffer(key[2], dtype=bool).sum()) for key in keys}
    passes: list[list[tuple[str, int, bytes]]] = []
    real = 0
    for key in sorted(keys, key=length.__getitem__):
        padded = (len(passes[-1]) + 1) * length[key] if passes else 0
        too_padded = padded * (1 - PADDING_SHARE) > real + length[key]
        if not passes or padded > chunk_tokens or too_padded:
            passes.append([])
            real = 0
        passes[-1].append(key)
        real += length[key]
    return passes


def plan_erasures(trace: Trace, keys: list[tuple[str, int, bytes]], chunk_tokens: int) -> None:
    """Announce erasure keys that will be asked for on this batch (an evaluator's ``plan``):
    the next ``erased_log_probs`` runs them together with its own, so the erasures of every
    method and evaluator share passes of similar lengths instead of each call filling its own
    small ones. Kept in ``trace.shared[PENDING_KEY]``, by the passes' token budget."""
    pending = trace.shared.setdefault(PENDING_KEY, {})
    pending.setdefault(chunk_tokens, []).extend(keys)


def erased_log_probs(
    trace: Trace,
    keys: list[tuple[str, int, bytes]],
    chunk_tokens: int,
    target_logits: Callable[..., torch.Tensor],
) -> dict:
    """The batch's shared erasure cache (``trace.shared[CACHE_KEY]``) with every key in
    ``keys`` filled: a key is (removal, example, the erased-token mask's bytes), so bins,
    evaluators and methods that erase the same tokens of an example share one model call. The
    missing ones, and those announced by ``plan_erasures``, run as batched passes of at most
    ``chunk_tokens`` tokens (an announced key: the budget it was announced with), one removal
    a pass (``forward_erased``).

    The log-probabilities are computed as they always were; each run key's log normaliser is
    kept beside them (``trace.shared[NORMALISER_KEY]``, one float a key), so that a class's
    logit can be read back (``explained_logits``). A key cached without one (a cache shared
    into another trace alone) is run again for it, its cached log-probabilities left as they
    were.
    """
    cache = trace.shared.setdefault(CACHE_KEY, {})
    normalisers = trace.shared.setdefault(NORMALISER_KEY, {})
    pending = trace.shared.pop(PENDING_KEY, {})
    pending.setdefault(chunk_tokens, []).extend(keys)
    batch = trace.batch
    inputs = batch.model_inputs()
    positions_BN = trace.loaded.position_ids(batch.input_ids_BN)
    if positions_BN is not None:
        inputs["position_ids"] = positions_BN
    device = batch.input_ids_BN.device
    for budget, announced in pending.items():
        by_removal: dict[str, list[tuple[str, int, bytes]]] = {}
        missing = (key for key in announced if key not in cache or key not in normalisers)
        for key in dict.fromkeys(missing):
            by_removal.setdefault(key[0], []).append(key)
        for removal, todo in by_removal.items():
            for chunk in _passes(todo, batch, budget):
                examples = torch.tensor([example for _, example, _ in chunk], device=device)
                erase_VN = torch.as_tensor(
                    np.stack([np.frombuffer(mask, dtype=bool) for _, _, mask in chunk]),
                    device=device,
                )
                log_probs, log_z = forward_erased(
                    trace,
                    {name: t[examples] for name, t in inputs.items()},
                    erase_VN,
                    removal,
                    trace.target_positions_B[examples],
                    target_logits,
                    batch.special_tokens_mask_BN[examples],
                    normalisers=True,
                )
                rows = zip(chunk, log_probs.cpu().numpy(), log_z.tolist(), strict=True)
                for key, values, normaliser in rows:
                    cache.setdefault(key, values)
                    normalisers[key] = normaliser
                trace.shared[RUN_COUNT_KEY] = trace.shared.get(RUN_COUNT_KEY, 0) + len(chunk)
    return cache


def explained(
    trace: Trace,
    log_probs_RBC: np.ndarray,
    target: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> np.ndarray:
    """f of each row, (R, B): p(y) of the target class, or for a contrastive target the score
    log p(y) - log p(foil), which is logit(y) - logit(foil). ``target``: the (classes, foils)
    the scored method explains (``attrib_bench.core.interfaces.scored_classes``); default the
    run's target."""
    classes, foils = (trace.target_classes_B, trace.target_foils_B) if target is None else target
    classes_B = classes.cpu().numpy()
    columns = np.arange(len(classes_B))
    chosen_RB = log_probs_RBC[:, columns, classes_B]
    if foils is None:
        return np.exp(chosen_RB)
    return chosen_RB - log_probs_RBC[:, columns, foils.cpu().numpy()]


def explained_logits(
    trace: Trace,
    log_probs_RBC: np.ndarray,
    log_normalisers_RB: np.ndarray,
    target: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> np.ndarray:
    """The target's logit of each row, (R, B): logit(y) = log p(y) + log Z (the log normaliser,
    ``NORMALISER_KEY``), or for a contrastive target the score log p(y) - log p(foil) =
    logit(y) - logit(foil), as ``explained`` reads it. ``target`` as in ``explained``."""
    classes, foils = (trace.target_classes_B, trace.target_foils_B) if target is None else target
    classes_B = classes.cpu().numpy()
    columns = np.arange(len(classes_B))
    chosen_RB = log_probs_RBC[:, columns, classes_B]
    if foils is None:
        return chosen_RB + log_normalisers_RB
    return chosen_RB - log_probs_RBC[:, columns, foils.cpu().numpy()]


def example_generator(seed: int, example_id: str) -> torch.Generator:
    """A generator seeded by (seed, example id): the scores never depend on batch companions."""
    digest = hashlib.sha256(f"{seed}:{example_id}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
