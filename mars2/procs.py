"""Child processes bound to this one: they get SIGTERM when it dies, however it dies.

The engines (``mars2.backends.engine``) and the pipeline's temporary Prefect server are started this way, so that
not even ``kill -9`` of the process that started them leaves them running.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
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
