"""A sentence's attribution must not depend on what else is in its padded batch.

Every built-in attributor is enumerated from the registry, so a new built-in is covered without
editing this file; a few parameter settings that take other code paths are added to it.
"""

from __future__ import annotations

import pytest
import torch
from helpers import SENTENCES, examples, one_batch, rows_by_id

from attrib_bench.model.load import load_model
from attrib_bench.model.trace import TRACE_FIELDS, trace_batch
from attrib_bench.plugins import load_registry

#: Parameter settings beyond the defaults that take other code paths.
VARIANTS = [
    "norm:normalize_rows=true",
    "effective-attention:residual=0.5",
    "hta:norm=sum",
    "saliency:target=gold,reduce=sum",
    "integrated-gradients:steps=4,internal_batch_size=7",
]
#: Longer than every other sentence: in a batch with it, each of them is padded.
LONG = (
    "after a slow and rather confusing first hour the story finally finds its voice , and "
    "the last scenes between the two sisters are some of the most honest moments i have seen"
)


def builtin_names() -> list[str]:
    registry = load_registry()
    return sorted(
        name
        for name, registered in registry.attributors.items()
        if registered.source.split()[0] == "attrib-bench"
    )


SPECS = [*builtin_names(), *VARIANTS]


@pytest.fixture(scope="module")
def loaded(tiny_model):
    return load_model(str(tiny_model), "cpu")


def test_the_specs_are_every_builtin_attributor():
    names = set(builtin_names())
    # The registry is what is enumerated; make sure it holds the documented built-ins.
    assert names >= {
        "attention",
        "rollout",
        "norm",
        "norm-res",
        "norm-resln",
        "globenc",
        "norm-fixedres",
        "attention-res",
        "effective-attention",
        "hta",
        "saliency",
        "gradient",
        "integrated-gradients",
        "random",
    }
    assert {spec.partition(":")[0] for spec in VARIANTS} <= names


def assert_rows_equal(alone: torch.Tensor, in_batch: torch.Tensor, what: str) -> None:
    """Equal up to float32 rounding: relative 1e-4, and absolute 1e-5 of the row's scale (the
    batch changes the order of sums in the matrix products, not the math)."""
    scale = float(alone.abs().max())
    torch.testing.assert_close(
        in_batch, alone, rtol=1e-4, atol=1e-5 * max(scale, 1e-12), msg=lambda m: f"{what}: {m}"
    )


@pytest.mark.parametrize("spec", SPECS)
def test_alone_equals_in_any_batch(loaded, spec):
    attributor = load_registry().attributor(spec)
    items = examples([*SENTENCES, LONG])

    def attribute(batch_items):
        trace = trace_batch(loaded, one_batch(loaded, batch_items), TRACE_FIELDS)
        return rows_by_id(trace, attributor.attribute(trace))

    # All together (each padded to LONG), and each short one in a pair with LONG.
    together = attribute(items)
    paired = {}
    for item in items[:-1]:
        paired.update({item.id: attribute([item, items[-1]])[item.id]})
    for item in items:
        alone = attribute([item])[item.id]
        assert alone, f"{spec} returned no rows"
        for kind, rows in alone.items():
            assert rows.abs().max() > 0, f"{spec} {kind} rows of {item.id!r} are all zero"
            assert_rows_equal(rows, together[item.id][kind], f"{spec} {kind} {item.id!r} in all")
            if item.id in paired:
                assert_rows_equal(rows, paired[item.id][kind], f"{spec} {kind} {item.id!r} paired")
