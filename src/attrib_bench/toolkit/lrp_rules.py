"""The LRP rules for transformers as backward passes (docs/math/lrp.md): inside ``rules``, a
model's forward values are its own and its backward pass carries the rules of CP-LRP (Ali et
al. 2022, ``cp``) or AttnLRP (Achtibat et al. 2024, ``attn``), so gradient x input is the
relevance. The built-in ``cp-lrp`` and ``attnlrp`` (attrib_bench_plugins.gradient) use them;
a third-party LRP variant can too. The rules, as LXT's efficient mode applies them
(github.com/rachtibat/LRP-eXplains-Transformers, ``lxt.efficient``):

- norms (LayerNorm, RMSNorm): the identity rule, the normalising scale held constant in the
  backward pass (both variants);
- element-wise activations (GELU, SiLU, tanh, ...): the identity rule, relevance passed in
  proportion to f(x) / (x + 1e-10) (both variants);
- attention: ``cp-lrp`` holds the attention probabilities constant (queries and keys detached);
  ``attnlrp`` divides the relevance at the queries and keys by 4 and at the values by 2 (the
  uniform rule for the two matrix products);
- a gated feed-forward block (LLaMA's ``act(gate(x)) * up(x)``): ``cp-lrp`` holds the gate
  constant; ``attnlrp`` applies the identity rule to the activation and halves the relevance of
  the product (the uniform rule).

Dropout is off (evaluation mode). The rules apply inside a context that restores every module,
and the attention runs under PyTorch's scaled-dot-product kernel behind a registered
implementation name, so any family whose attention goes through transformers' attention
interface is covered. LRP is patented; LXT's authors state it is free for personal and
scientific use (docs/methods.md).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from attrib_bench.core.errors import UsageError

#: LXT's stabiliser of the identity rule's ratio f(x) / (x + eps).
IDENTITY_EPSILON = 1e-10
#: The attention implementation name the rules register with transformers.
IMPLEMENTATION = "attrib_bench_lrp"
#: While a ``rules`` block is open: its variant, and how many attention calls took the rules.
_ACTIVE: list[dict[str, Any]] = []


class _IdentityRule(torch.autograd.Function):
    """f(x) forward; backward, the incoming gradient times f(x) / (x + eps)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: Any) -> torch.Tensor:
        out = fn(x)
        ctx.save_for_backward(out / (x + IDENTITY_EPSILON))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return grad * ratio, None


class _Uniform(torch.autograd.Function):
    """The identity forward; backward, the incoming gradient divided by ``factor``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad / ctx.factor, None


def _layer_norm(self: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    std = ((x - mean) ** 2).mean(dim=-1, keepdim=True).add(self.eps).sqrt()
    y = (x - mean) / std.detach()
    if self.weight is not None:
        y = y * self.weight
    return y + self.bias if self.bias is not None else y


def _rms_norm(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
    dtype = x.dtype
    x32 = x.to(torch.float32)  # as LLaMA's RMSNorm computes
    scale = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return self.weight * (x32 * scale.detach()).to(dtype)


def _activation(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return _IdentityRule.apply(x, self._lrp_original)


def _gated(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    gate = self.gate_proj(x)
    if _ACTIVE[-1]["variant"] == "cp":
        return self.down_proj(self.act_fn(gate.detach()) * self.up_proj(x))
    return self.down_proj(_Uniform.apply(self.act_fn(gate) * self.up_proj(x), 2.0))


def _is_activation(module: nn.Module) -> bool:
    torch_activations = (nn.GELU, nn.SiLU, nn.Tanh, nn.ReLU, nn.Sigmoid, nn.Mish)
    return isinstance(module, torch_activations) or type(module).__module__ == (
        "transformers.activations"
    )


def _attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _ACTIVE[-1]["calls"] += 1
    if _ACTIVE[-1]["variant"] == "cp":
        query, key = query.detach(), key.detach()
    else:
        query, key = _Uniform.apply(query, 4.0), _Uniform.apply(key, 4.0)
        value = _Uniform.apply(value, 2.0)
    kwargs["dropout"] = 0.0
    return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    """Register the rules' attention (and sdpa's masks) under ``IMPLEMENTATION``, once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if IMPLEMENTATION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(IMPLEMENTATION, _attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


@contextmanager
def rules(model: nn.Module, variant: str) -> Iterator[dict[str, Any]]:
    """``model`` with the ``variant``'s (``cp`` or ``attn``) backward rules inside the block;
    every module and the attention implementation restored afterwards, also on error. Yields
    the block's record: ``calls`` counts the attention calls that took the rules. A norm the
    rules do not know is a UsageError, before anything is patched."""
    _register()
    unknown = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if type(m).__name__.endswith("Norm")
            and not isinstance(m, nn.LayerNorm)
            and not type(m).__name__.endswith("RMSNorm")
        }
    )
    if unknown:
        raise UsageError(
            f"the LRP rules know LayerNorm and RMSNorm, not {', '.join(unknown)} of "
            f"{model.config.model_type}"
        )
    patched = []
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            forward = _layer_norm
        elif type(module).__name__.endswith("RMSNorm"):
            forward = _rms_norm
        elif all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            forward = _gated
        elif _is_activation(module):
            module._lrp_original = module.forward
            forward = _activation
        else:
            continue
        module.forward = types.MethodType(forward, module)
        patched.append(module)
    previous = model.config._attn_implementation
    record = {"variant": variant, "calls": 0}
    _ACTIVE.append(record)
    try:
        model.set_attn_implementation(IMPLEMENTATION)
        yield record
    finally:
        _ACTIVE.pop()
        model.set_attn_implementation(previous)
        for module in patched:
            del module.forward
            module.__dict__.pop("_lrp_original", None)
