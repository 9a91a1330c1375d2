"""Terminal output: tables and JSON go to stdout, progress and warnings to stderr."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import rich.progress
from rich.console import Console
from rich.markup import escape
from rich.text import Text

stderr = Console(stderr=True)
#: Seconds between two plain progress lines (stderr not a terminal): a CI log stays short.
PLAIN_EVERY = 60.0


def warn(message: str) -> None:
    stderr.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def progress(disable: bool = False) -> Progress:
    """A progress display on stderr (so ``--json`` output on stdout stays clean)."""
    return Progress(disable)


def duration(seconds: float) -> str:
    """``45s``, ``4m20s``, ``1h02m``: short enough for a progress line."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


@dataclass
class _Task:
    description: str
    total: int
    #: The work of all steps (tokens, say); the time left is estimated from it, not from steps.
    work_total: float
    started: float
    completed: int = 0
    work_done: float = 0.0
    last_line: float = 0.0
    ended: bool = False


class Progress:
    """Progress of long phases on stderr, with the time left estimated from work, not steps.

    On a terminal it draws rich bars. Elsewhere (a CI log, ``tee``) a live bar shows nothing
    until it ends, so it prints a plain line when a phase starts, at most every ``every``
    seconds, and when it ends. Steps may carry unequal work (a batch's tokens): the time left is
    elapsed x work left / work done, right for length-sorted batches (the slow ones first) where
    a count of steps, or the speed of the last ones, is far off. Work ``free`` of cost (read from
    a cache) counts as done but not into that rate. ``clock`` and ``console`` are for tests.
    """

    def __init__(
        self,
        disable: bool = False,
        *,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
        every: float = PLAIN_EVERY,
    ) -> None:
        self.disable = disable
        self.console = stderr if console is None else console
        self.clock = clock
        self.every = every
        self.tasks: dict[int, _Task] = {}
        live = (self.console.is_interactive or self.console.is_jupyter) and not disable
        self.bars = (
            rich.progress.Progress(
                rich.progress.TextColumn("{task.description}"),
                rich.progress.BarColumn(),
                rich.progress.MofNCompleteColumn(),
                rich.progress.TimeElapsedColumn(),
                _TimeLeftColumn(self),
                console=self.console,
                get_time=clock,
            )
            if live
            else None
        )

    def __enter__(self) -> Progress:
        if self.bars is not None:
            self.bars.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.bars is not None:
            self.bars.stop()
            return
        for task_id, task in self.tasks.items():  # where an unfinished phase stopped
            if not task.ended and not self.disable:
                self._print(task_id)

    def add_task(self, description: str, total: int, work: float | None = None) -> int:
        """A phase of ``total`` steps whose work adds up to ``work`` (default: one per step)."""
        task_id = len(self.tasks)
        if self.bars is not None:
            task_id = int(self.bars.add_task(description, total=total))
        now = self.clock()
        work_total = float(total if work is None else work)
        self.tasks[task_id] = _Task(description, total, work_total, now, last_line=now)
        if self.bars is None and not self.disable:
            self._print(task_id)
        return task_id

    def advance(
        self, task_id: int, advance: int = 1, *, work: float | None = None, free: bool = False
    ) -> None:
        """``advance`` steps done, of ``work`` (default: one per step); ``free``: done at no
        cost (cached), so they shorten the work left without speeding up the estimate."""
        self.update(task_id, advance=advance, work=work, free=free)

    def update(
        self,
        task_id: int,
        *,
        advance: int = 0,
        description: str | None = None,
        work: float | None = None,
        free: bool = False,
    ) -> None:
        task = self.tasks[task_id]
        done = float(advance if work is None else work)
        if free:
            task.work_total -= done
        else:
            task.work_done += done
        task.completed += advance
        if description is not None:
            task.description = description
        if self.bars is not None:
            bar = rich.progress.TaskID(task_id)
            self.bars.update(bar, advance=advance, description=description)
        elif not (self.disable or task.ended) and (
            task.completed >= task.total or self.clock() - task.last_line >= self.every
        ):
            self._print(task_id)

    def seconds_left(self, task_id: int) -> float | None:
        """Elapsed x work left / work done; None before any work is done."""
        task = self.tasks[task_id]
        if task.work_done <= 0:
            return None
        left = max(task.work_total - task.work_done, 0.0)
        return (self.clock() - task.started) * left / task.work_done

    def _text(self, task_id: int) -> str:
        """``attributing: 120/600 (20%), 1m05s elapsed, ~4m20s left``."""
        task = self.tasks[task_id]
        share = task.completed / task.total if task.total else 1.0
        text = f"{task.description}: {task.completed}/{task.total} ({share:.0%})"
        if task.completed == 0:
            return text
        text += f", {duration(self.clock() - task.started)} elapsed"
        left = self.seconds_left(task_id)
        if task.completed < task.total and left is not None:
            text += f", ~{duration(left)} left"
        return text

    def _print(self, task_id: int) -> None:
        task = self.tasks[task_id]
        self.console.print(self._text(task_id), markup=False, highlight=False, soft_wrap=True)
        task.last_line = self.clock()
        task.ended = task.completed >= task.total


class _TimeLeftColumn(rich.progress.ProgressColumn):
    """The bar's time left, from the work done (``Progress.seconds_left``)."""

    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress

    def render(self, task: rich.progress.Task) -> Text:
        known = int(task.id) in self.progress.tasks  # rich draws a task before add_task returns
        left = self.progress.seconds_left(int(task.id)) if known and not task.finished else None
        shown = "-:--:--" if left is None else duration(left)
        return Text(shown, style="progress.remaining")
