# --8<-- [start:example]
"""An attrib-bench plugin: how much [CLS] attends to each token in the last layer.

Try it with ``attrib-bench run --plugin example_plugin.py --attributors cls-max-attention``,
or ship it in a package registered under ``[project.entry-points.attrib_bench]``.
"""

import attrib_bench


class ClsMaxAttention:
    """Last-layer attention of the [CLS] token to every token, the maximum over heads."""

    name = "cls-max-attention"
    description = "Last-layer attention from [CLS] to each token, max over heads"
    # The trace fields to capture in the shared forward pass.
    requires = frozenset({"attentions"})

    def attribute(self, trace: attrib_bench.Trace) -> attrib_bench.Attribution:
        last_BHNK = trace.need("attentions")[-1]  # (batch, heads, query, key) probabilities
        cls_BK = last_BHNK[:, :, 0, :].amax(dim=1)  # the [CLS] query row, max over heads
        cls_BK = cls_BK * trace.mask_BN.to(cls_BK.dtype)  # padded positions score 0
        # One row for the whole model (L = 1): shape (batch, 1, tokens).
        return attrib_bench.Attribution(aggregated_BLN=cls_BK[:, None, :])


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [ClsMaxAttention()]


# --8<-- [end:example]
