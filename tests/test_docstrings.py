"""Every example in a docstring of the package runs and shows what it says (doctest)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "attrib_bench"
#: Every module but ``__main__``, which runs the CLI when imported.
MODULES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py")
    if path.name != "__main__.py"
)


def _examples(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return [test for test in doctest.DocTestFinder().find(module) if test.examples]


def test_the_walk_finds_the_documented_examples():
    found = {test.name for name in MODULES for test in _examples(name)}
    assert {
        "attrib_bench.api.list_plugins",
        "attrib_bench.core.registry.Spec.parse",
        "attrib_bench.core.shards.parse_shard",
        "attrib_bench.core.target.Target.parse",
    } <= found


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in _examples(name):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
