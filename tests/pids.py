"""Signals a test sends to a process it knows by pid reach that process only.

Pids are reused (``pid_max`` is 32768 on many hosts, and the sandbox's tests start thousands of processes), so a
pid read earlier may name another test's process by the time a ``finally`` clause signals it; as root, nothing stops
the signal. A process is therefore named by its pid *and* its start time (``/proc/<pid>/stat``, field 22).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from mars2.procs import live_processes


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Known:
    """A process as seen once: its pid and its start time."""

    pid: int
    started: int | None

    @classmethod
    def of(cls, pid: int) -> Known:
        return cls(pid, start_time(pid))

    def same(self) -> bool:
        return self.started is not None and start_time(self.pid) == self.started

    def kill(self, sig: int, group: bool = False) -> None:
        """Send ``sig`` to this process (``group``: to the group it leads) if the pid still names it; a leader gone
        leaves its group alone (the group id may be reused as soon as its last member is reaped)."""
        if self.same():
            with contextlib.suppress(ProcessLookupError):
                (os.killpg if group else os.kill)(self.pid, sig)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (exited, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` is no longer :func:`alive` within ``seconds`` (polled every 0.1 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (a zombie leader, still holding the group's id, excluded)."""
    return [pid for pid, fields in live_processes().items() if int(fields[2]) == pgid]


def descendants(pid: int) -> list[int]:
    """The live descendants of ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for child, fields in live_processes().items():
        children.setdefault(int(fields[1]), []).append(child)
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def engines_under(home) -> list[int]:
    """Pids of the generation engines serving models under ``home`` (their command lines name it)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "mars2.backends.engine_server" in cmd and str(home) in cmd:
            pids.append(int(entry))
    return pids
