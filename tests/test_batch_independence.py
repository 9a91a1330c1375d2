"""A sentence's attribution must not depend on what else is in its padded batch.

The conformance kit checks this (with determinism and the runner's own checks): every built-in
with its defaults in test_conformance.py, and here the parameter settings that take other code
paths.
"""

from __future__ import annotations

import pytest

from attrib_bench.core.registry import load_registry
from attrib_bench.testing import check_attributor

#: Parameter settings beyond the defaults that take other code paths.
VARIANTS = [
    "norm:normalize_rows=true",
    "effective-attention:residual=0.5",
    "hta:norm=sum",
    "saliency:target=gold,reduce=sum",
    "saliency:layer=word_embeddings,reduce=abs-sum",
    "integrated-gradients:steps=4,chunk_tokens=20",
    "cp-lrp:layer=embeddings,reduce=l2",
    "attcat:target=gold",
]


def test_the_variants_are_of_builtin_attributors():
    registry = load_registry()
    for spec in VARIANTS:
        source = registry.attributors[spec.partition(":")[0]].source
        assert source.startswith("attrib-bench "), (spec, source)


@pytest.mark.parametrize("spec", VARIANTS)
def test_alone_equals_in_any_batch(spec):
    check_attributor(load_registry().attributor(spec))
