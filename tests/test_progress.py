"""Progress on stderr: plain lines when it is no terminal, and a time left estimated from work.

Every test injects the clock and a console on a string buffer: nothing depends on the
machine's speed or on whether the test runs in a terminal.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from attrib_bench.core.console import Progress, duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain(
    clock: FakeClock, disable: bool = False, every: float = 60.0
) -> tuple[Progress, io.StringIO]:
    buffer = io.StringIO()
    console = Console(file=buffer, width=40)  # not a terminal; narrow, yet lines must not wrap
    return Progress(disable, console=console, clock=clock, every=every), buffer


def test_redirected_output_gets_few_plain_lines_with_the_counts():
    clock = FakeClock()
    progress, buffer = plain(clock)
    with progress:
        task = progress.add_task("attributing", total=600)
        for _ in range(60):  # 10 steps of 10 s each minute: one line a minute, not one a step
            clock.now += 10
            progress.advance(task, 10)
    lines = buffer.getvalue().splitlines()
    assert lines == [
        "attributing: 0/600 (0%)",
        "attributing: 60/600 (10%), 1m00s elapsed, ~9m00s left",
        "attributing: 120/600 (20%), 2m00s elapsed, ~8m00s left",
        "attributing: 180/600 (30%), 3m00s elapsed, ~7m00s left",
        "attributing: 240/600 (40%), 4m00s elapsed, ~6m00s left",
        "attributing: 300/600 (50%), 5m00s elapsed, ~5m00s left",
        "attributing: 360/600 (60%), 6m00s elapsed, ~4m00s left",
        "attributing: 420/600 (70%), 7m00s elapsed, ~3m00s left",
        "attributing: 480/600 (80%), 8m00s elapsed, ~2m00s left",
        "attributing: 540/600 (90%), 9m00s elapsed, ~1m00s left",
        "attributing: 600/600 (100%), 10m00s elapsed",
    ]


def test_a_phase_left_unfinished_says_where_it_stopped_and_quiet_says_nothing():
    clock = FakeClock()
    progress, buffer = plain(clock)
    with progress:
        task = progress.add_task("fine-tuning", total=100)
        clock.now += 5
        progress.update(task, advance=3, description="fine-tuning (loss 0.693)")
    assert buffer.getvalue().splitlines() == [
        "fine-tuning: 0/100 (0%)",
        "fine-tuning (loss 0.693): 3/100 (3%), 5s elapsed, ~2m42s left",
    ]
    quiet, silent = plain(clock, disable=True)
    with quiet:
        task = quiet.add_task("fine-tuning", total=2)
        quiet.advance(task, 2)
    assert silent.getvalue() == ""


def test_time_left_from_tokens_is_right_on_longest_first_batches():
    """Ten batches sorted longest first, each taking time in proportion to its tokens: after
    the two longest, the time left from tokens is exact, while a count of batches would say
    more than twice as long."""
    tokens = [2000, 1200, 600, 400, 300, 200, 100, 100, 50, 50]
    seconds_per_token = 0.01
    clock = FakeClock()
    progress, _ = plain(clock)
    task = progress.add_task("attributing", total=len(tokens), work=sum(tokens))
    done = 2
    for batch in tokens[:done]:
        clock.now += batch * seconds_per_token
        progress.advance(task, work=batch)
    elapsed = sum(tokens[:done]) * seconds_per_token
    truth = sum(tokens[done:]) * seconds_per_token
    by_count = elapsed * (len(tokens) - done) / done
    assert progress.seconds_left(task) == pytest.approx(truth) == 18.0
    assert by_count == pytest.approx(128.0)  # 7x the truth


def test_cached_work_shortens_the_time_left_without_speeding_up_the_rate():
    clock = FakeClock()
    progress, _ = plain(clock)
    task = progress.add_task("attributing", total=4, work=400)
    progress.advance(task, 2, work=200, free=True)  # read from the cache at once
    assert progress.seconds_left(task) is None  # nothing computed yet: no rate
    clock.now += 30
    progress.advance(task, 1, work=100)
    assert progress.seconds_left(task) == 30.0  # 100 tokens left at 100 per 30 s


def test_a_terminal_gets_bars_whose_time_left_is_from_work():
    clock = FakeClock()
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    with Progress(console=console, clock=clock) as progress:
        task = progress.add_task("attributing", total=4, work=400)
        clock.now += 30
        progress.advance(task, 1, work=100)  # a quarter of the work in 30 s: 90 s left
        progress.bars.refresh()
    shown = buffer.getvalue()
    assert "1/4" in shown and "1m30s" in shown
    assert "attributing: " not in shown  # no plain lines on a terminal


def test_durations_are_short():
    assert [duration(s) for s in (0.4, 59, 65, 3599, 3720)] == [
        "0s",
        "59s",
        "1m05s",
        "59m59s",
        "1h02m",
    ]
