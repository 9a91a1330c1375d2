"""Which attention implementation a pass runs: eager where attention probabilities are read,
PyTorch's scaled-dot-product attention (sdpa) everywhere else.

Every model loads with eager attention, the only implementation that returns attention
probabilities. The passes that read none (gradients, Integrated Gradients, perturbations,
erasures and the evaluators' other re-runs, a trace capturing no attentions) run the same
function faster and in less memory under sdpa, which never holds a (B, H, N, N) tensor: Integrated
Gradients' plain-torch floor on 255-token movie reviews took 104 s under sdpa against 153 s
eager (issue 29). The switch is transformers' ``set_attn_implementation``, made for the pass and
undone after it (well under a millisecond each way). A model whose class has no sdpa, or a
transformers version without the switch, stays eager: nothing but the speed changes.

sdpa and eager compute the same attention in a different order of float operations (one fused
kernel against softmax(QK^T / sqrt(d)) V step by step): their results agree to the last bits,
about 1e-7 relative in float32 and 1e-15 in float64, not bit for bit. LLaMA-family eager
attention takes its softmax in float32 even in a float64 model, so there the two differ at
float32's precision.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from weakref import WeakKeyDictionary

from torch import nn

#: The implementation of passes that read no attention probabilities.
FAST = "sdpa"
#: The implementation that returns attention probabilities, which every model loads with.
EAGER = "eager"

#: Per model, whether it can switch to FAST: checked once, so that a model that cannot is not
#: asked again (transformers logs a warning each time).
_CAN_SWITCH: WeakKeyDictionary[nn.Module, bool] = WeakKeyDictionary()


def current(model: nn.Module) -> str:
    """The attention implementation ``model`` runs now."""
    return model.config._attn_implementation


def _can_switch(model: nn.Module) -> bool:
    """Whether ``model`` can run FAST: its class supports sdpa and switching at run time (the
    functional attention interface of transformers >= 4.5x). Tried once, then restored."""
    if model not in _CAN_SWITCH:
        can = getattr(model, "_can_set_attn_implementation", None)
        supported = False
        if callable(can) and can() and hasattr(model, "set_attn_implementation"):
            previous = current(model)
            try:
                model.set_attn_implementation(FAST)
                supported = current(model) == FAST
            except (ValueError, ImportError):  # the class has no sdpa
                supported = False
            finally:
                model.set_attn_implementation(previous)
        _CAN_SWITCH[model] = supported
    return _CAN_SWITCH[model]


@contextmanager
def attention_implementation(model: nn.Module, implementation: str) -> Iterator[str]:
    """Run ``model`` with ``implementation`` (FAST or EAGER) inside the block and restore the
    one it ran before afterwards, also when the block raises. Yields the implementation in
    effect: EAGER where FAST is asked of a model that cannot run it. Nested blocks restore in
    turn, so an eager trace inside a fast block still gets attention probabilities."""
    previous = current(model)
    if previous == implementation or (implementation == FAST and not _can_switch(model)):
        yield previous
        return
    model.set_attn_implementation(implementation)
    try:
        yield implementation
    finally:
        model.set_attn_implementation(previous)
