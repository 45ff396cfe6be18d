"""Child processes bound to this one: they get SIGTERM when it dies, however it dies.

The engines (``mars2.backends.engine``) and the pipeline's temporary Prefect server are started this way, so that
not even ``kill -9`` of the process that started them leaves them running.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future


def die_with_parent() -> None:
    """``preexec_fn`` of a child process bound to its parent: the kernel sends it SIGTERM when the parent dies, even
    by ``kill -9`` (Linux ``PR_SET_PDEATHSIG``; elsewhere a no-op). The kernel watches the *thread* that forked the
    child, so start such children with :func:`popen_bound`."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


_spawns: queue.SimpleQueue = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def popen_bound(args: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, preexec_fn=die_with_parent, **kwargs)`` forked from one thread that lives as long as
    the process: a child forked from a short-lived thread (a reader restarting a crashed engine, a task runner's
    worker) would get its SIGTERM when that thread ends, not when the process dies."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = threading.Thread(target=_spawn_forever, name="mars2-spawner", daemon=True)
            _spawner.start()
    done: Future = Future()
    _spawns.put((args, kwargs, done))
    return done.result()


def _spawn_forever() -> None:
    while True:
        args, kwargs, done = _spawns.get()
        try:
            done.set_result(subprocess.Popen(args, preexec_fn=die_with_parent, **kwargs))
        except BaseException as e:
            done.set_exception(e)


def exit_code(proc: subprocess.Popen) -> int | None:
    """``proc``'s exit code once it has exited, else None, *without reaping it*: until its parent reaps it, the
    kernel keeps its pid — and so its process-group id — reserved, so :func:`kill_group` cannot reach a stranger.
    ``Popen.poll()`` reaps, after which the pid may be reused at once (``pid_max`` is 32768 on many hosts)."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped behind Popen's back (not by this module)
        return proc.poll()
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    """Wait up to ``timeout`` seconds for ``proc`` to exit, without reaping it (:func:`exit_code`); its exit code,
    or None if it still runs."""
    deadline = time.monotonic() + timeout
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while (code := exit_code(proc)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if fd is None:
                time.sleep(min(left, 0.01))
            else:
                select.select([fd], [], [], left)
        return code
    finally:
        if fd is not None:
            os.close(fd)


def kill_group(proc: subprocess.Popen) -> int:
    """SIGKILL the process group that ``proc`` leads (it was started in a session of its own), then reap ``proc``;
    its exit code. The group is signalled only while ``proc`` is unreaped (running, or a zombie): after the reap its
    id may already name another process group. Members left in the group after ``proc`` exited (a crashed vLLM's
    engine core) are reached because ``proc`` is reaped only after the signal."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()  # and the process itself, had it not led a group after all (Popen checks it is unreaped)
    return proc.wait()


def live_processes() -> dict[int, list[str]]:
    """pid → the fields of ``/proc/<pid>/stat`` after the command name (state, ppid, pgid, ...), zombies left out."""
    live = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:
            continue  # exited meanwhile
        if fields[0] not in ("Z", "X"):
            live[int(entry)] = fields
    return live


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no live process is left in process group ``pgid`` (signalled to death: its members may still be
    exiting and freeing their memory, a GPU's included), at most ``timeout_s``; whether it is gone. Zombies do not
    count: they hold no memory, and where nothing reaps orphans (a container whose first process is no init) they
    stay for good."""
    deadline = time.monotonic() + timeout_s
    while any(int(fields[2]) == pgid for fields in live_processes().values()):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
