"""``parity=script``: a program run as a real script in the test process.

Each test gets a fresh ``__main__`` module (``solution`` for a functional program) holding LiveCodeBench's
preamble names, fresh stdin/stdout/stderr files and a wiped scratch directory; as at the end of a real
interpreter run, non-daemon threads are joined, ``atexit`` functions run and stdout is flushed. Several tests
share one process (:func:`script_session_child`), the state a program commonly changes put back between them
(:func:`reset_after_test`); ``isolate_tests`` forks a fresh process per test instead (:func:`run_script_child`).
"""

import fcntl
import json
import mmap
import os
import resource
import signal
import sys

from .confine import signal_ready
from .errors import PROGRAM_NAME, exception_only, format_error
from .files import read_head, wipe, write_all
from .libc import libc as _libc
from .values import encode_value_bytes
from .wire import read_frame, write_frame

_dumps = json.dumps  # bound once: a program patching json in its own process does not break our records
_mmap = mmap.mmap

PREAMBLE = """\
from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
import string
import re
import datetime
import collections
import heapq
import bisect
import copy
import math
import random
import statistics
import itertools
import functools
import operator
import io
import sys
import json
sys.setrecursionlimit(50000)
"""


def compile_program(source):
    """``(code, None)``, or ``(None, error text)`` when the program does not compile. Runs in the confined test
    process, after :func:`.confine.signal_ready`: a program that crashes the compiler only ends its own process."""
    signal_ready()
    try:
        return compile(source, PROGRAM_NAME, "exec", dont_inherit=True), None
    except BaseException as exc:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        return None, exception_only(exc)


def run_script_child(program, payload):
    """One test in this fresh child (``isolate_tests``): run it, write the record and value, exit."""
    import atexit

    atexit._clear()
    std_streams()
    signal.setitimer(signal.ITIMER_PROF, program["limits"]["time_s"])  # SIGPROF ends us at the CPU limit
    code, error = compile_program(program["source"])
    if code is None:
        record, value = {"status": "CE", "error": error}, None
    else:
        record, value = exec_program(program, program["module"], payload, code)
    if record["status"] == "ok" and program["mode"] == "functional":
        write_all(4, encode_value_bytes(value))
    write_all(3, _dumps(record).encode("utf-8", "replace"))
    os._exit(0)


def exec_program(program, module, payload, code):
    """Run ``code`` (the program) as a script in ``module`` on the current stdin; ``(record, return value)``.

    Like the end of a real interpreter run, non-daemon threads are joined, ``atexit`` functions run
    and stdout is flushed. Any ``SystemExit`` of a stdin program is a normal end (as in LiveCodeBench).
    """
    import atexit
    import threading

    mode = program["mode"]
    sys.modules[module.__name__] = module
    sys.argv = [PROGRAM_NAME]
    namespace = module.__dict__
    # address space to give back on MemoryError so the error can still be formatted (an mmap, not a
    # bytearray: zero-filling 1 MiB faulted in 256 pages, ~0.8 ms a test)
    reserve = _mmap(-1, 1 << 20)
    record = {"status": "ok"}
    value = None
    try:
        try:
            exec(code, namespace)
        except SystemExit:
            if mode != "stdin":
                raise
        if mode == "functional":
            args = [json.loads(line) for line in payload.decode("utf-8").split("\n") if line.strip()]
            func_name = program["func_name"]
            solution_class = namespace.get("Solution")
            if isinstance(solution_class, type):
                target = getattr(solution_class(), func_name, None)
                missing = f"class Solution has no method {func_name!r}"
            else:
                target = namespace.get(func_name)
                missing = f"the program defines neither class Solution nor a function {func_name!r}"
            if not callable(target):
                raise AttributeError(missing)
            value = target(*args)
            if isinstance(value, tuple):
                value = list(value)
        join_threads(threading)
    except MemoryError as exc:
        reserve.close()
        try:
            record = {"status": "MLE", "error": format_error(exc)}
        except MemoryError:
            record = {"status": "MLE", "error": "MemoryError"}
    except BaseException as exc:
        record = {"status": "RE", "error": format_error(exc)}
    try:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.__stdout__):
            if stream is not None and not getattr(stream, "closed", False):
                stream.flush()
    except BaseException as exc:
        if record["status"] == "ok":
            record = {"status": "RE", "error": "error while flushing output at exit: " + exception_only(exc)}
    return record, value


def script_session_child(program, preamble_names):
    """Script-mode tests, one after the other in this process: each test gets a fresh ``__main__``
    module, fresh stdin/stdout/stderr files, a fresh scratch directory, and the process state a
    program commonly changes (builtins, ``sys`` hooks and settings, signals, cwd, environment,
    ``random``'s state, ``decimal``'s context, gc, trace hooks) is put back afterwards. A test that
    leaves a thread or a process running marks the process dirty: it exits after reporting, and
    the next test gets a fresh process."""
    import builtins
    import gc
    import random
    import threading
    import types

    libc = _libc()
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of a test come back to us
    mode = program["mode"]
    limits = program["limits"]
    hard_cpu = resource.getrlimit(resource.RLIMIT_CPU)[1]
    saved_builtins = dict(builtins.__dict__)
    saved_sys = {name: getattr(sys, name) for name in ("excepthook", "displayhook", "breakpointhook",
                                                        "unraisablehook") if hasattr(sys, name)}
    saved_path, saved_meta_path, saved_path_hooks = list(sys.path), list(sys.meta_path), list(sys.path_hooks)
    saved_thread_hook = threading.excepthook
    saved_env = dict(os.environ)
    saved_random = random.getstate()
    saved_umask = os.umask(0o077)
    os.umask(saved_umask)
    saved_gc = gc.get_threshold()
    saved_signals = {sig: signal.getsignal(sig) for sig in signal.valid_signals()
                     if sig not in (signal.SIGKILL, signal.SIGSTOP)}
    work = os.getcwd()
    name = "__main__" if mode == "stdin" else "solution"
    code, compile_error = compile_program(program["source"])
    # bound now: a program replacing these module attributes cannot take our bookkeeping down with it
    setitimer, ITIMER_PROF, waitpid, WNOHANG = signal.setitimer, signal.ITIMER_PROF, os.waitpid, os.WNOHANG
    _exit = os._exit
    read_out = read_head
    while True:
        try:
            _, payload = read_frame(3)
        except EOFError:
            os._exit(0)
        if code is None:
            write_frame(4, {"status": "CE", "error": compile_error})
            continue
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime + limits["time_s"] + 0.999999)
        if hard_cpu != resource.RLIM_INFINITY:
            soft = min(soft, hard_cpu)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard_cpu))
        # fresh stdin (the input), stdout and stderr; we keep our own references above 64 (a test may
        # close 0-2, so a new file can land there: move it up first, then put it in place)
        fds = []
        for data in (payload if mode == "stdin" else b"", None, None):
            fd = os.memfd_create("mars2-test", os.MFD_CLOEXEC)
            if data:
                write_all(fd, data)
                os.lseek(fd, 0, os.SEEK_SET)
            fds.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64))
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        std_streams()
        os.chdir(work)
        module = types.ModuleType(name)
        module.__dict__.update(preamble_names)
        module.__file__ = PROGRAM_NAME
        module.__builtins__ = builtins
        signal.setitimer(signal.ITIMER_PROF, limits["time_s"])  # SIGPROF ends us at the CPU limit
        record, value = exec_program(program, module, payload, code)
        # from here on the program has run: whatever it broke is its own failure, never a sandbox fault
        out = b""
        try:
            setitimer(ITIMER_PROF, 0)
            if record["status"] == "ok":
                try:
                    out = (read_out(fds[1], limits["output_bytes"] + 1) if mode == "stdin"
                           else encode_value_bytes(value))
                except OSError:  # the program closed our reference to its stdout
                    out = b""
            dirty = any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread())
            while not dirty:
                try:
                    pid, _ = waitpid(-1, WNOHANG)
                except ChildProcessError:
                    break
                dirty = pid == 0  # a child (or an adopted orphan) still runs
        except BaseException as exc:
            setitimer(ITIMER_PROF, 0)
            record = {"status": "RE", "error": "the program broke the test runner: " + exception_only(exc)}
            dirty = True
        record["dirty"] = dirty or record["status"] == "MLE"  # a fresh heap for the next test
        try:
            reset_after_test(saved_builtins, saved_sys, saved_path, saved_meta_path, saved_path_hooks,
                             saved_thread_hook, saved_env, saved_random, saved_umask, saved_gc,
                             saved_signals, work, fds)
        except BaseException:  # the program broke something we use: this process is done after reporting
            record["dirty"] = True
        try:
            write_frame(4, record, out)
        except BaseException:  # the program closed or broke our channel: nothing more can be reported
            _exit(0)
        if record["dirty"]:
            _exit(0)


def reset_after_test(saved_builtins, saved_sys, saved_path, saved_meta_path, saved_path_hooks,
                     saved_thread_hook, saved_env, saved_random, saved_umask, saved_gc, saved_signals, work, fds):
    """Put the test process back as it was before the test (script session)."""
    import atexit
    import builtins
    import gc
    import random
    import threading

    atexit._clear()
    builtins.__dict__.clear()
    builtins.__dict__.update(saved_builtins)
    for key, val in saved_sys.items():
        setattr(sys, key, val)
    sys.path[:] = saved_path
    sys.meta_path[:] = saved_meta_path
    sys.path_hooks[:] = saved_path_hooks
    threading.excepthook = saved_thread_hook
    sys.settrace(None)
    sys.setprofile(None)
    threading.settrace(None)
    threading.setprofile(None)
    sys.setrecursionlimit(50000)
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(50000)
    try:
        threading.stack_size(0)
    except (ValueError, RuntimeError):
        pass
    if os.environ != saved_env:
        os.environ.clear()
        os.environ.update(saved_env)
    random.setstate(saved_random)
    decimal = sys.modules.get("decimal")
    if decimal is not None:
        decimal.setcontext(decimal.Context())
    os.umask(saved_umask)
    gc.enable()
    gc.set_threshold(*saved_gc)
    signal.alarm(0)
    for sig, handler in saved_signals.items():
        try:
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        except (OSError, ValueError, TypeError):
            pass
    os.chdir(work)
    wipe(work)
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    os.closerange(5, 1 << 20)  # descriptors the test left open

def std_streams():
    """Fresh ``sys.stdin``/``stdout``/``stderr`` on descriptors 0/1/2, as a Python interpreter makes them."""
    import io

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)),
                                                 encoding="utf-8", errors="surrogateescape")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "wb", closefd=False)),
                                                   encoding="utf-8", errors="surrogateescape")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "wb", closefd=False)),
                                                   encoding="utf-8", errors="backslashreplace", line_buffering=True)


def join_threads(threading):
    while True:
        pending = [t for t in threading.enumerate()
                   if t is not threading.current_thread() and not t.daemon and t.is_alive()]
        if not pending:
            return
        for thread in pending:
            thread.join()
