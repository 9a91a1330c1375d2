"""Terminal output: tables and JSON go to stdout, progress and warnings to stderr."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

stderr = Console(stderr=True)


def warn(message: str) -> None:
    stderr.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def progress(disable: bool = False) -> Progress:
    """A progress display on stderr (so ``--json`` output on stdout stays clean)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        disable=disable,
        transient=False,
    )
