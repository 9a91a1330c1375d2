"""User errors and exit codes, kept apart from bugs so the CLI can answer without a traceback."""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of the ``attrib-bench`` command."""

    #: Everything requested ran and was scored.
    OK = 0
    #: ``check``: at least one score fell beyond the tolerance and the run-to-run noise.
    REGRESSION = 1
    #: Bad input: unknown plugin, model, dataset, split or column; unusable files.
    USAGE_ERROR = 2
    #: The run finished, but at least one method or evaluator failed (see its ``error``).
    PARTIAL = 3
    #: A bug in attrib-bench or a plugin (an unexpected exception): never a verdict on scores.
    INTERNAL_ERROR = 4
    #: Interrupted (Ctrl-C): batches already finished are cached, rerunning resumes (128 + 2).
    INTERRUPTED = 130


class UsageError(Exception):
    """A problem with what the user asked for; shown as one line, exit code 2."""


def unknown_choice(kind: str, value: str, choices: Iterable[str]) -> UsageError:
    """Build the standard 'unknown X' error that names the bad value and the valid ones."""
    listed = ", ".join(sorted(choices)) or "(none)"
    return UsageError(f"unknown {kind} {value!r}; valid choices: {listed}")


def check_seed(seed: object) -> None:
    """A seed both numpy's and torch's generators take, else a UsageError: a negative seed
    failed in the statistics after the whole run, a huge one in ``torch.manual_seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise UsageError(f"--seed must be a whole number from 0 to 2**64 - 1, got {seed!r}")
