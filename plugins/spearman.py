"""Spearman agreement with a reference attributor, layer by layer (the GlobEnc protocol).

Per example, over its real tokens ([CLS] and [SEP] kept unless ``drop_special=true``), the
Spearman correlation between the method's [CLS] row at layer l and the reference. A whole-model
reference (saliency) is compared with every layer; a layer-wise reference (``--reference hta``)
is compared layer l to layer l, the layer-local comparison of the GlobEnc paper.
"""

from __future__ import annotations

import numpy as np

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext
from attrib_bench.results.stats import spearman_rows


def _match_layers(reference_BLN: np.ndarray, layers: int) -> np.ndarray:
    """The reference rows to compare with a method of ``layers`` layers.

    A whole-model reference serves every layer; a layer-wise one is compared layer l to layer l;
    a whole-model method (one row) is compared with the layer-wise reference's last layer.
    """
    available = reference_BLN.shape[1]
    if available in (1, layers):
        return reference_BLN
    if layers == 1:
        return reference_BLN[:, -1:]
    raise ValueError(
        f"reference has {available} layers and the method {layers}: a layer-wise reference "
        "needs one row per layer of the method"
    )


class Spearman(Configurable):
    """Per example and layer, Spearman's rho between the method's row and the reference's.

    Reference: Modarressi et al. 2022, "GlobEnc: Quantifying Global Token Attribution by
    Incorporating the Whole Encoder Layer in Transformers", NAACL (its evaluation protocol).
    """

    name = "spearman"
    description = "Spearman correlation with the reference attributor, per layer (GlobEnc protocol)"
    needs_reference = True
    family = "agreement"
    parameters = {"drop_special": False}
    parameter_docs = {
        "drop_special": "leave [CLS], [SEP] and the other special tokens out of the correlation "
        "(the GlobEnc protocol keeps them)",
    }

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        reference = context.reference.aggregated_BLN.detach().cpu().numpy()
        batch = context.trace.batch
        keep_BN = batch.attention_mask_BN.bool()
        if self.params["drop_special"]:
            keep_BN &= ~batch.special_tokens_mask_BN.bool()
        keep_BN = keep_BN.cpu().numpy()
        scores: dict[str, np.ndarray] = {}
        for kind in attrib_bench.KINDS:
            rows = attribution.rows(kind)
            if rows is None:
                continue
            rows = rows.detach().cpu().numpy()
            matched = _match_layers(reference, rows.shape[1])
            per_example = [
                spearman_rows(rows[b][:, keep_BN[b]], matched[b][:, keep_BN[b]])
                for b in range(rows.shape[0])
            ]
            scores[kind] = np.stack(per_example, axis=1)  # (L, B)
        return scores


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [Spearman()]
