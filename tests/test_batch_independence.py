"""A sentence's attribution must not depend on what else is in its padded batch."""

from __future__ import annotations

import pytest
import torch
from helpers import examples, one_batch, rows_by_id

from attrib_bench.model.load import load_model
from attrib_bench.model.trace import TRACE_FIELDS, trace_batch
from attrib_bench.plugins import load_registry
from attrib_bench_plugins.norm import GLOBENC_EIGHT

#: Every built-in attributor, IG with few steps to stay fast.
SPECS = [
    *GLOBENC_EIGHT,
    "norm:normalize_rows=true",
    "effective-attention",
    "effective-attention:residual=0.5",
    "hta:norm=sum",
    "saliency",
    "gradient",
    "integrated-gradients:steps=4",
    "random",
]


@pytest.fixture(scope="module")
def loaded(tiny_model):
    return load_model(str(tiny_model), "cpu")


def test_every_builtin_is_covered():
    names = {spec.partition(":")[0] for spec in SPECS}
    builtins = {
        name
        for name, reg in load_registry().attributors.items()
        if reg.source.startswith("attrib-bench ")
    }
    assert builtins <= names


@pytest.mark.parametrize("spec", SPECS)
def test_alone_equals_in_batch(loaded, spec):
    attributor = load_registry().attributor(spec)
    items = examples()
    together = trace_batch(loaded, one_batch(loaded, items), TRACE_FIELDS)
    in_batch = rows_by_id(together, attributor.attribute(together))
    for item in items:
        alone_trace = trace_batch(loaded, one_batch(loaded, [item]), TRACE_FIELDS)
        alone = rows_by_id(alone_trace, attributor.attribute(alone_trace))[item.id]
        for kind, rows in alone.items():
            torch.testing.assert_close(in_batch[item.id][kind], rows, rtol=1e-4, atol=1e-6)
