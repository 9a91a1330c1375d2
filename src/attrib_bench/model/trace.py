"""One traced forward pass per batch: the single source of model internals for attributors.

The runner asks for the union of what its attributors declare in ``requires`` and captures only
that. Attributors read the trace; they never rerun the model for what the forward pass produced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from attrib_bench.errors import UsageError
from attrib_bench.interfaces import Batch
from attrib_bench.model.architectures import EncoderAdapter

if TYPE_CHECKING:  # model.load imports transformers: not needed to read a trace's type
    from attrib_bench.model.load import LoadedModel

#: What a trace can hold; an attributor's ``requires`` is a subset of these.
TRACE_FIELDS = frozenset({"attentions", "hidden_states", "values", "pre_layernorm"})


@dataclass
class Trace:
    """Internals of one batch, all detached and on the model's device.

    - ``logits_BC``: always present (every method needs the predicted class).
    - ``hidden_states``: L + 1 tensors (B, N, D); ``hidden_states[l]`` is the input of layer
      l + 1 (``hidden_states[0]`` is the embedding output).
    - ``attentions``: L tensors (B, H, N, K) of attention probabilities.
    - ``values``: L tensors (B, N, H*E): value vectors x W_V + b_V.
    - ``pre_ln1`` / ``pre_ln2``: L tensors (B, N, D): the inputs of each layer's two LayerNorms.
    - ``shared``: a per-batch memo so methods of one family compute shared pieces once.
    """

    batch: Batch
    loaded: LoadedModel
    logits_BC: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] = ()
    attentions: tuple[torch.Tensor, ...] = ()
    values: tuple[torch.Tensor, ...] = ()
    pre_ln1: tuple[torch.Tensor, ...] = ()
    pre_ln2: tuple[torch.Tensor, ...] = ()
    shared: dict[str, Any] = field(default_factory=dict)
    #: The run's seed, for methods with randomness (baselines, sampling).
    seed: int = 0
    #: Seconds spent computing each memo entry, and the entries read since ``reset_access``.
    memo_seconds: dict[str, float] = field(default_factory=dict)
    accessed: set[str] = field(default_factory=set)

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.model

    @property
    def adapter(self) -> EncoderAdapter:
        return self.loaded.adapter

    @property
    def num_layers(self) -> int:
        return self.loaded.model.config.num_hidden_layers

    @property
    def predicted_B(self) -> torch.Tensor:
        return self.logits_BC.argmax(dim=-1)

    @property
    def mask_BN(self) -> torch.Tensor:
        return self.batch.attention_mask_BN

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """Return ``shared[key]``, computing it on first use within this batch.

        Its compute time is recorded so that every method reading it is charged the same
        standalone cost, whichever of them happened to run first.
        """
        if key not in self.shared:
            start = time.perf_counter()
            self.shared[key] = compute()
            self.memo_seconds[key] = time.perf_counter() - start
        self.accessed.add(key)
        return self.shared[key]

    def standalone_seconds(self, elapsed: float, computed_before: set[str]) -> float:
        """A method's cost as if run alone: its own time plus every shared piece it read."""
        computed_now = set(self.memo_seconds) - computed_before
        own = elapsed - sum(self.memo_seconds[k] for k in computed_now)
        return own + sum(self.memo_seconds[k] for k in self.accessed)

    def need(self, name: str) -> tuple[torch.Tensor, ...]:
        """A captured field, or a clear error when the attributor forgot to declare it."""
        captured = getattr(self, name)
        if not captured:
            raise RuntimeError(
                f"trace field {name!r} was not captured: add it to the attributor's `requires`"
            )
        return captured


def trace_batch(loaded: LoadedModel, batch: Batch, requires: Iterable[str], seed: int = 0) -> Trace:
    """Run the model once on ``batch`` and capture the fields in ``requires``."""
    needed = set(requires)
    unknown = needed - TRACE_FIELDS
    if unknown:
        raise UsageError(
            f"unknown trace fields {sorted(unknown)}; valid: {', '.join(sorted(TRACE_FIELDS))}"
        )
    captured: dict[str, list[torch.Tensor]] = {"values": [], "pre_ln1": [], "pre_ln2": []}
    handles = []
    try:
        if needed & {"values", "pre_layernorm"}:
            adapter = loaded.adapter
            for layer in range(len(adapter.layers)):
                if "values" in needed:
                    handles.append(
                        adapter.module(layer, "value").register_forward_hook(
                            lambda _m, _i, out: captured["values"].append(out.detach())
                        )
                    )
                if "pre_layernorm" in needed:
                    for part, key in (("ln1", "pre_ln1"), ("ln2", "pre_ln2")):
                        handles.append(
                            adapter.module(layer, part).register_forward_pre_hook(
                                lambda _m, args, key=key: captured[key].append(args[0].detach())
                            )
                        )
        with torch.no_grad():
            out = loaded.model(
                **batch.model_inputs(),
                output_attentions="attentions" in needed,
                output_hidden_states=bool(needed & {"hidden_states", "values", "pre_layernorm"}),
            )
    finally:
        for handle in handles:
            handle.remove()
    return Trace(
        batch=batch,
        loaded=loaded,
        logits_BC=out.logits.detach(),
        hidden_states=tuple(out.hidden_states or ()),
        attentions=tuple(out.attentions or ()),
        values=tuple(captured["values"]),
        pre_ln1=tuple(captured["pre_ln1"]),
        pre_ln2=tuple(captured["pre_ln2"]),
        seed=seed,
    )
