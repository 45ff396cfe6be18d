"""One live progress display per stage: what the stage counts (nodes built, programs graded, samples trained,
programs evaluated), how many of how many, the rate and the time left.

The display is transient: when the stage ends it disappears and the flow's one ``✓ ran`` line per stage stays
(``pipeline/report.py``). On a console that is not a terminal (a log file, ``nohup``, ``sbatch``, CI) nothing is drawn;
instead one plain line every ``every_s`` seconds says where the stage is:

    rollout c0: 312/1024 nodes, 10.4 nodes/s, 30 s elapsed, ETA 68 s
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text


class RateColumn(ProgressColumn):
    """``12.3 nodes/s`` over the stage so far, shown from its first second on (rich's own speed column is for bytes,
    and its windowed speed reads a first jump of cached work as 100,000 programs/s)."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        speed = task.completed / elapsed if elapsed >= 1.0 else None
        return Text("" if speed is None else f"{speed:.1f} {task.fields.get('unit', '')}/s", style="progress.data.speed")


@contextmanager
def stage_progress(label: str, unit: str, console: Console | None = None, every_s: float = 30.0,
                   note: str | None = None) -> Iterator[Callable[..., None]]:
    """``with stage_progress("rollout c0", "nodes") as advance: ... advance(done, total)``; a stage with phases
    keeps its one display and names the phase: ``advance(done, total, phase="hidden tests")``. Not on a terminal:
    a plain progress line every ``every_s`` seconds (0: none). ``note`` (e.g. what a resumed stage kept) is printed
    once first, as ``label: note``."""
    console = console or Console(stderr=True)
    if note:
        console.print(f"{label}: {note}", markup=False, highlight=False, soft_wrap=True)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[unit]}"), RateColumn(), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn())
    lines = PlainLines(label, unit, console) if not console.is_terminal and every_s > 0 else None
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar, \
            logs_above(console if console.is_terminal else None):
        job = bar.add_task(label, total=None, unit=unit)

        def advance(done: int, total: int, phase: str | None = None) -> None:
            if phase is not None:
                bar.update(job, description=f"{label}: {phase}")
            bar.update(job, completed=done, total=total)
            if lines is not None:
                lines.update(done, total, phase)

        if lines is None:
            yield advance
            return
        stop = threading.Event()
        ticker = threading.Thread(target=lines.every, args=(every_s, stop), name=f"progress-{label}", daemon=True)
        ticker.start()
        try:
            yield advance
        finally:
            stop.set()
            ticker.join()


@contextmanager
def logs_above(console: Console | None) -> Iterator[None]:
    """While a live display draws on ``console``, the records the root logger prints on the console (warnings, with
    their filters) go through that console, which prints them above the display instead of into it. None: as is."""
    import logging

    from rich.logging import RichHandler

    top = logging.getLogger()
    streams = [h for h in top.handlers
               if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    if console is None or not streams:
        yield
        return
    above = RichHandler(console=console, level=min(h.level for h in streams), show_path=False, show_time=False)
    for f in {f for h in streams for f in h.filters}:
        above.addFilter(f)
    for h in streams:
        top.removeHandler(h)
    top.addHandler(above)
    try:
        yield
    finally:
        top.removeHandler(above)
        for h in streams:
            top.addHandler(h)


class PlainLines:
    """A stage's progress as plain text lines (``label: done/total unit, rate unit/s, elapsed, ETA``), for a console
    that is not a terminal. The rate is over the stage so far; a phase restarts it."""

    def __init__(self, label: str, unit: str, console: Console):
        self.label, self.unit, self.console = label, unit, console
        self.done, self.total, self.phase = 0, 0, None
        self.start = self.phase_start = time.monotonic()
        self.lock = threading.Lock()

    def update(self, done: int, total: int, phase: str | None) -> None:
        with self.lock:
            if phase is not None and phase != self.phase:
                self.phase, self.phase_start = phase, time.monotonic()
            self.done, self.total = done, total

    def line(self) -> str:
        with self.lock:
            now = time.monotonic()
            name = f"{self.label}: {self.phase}" if self.phase else self.label
            rate = self.done / max(now - self.phase_start, 1e-9)
            elapsed = f"{now - self.start:.0f} s elapsed"
            if not self.done:  # nothing to say a rate or an ETA from yet
                count = f"0/{self.total} {self.unit}" if self.total else f"no {self.unit} done yet"
                return f"{name}: {count}, {elapsed}"
            if not self.total:
                return f"{name}: {self.done} {self.unit} so far, {rate:.1f} {self.unit}/s, {elapsed}"
            return (f"{name}: {self.done}/{self.total} {self.unit}, {rate:.1f} {self.unit}/s, {elapsed}, "
                    f"ETA {(self.total - self.done) / rate:.0f} s")

    def every(self, every_s: float, stop: threading.Event) -> None:
        while not stop.wait(every_s):
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
