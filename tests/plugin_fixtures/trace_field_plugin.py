# --8<-- [start:example]
"""An attrib-bench plugin that adds a trace field: each layer's feed-forward activations.

Try it with ``attrib-bench run --plugin trace_field_plugin.py --attributors ffn-norm``.
"""

import torch

import attrib_bench

# Hooked on every encoder layer's `intermediate` module (BERT's layout) for the one traced
# forward pass, its output kept: L tensors (batch, tokens, intermediate size).
FFN_ACTIVATIONS = attrib_bench.TraceField(
    name="ffn_activations",
    doc="L tensors (B, N, F): each layer's feed-forward activations",
    modules="intermediate",
    keep="output",
)


class FfnNorm:
    """The norm of each token's feed-forward activations, one row per layer."""

    name = "ffn-norm"
    description = "Norm of each token's feed-forward activations, per layer"
    requires = frozenset({"ffn_activations"})

    def attribute(self, trace: attrib_bench.Trace) -> attrib_bench.Attribution:
        activations = trace.need("ffn_activations")  # L tensors (batch, tokens, F)
        norms_BLN = torch.stack([a_BNF.norm(dim=-1) for a_BNF in activations], dim=1)
        mask_B1N = trace.mask_BN[:, None, :].to(norms_BLN.dtype)  # padded positions score 0
        return attrib_bench.Attribution(aggregated_BLN=norms_BLN * mask_B1N)


@attrib_bench.hookimpl
def attrib_bench_trace_fields() -> list:
    return [FFN_ACTIVATIONS]


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [FfnNorm()]


# --8<-- [end:example]
