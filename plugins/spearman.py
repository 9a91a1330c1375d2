"""Spearman agreement with a reference attributor, layer by layer (the GlobEnc protocol).

Per example, over its real tokens ([CLS] and [SEP] kept unless ``drop_special=true``), the
Spearman correlation between the method's [CLS] row at layer l and the reference. A whole-model
reference (saliency) is compared with every layer; a layer-wise reference with the same number of
layers is compared layer l to layer l.
"""

from __future__ import annotations

import numpy as np

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext
from attrib_bench.stats import spearman_rows


class Spearman(Configurable):
    name = "spearman"
    description = "Spearman correlation with the reference attributor, per layer (GlobEnc protocol)"
    needs_reference = True
    parameters = {"drop_special": False}

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
            if reference.shape[1] not in (1, rows.shape[1]):
                raise ValueError(
                    f"reference has {reference.shape[1]} layers and the method {rows.shape[1]}: "
                    "a layer-wise reference must have one row per layer of the method"
                )
            per_example = [
                spearman_rows(rows[b][:, keep_BN[b]], reference[b][:, keep_BN[b]])
                for b in range(rows.shape[0])
            ]
            scores[kind] = np.stack(per_example, axis=1)  # (L, B)
        return scores


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [Spearman()]
