"""pytest plugin: the ``attrib_bench`` fixture, for a regression test in three lines::

    def test_attribution_quality(attrib_bench):
        results = attrib_bench.run("bench.toml")
        attrib_bench.assert_no_regression(results, "baseline.json", tolerance=0.02)

Relative paths are read from the test file's folder. ``pytest --attrib-bench-update-baselines``
writes the current results as the baselines instead of comparing (review and commit them).

Registered as a ``pytest11`` entry point, so every pytest session in an environment with
attrib-bench loads it: it lives outside the ``attrib_bench`` package and imports nothing heavy
(torch, transformers) until a test uses the fixture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

UPDATE_OPTION = "--attrib-bench-update-baselines"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attrib-bench")
    group.addoption(
        UPDATE_OPTION,
        action="store_true",
        default=False,
        help="attrib_bench fixture: write current results as the baselines instead of checking",
    )


class AttribBench:
    """What the fixture gives a test: run or load results, and assert no regression."""

    def __init__(self, folder: Path, update_baselines: bool) -> None:
        self.folder = folder
        self.update_baselines = update_baselines

    def path(self, path: Path | str) -> Path:
        """``path`` as given when absolute, else in the test file's folder."""
        path = Path(path)
        return path if path.is_absolute() else self.folder / path

    def run(self, config: Path | str, **overrides: Any) -> Any:
        """Run a TOML benchmark config (cached) and return its ``Result``."""
        from attrib_bench.testing import run_config

        return run_config(self.path(config), **overrides)

    def load(self, results: Path | str) -> Any:
        """A result JSON written earlier by ``attrib-bench run --output``, as a ``Result``."""
        from attrib_bench.results.typed import as_result

        return as_result(self.path(results))

    def assert_no_regression(
        self,
        results: Any,
        baseline: Path | str,
        tolerance: float = 0.02,
        all_layers: bool = False,
    ) -> Any:
        """Fail with the check's Markdown summary when a score fell (see ``attrib-bench check``).

        With ``--attrib-bench-update-baselines``, write ``results`` to ``baseline`` instead.
        """
        from attrib_bench.testing import as_result, assert_no_regression

        target = self.path(baseline)
        if isinstance(results, (str, Path)):
            results = self.path(results)
        if self.update_baselines:
            as_result(results).save(target)
            return None
        if not target.is_file():
            pytest.fail(
                f"baseline {target} does not exist: run pytest {UPDATE_OPTION} to write it "
                "from the current results, then review and commit it",
                pytrace=False,
            )
        return assert_no_regression(results, target, tolerance=tolerance, all_layers=all_layers)


@pytest.fixture
def attrib_bench(request: pytest.FixtureRequest) -> AttribBench:
    """Run benchmark configs and gate on a committed baseline; paths are test-file relative."""
    return AttribBench(request.path.parent, request.config.getoption(UPDATE_OPTION))
