"""One live progress display per stage: what the stage counts (nodes built, programs graded, samples trained,
programs evaluated), how many of how many, the rate and the time left.

The display is transient: when the stage ends it disappears and the flow's one ``✓ ran`` line per stage stays
(``tasks/report.py``). On a console that is not a terminal (a log file, CI) nothing is drawn at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text


class RateColumn(ProgressColumn):
    """``12.3 nodes/s`` (rich's own speed column is for bytes)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:.1f} {task.fields.get('unit', '')}/s", style="progress.data.speed")


@contextmanager
def stage_progress(label: str, unit: str, console: Console | None = None) -> Iterator[Callable[..., None]]:
    """``with stage_progress("rollout c0", "nodes") as advance: ... advance(done, total)``; a stage with phases
    keeps its one display and names the phase: ``advance(done, total, phase="hidden tests")``."""
    console = console or Console(stderr=True)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[unit]}"), RateColumn(), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        job = bar.add_task(label, total=None, unit=unit)

        def advance(done: int, total: int, phase: str | None = None) -> None:
            if phase is not None:
                bar.update(job, description=f"{label}: {phase}")
            bar.update(job, completed=done, total=total)

        yield advance
