"""Sandbox-side zygote: runs untrusted programs on test inputs in confined children it forks.

Executed as a script (``python -I -S -B -X utf8 _runner.py CONFIG_JSON``) by
:class:`mars2.sandbox.pool.Slot`, inside the slot's sandbox (bubblewrap, or a plain process at the
weaker isolation level); never imported by the grader except for :func:`probe` (``--probe``). It uses
only the standard library plus :mod:`lcb_reference` (LiveCodeBench's own harness code, for
``parity=lcb``), found next to this file.

Process model. The zygote starts once per worker slot, imports LiveCodeBench's preamble modules (and,
when the first ``parity=lcb`` program comes, LiveCodeBench's harness, ``unittest.mock`` and numpy),
then serves requests from the grader on its stdin/stdout pipes (length-prefixed frames, see
:func:`read_frame`): a program, then its tests one at a time. The zygote
never executes program code; it forks a *test process* that

1. gets its own scratch directory, stdin/stdout/stderr files, and no other descriptor;
2. sets rlimits (CPU, address space, file size, open files, processes, no core), drops to the slot's
   dedicated unprivileged uid/gid (when the zygote may), sets no-new-privs and parent-death SIGKILL,
   applies Landlock (weaker level only) and a seccomp filter (no ptrace, no sockets but AF_UNIX, no
   namespaces, no io_uring, no SysV/mq IPC, no kernel-admin calls; when tests share the zygote's uid
   also no signal to the zygote, and at the weaker level without a dedicated uid no process creation
   and no ``kill(-1)``);
3. runs the tests:

   * ``parity=script`` (default): one test process per program runs its tests one after the other,
     each as a real script in a fresh ``__main__`` module with fresh stdin/stdout/stderr files and a
     wiped scratch directory, the process state a program may change put back between tests; a test
     that crashes, times out or leaves a thread or process running ends the process, and the next
     test gets a fresh one. ``isolate_tests``: a freshly forked process per test instead.
   * ``parity=lcb``: one test process per program runs LiveCodeBench's own ``run_test`` logic (its
     ``reliability_guard``, the stdin program wrapped in ``wrapped_function``, mocked stdin, captured
     ``sys.stdout``, one ``Solution()`` instance shared by the tests).

The zygote measures each test's CPU time (``/proc``, ``wait4``), enforces the wall-clock deadline,
kills every process a test process left behind (``kill(-1, SIGKILL)`` inside the pid namespace, or by
uid) and sends the grader the raw stdout (stdin tests) or the typed-JSON return value
(:func:`encode_value`, functional tests) with the status. The expected outputs never enter the
sandbox: the grader compares.
"""

import errno
import fcntl
import json
import mmap
import os
import resource
import select
import signal
import struct
import sys
import time

FRAME = struct.Struct("<II")
_dumps = json.dumps  # bound once: a program patching json in its own process does not break our records
_mmap = mmap.mmap
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 1 << 30
RECORD_CAP = 64 * 1024
PREMADE_OPEN_MOCKS = 16  # parity=lcb: tests per program served by mock_open()s made in the zygote
STDERR_TAIL = 4096

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
PROGRAM_NAME = "solution.py"
TRACEBACK_FRAMES = 12
MAX_VALUE_DEPTH = 500

# exit codes of a test child that never reached the program
EXIT_SETUP_FAILED = 121

# --------------------------------------------------------------------------------------------------
# framing


def _read_exact(fd, n):
    chunks = []
    while n:
        try:
            chunk = os.read(fd, min(n, 1 << 20))
        except InterruptedError:
            continue
        if not chunk:
            raise EOFError("control pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    """One frame: ``<header length><payload length>`` (two little-endian u32), JSON header, raw payload."""
    hlen, plen = FRAME.unpack(_read_exact(fd, FRAME.size))
    if hlen > MAX_HEADER or plen > MAX_PAYLOAD:
        raise ValueError("oversized frame")
    header = json.loads(_read_exact(fd, hlen).decode("utf-8"))
    payload = _read_exact(fd, plen) if plen else b""
    return header, payload


def write_frame(fd, header, payload=b""):
    data = _dumps(header).encode("utf-8")
    buf = FRAME.pack(len(data), len(payload)) + data + payload
    view = memoryview(buf)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]


# --------------------------------------------------------------------------------------------------
# seccomp and landlock through ctypes (no third-party package)

_ARCHES = {
    # machine: (AUDIT_ARCH, {name: nr})
    "x86_64": (0xC000003E, {
        "socket": 41, "clone": 56, "fork": 57, "vfork": 58, "kill": 62, "ptrace": 101, "syslog": 103,
        "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153, "modify_ldt": 154, "pivot_root": 155,
        "_sysctl": 156, "chroot": 161, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167,
        "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176,
        "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212, "mq_open": 240, "kexec_load": 246,
        "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
        "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
        "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "clone3": 435, "pidfd_getfd": 438, "shmget": 29, "semget": 64, "msgget": 68,
        "tkill": 200, "tgkill": 234, "pidfd_open": 434,
    }),
    "aarch64": (0xC00000B7, {
        "socket": 198, "clone": 220, "kill": 129, "ptrace": 117, "syslog": 116, "vhangup": 58, "pivot_root": 41,
        "chroot": 51, "acct": 89, "mount": 40, "umount2": 39, "swapon": 224, "swapoff": 225, "reboot": 142,
        "init_module": 105, "delete_module": 106, "quotactl": 60, "nfsservctl": 42, "lookup_dcookie": 18,
        "mq_open": 180, "kexec_load": 104, "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97,
        "perf_event_open": 241, "fanotify_init": 262, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273,
        "kexec_file_load": 294, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "clone3": 435, "pidfd_getfd": 438, "shmget": 194, "semget": 190, "msgget": 186,
        "tkill": 130, "tgkill": 131, "pidfd_open": 434,
    }),
}
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root", "chroot", "swapon",
    "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "unshare", "setns", "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at",
    "name_to_handle_at", "acct", "quotactl", "syslog", "shmget", "semget", "msgget", "mq_open", "fanotify_init",
    "lookup_dcookie", "vhangup", "iopl", "ioperm", "modify_ldt", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl",
)
CLONE_THREAD = 0x00010000
CLONE_NEW_ANY = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x04000000 | 0x08000000 | 0x02000000 | 0x80
AF_UNIX = 1
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000


_LIBC = []


def _libc():
    """The C library through ctypes (the interpreter's own symbols; loaded once, before any fork)."""
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def seccomp_program(no_process_creation=False, no_kill_all=False, protect_pid=None):
    """The BPF program (bytes of ``struct sock_filter``) of our seccomp policy, or None on an unknown arch.

    ``no_process_creation``: fork/vfork/clone without CLONE_THREAD fail (EAGAIN). ``no_kill_all``:
    ``kill(pid <= 0, ...)`` fails. ``protect_pid``: no signal can be sent to that pid (the zygote, when
    tests share its uid) and ``pidfd_open`` fails.
    """
    machine = os.uname().machine
    if machine not in _ARCHES:
        return None
    arch, nrs = _ARCHES[machine]
    # a tiny assembler: ("ld", off) | ("jeq", k, label_true) | ("jset", k, label_true) | ("ret", k) | ("label", n)
    prog = [("ld", 4), ("jne", arch, "kill"), ("ld", 0)]
    if machine == "x86_64":
        prog.append(("jge", 0x40000000, "eperm"))  # the x32 ABI
    for name in DENIED:
        if name in nrs:
            prog.append(("jeq", nrs[name], "eperm"))
    prog.append(("jeq", nrs["clone3"], "enosys"))  # glibc falls back to clone(), whose flags we can inspect
    prog.append(("jeq", nrs["socket"], "socket"))
    prog.append(("jeq", nrs["clone"], "clone"))
    for name in ("fork", "vfork"):
        if name in nrs and no_process_creation:
            prog.append(("jeq", nrs[name], "eagain"))
    if no_kill_all or protect_pid is not None:
        prog.append(("jeq", nrs["kill"], "kill_check"))
    if protect_pid is not None:
        prog.append(("jeq", nrs["tkill"], "tkill_check"))
        prog.append(("jeq", nrs["tgkill"], "tkill_check"))
        prog.append(("jeq", nrs["pidfd_open"], "eperm"))
    prog += [("ret", _RET_ALLOW),
             ("label", "socket"), ("ld", 16), ("jeq", AF_UNIX, "allow"), ("ret", _RET_ERRNO | errno.EACCES),
             ("label", "clone"), ("ld", 16), ("jset", CLONE_NEW_ANY, "eperm")]
    if no_process_creation:
        prog += [("jset", CLONE_THREAD, "allow"), ("ret", _RET_ERRNO | errno.EAGAIN)]
    else:
        prog += [("ret", _RET_ALLOW)]
    if no_kill_all or protect_pid is not None:
        # kill(pid, sig) with pid <= 0 (process groups, -1): the low word is 0 or has its sign bit set
        prog += [("label", "kill_check"), ("ld", 16)]
        if protect_pid is not None:
            prog += [("jeq", protect_pid, "eperm")]
        prog += [("jeq", 0, "eperm"), ("jset", 0x80000000, "eperm"), ("ret", _RET_ALLOW)]
    if protect_pid is not None:
        prog += [("label", "tkill_check"), ("ld", 16), ("jeq", protect_pid, "eperm"), ("ret", _RET_ALLOW)]
    prog += [("label", "allow"), ("ret", _RET_ALLOW),
             ("label", "eperm"), ("ret", _RET_ERRNO | errno.EPERM),
             ("label", "eagain"), ("ret", _RET_ERRNO | errno.EAGAIN),
             ("label", "enosys"), ("ret", _RET_ERRNO | errno.ENOSYS),
             ("label", "kill"), ("ret", _RET_KILL_PROCESS)]
    labels = {}
    pos = 0
    for ins in prog:
        if ins[0] == "label":
            labels[ins[1]] = pos
        else:
            pos += 1
    out = []
    pos = 0
    for ins in prog:
        op = ins[0]
        if op == "label":
            continue
        if op == "ld":
            out.append((0x20, 0, 0, ins[1]))  # BPF_LD | BPF_W | BPF_ABS
        elif op == "ret":
            out.append((0x06, 0, 0, ins[1]))  # BPF_RET | BPF_K
        else:
            off = labels[ins[2]] - pos - 1
            if not 0 <= off <= 255:
                raise ValueError("seccomp program too long for a short jump")
            code = {"jeq": 0x15, "jne": 0x15, "jge": 0x35, "jset": 0x45}[op]  # BPF_JMP | JEQ/JGE/JSET | BPF_K
            out.append((code, 0, off, ins[1]) if op == "jne" else (code, off, 0, ins[1]))
        pos += 1
    return b"".join(struct.pack("<HBBI", *ins) for ins in out)


class SeccompFilter:
    """A seccomp program ready to load: the ctypes structures are built once, before any fork."""

    def __init__(self, program):
        import ctypes

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        self._buf = ctypes.create_string_buffer(program, len(program))
        self._fprog = SockFprog(len(program) // 8, ctypes.addressof(self._buf))
        self._ref = ctypes.byref(self._fprog)
        self._ctypes = ctypes

    def install(self):
        """Load the filter for this thread and its future children (sets no-new-privs first)."""
        libc = _libc()
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(self._ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if libc.prctl(22, 2, self._ref, 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            raise OSError(self._ctypes.get_errno(), "seccomp filter refused")


def install_seccomp(program):
    """Load ``program`` (from :func:`seccomp_program`) for this thread and its future children."""
    SeccompFilter(program).install()


_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE, READ_FILE, READ_DIR
_LANDLOCK_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}


def landlock_abi():
    """The kernel's Landlock ABI version, 0 when unavailable."""
    try:
        libc = _libc()
        libc.syscall.restype = __import__("ctypes").c_long
        abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
        return max(0, int(abi))
    except Exception:
        return 0


def landlock_ruleset(read_paths, write_paths):
    """A Landlock ruleset fd: read-only beneath ``read_paths``, full access beneath ``write_paths``,
    no TCP bind/connect (ABI >= 4), no signals or abstract sockets outside the domain (ABI >= 6).
    Returns ``(fd, abi)``, or ``(None, 0)`` when Landlock is unavailable."""
    import ctypes

    abi = landlock_abi()
    if abi < 1:
        return None, 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    fs_all = _LANDLOCK_FS_BY_ABI.get(abi, (1 << 16) - 1)
    net = 3 if abi >= 4 else 0
    scoped = 3 if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("<QQQ", fs_all, net, scoped)
    elif abi >= 4:
        attr = struct.pack("<QQ", fs_all, net)
    else:
        attr = struct.pack("<Q", fs_all)
    abuf = ctypes.create_string_buffer(attr)
    fd = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, abuf, len(attr), 0)
    if fd < 0:
        return None, 0
    for paths, access in ((read_paths, _LANDLOCK_FS_READ), (write_paths, fs_all)):
        for path in paths:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            is_dir = os.path.isdir(path)
            rights = access if is_dir else access & ((1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15))
            rule = ctypes.create_string_buffer(struct.pack("<Qi", rights & fs_all, pfd))
            libc.syscall(_SYS_LANDLOCK_ADD_RULE, fd, 1, rule, 0)  # LANDLOCK_RULE_PATH_BENEATH
            os.close(pfd)
    return int(fd), abi


def landlock_restrict(fd):
    import ctypes

    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(38, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")


def probe():
    """What this kernel lets a child process do (run by the grader as ``_runner.py --probe``)."""
    result = {"seccomp": False, "landlock_abi": landlock_abi(), "arch": os.uname().machine}
    program = seccomp_program(no_process_creation=True, no_kill_all=True)
    if program is not None:
        pid = os.fork()
        if pid == 0:
            try:
                install_seccomp(program)
                import socket

                try:
                    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    os._exit(2)
                except PermissionError:
                    pass
                try:
                    os.fork()
                    os._exit(3)
                except BlockingIOError:
                    pass
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        result["seccomp"] = os.waitstatus_to_exitcode(status) == 0
    return result


# --------------------------------------------------------------------------------------------------
# typed JSON for functional return values (compared by the grader, never here)


class _Opaque(Exception):
    pass


def encode_value(value, depth=0):
    """``value`` as JSON-able data that keeps what Python's ``==`` against a JSON value depends on.

    Plain JSON types stay as they are (``True`` stays distinct from ``1``, as JSON keeps it; the
    grader's ``==`` still equates them, as LiveCodeBench's does). Special cases become one-key
    objects: ``{"$int": hex}`` (|x| >= 2**53), ``{"$tuple": [...]}`` (a tuple inside the value: never
    equal to a JSON list, as in LiveCodeBench), ``{"$dict": [[k, v], ...]}`` (every dict, keys typed),
    ``{"$decimal": str}``, ``{"$fraction": [hex, hex]}``, ``{"$complex": [re, im]}``, and
    ``{"$other": type name}`` for anything else (sets, arbitrary objects, too deep): never equal.
    Subclasses of int/float/str/list/tuple/dict are reduced to their base value, so an overridden
    ``__eq__`` cannot fake a pass. NumPy scalars become the Python scalar they equal.
    """
    if depth > MAX_VALUE_DEPTH:
        raise _Opaque("nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if -(1 << 53) < value < (1 << 53) else {"$int": hex(value)}
    if kind is list:
        return [encode_value(v, depth + 1) for v in value]
    if kind is tuple:
        return {"$tuple": [encode_value(v, depth + 1) for v in value]}
    if kind is dict:
        return {"$dict": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in dict.items(value)]}
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return encode_value(int.__int__(value), depth)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [encode_value(v, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"$tuple": [encode_value(v, depth + 1) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"$dict": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in dict.items(value)]}
    module = getattr(kind, "__module__", "")
    if module == "decimal" and kind.__name__ == "Decimal":
        return {"$decimal": value.__class__.__str__(value)}
    if module == "fractions" and kind.__name__ == "Fraction":
        return {"$fraction": [hex(int.__int__(value.numerator)), hex(int.__int__(value.denominator))]}
    if kind is complex:
        return {"$complex": [value.real, value.imag]}
    if module == "numpy" and getattr(value, "shape", None) == () and hasattr(value, "item"):
        item = value.item()
        if type(item).__module__ != "numpy":
            return encode_value(item, depth + 1)
    return {"$other": kind.__name__}


def encode_value_bytes(value):
    try:
        data = encode_value(value)
    except (_Opaque, RecursionError):
        data = {"$other": "too deep"}
    try:
        return _dumps(data).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return b'{"$other": "unencodable"}'


# --------------------------------------------------------------------------------------------------
# error formatting in the child


def format_error(exc, program_path=PROGRAM_NAME):
    """The last frames of ``exc``'s traceback, from the program's first frame on."""
    import traceback

    start = exc.__traceback__
    while start is not None and start.tb_frame.f_code.co_filename != program_path:
        start = start.tb_next
    if start is None:
        start = exc.__traceback__
    frames = []
    node = start
    depth = 0
    while node is not None:
        frames.append(node)
        if len(frames) > TRACEBACK_FRAMES:
            frames.pop(0)
        depth += 1
        node = node.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, frames[0] if frames else None, chain=False))
    except BaseException:
        text = f"{type(exc).__name__}"
    if depth > len(frames):
        text = f"({depth - len(frames)} earlier frames omitted)\n{text}"
    return text[-STDERR_TAIL:]


# --------------------------------------------------------------------------------------------------
# the zygote


class Zygote:
    def __init__(self, cfg):
        self.cfg = cfg
        self.ctl_in = os.dup(0)
        self.ctl_out = os.dup(1)
        os.set_inheritable(self.ctl_in, False)
        os.set_inheritable(self.ctl_out, False)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        self.pid = os.getpid()
        self.uid = cfg.get("uid")
        self.gid = cfg.get("gid")
        self.pidns = bool(cfg.get("pidns"))
        self.scratch_root = cfg["scratch_root"]
        os.makedirs(self.scratch_root, mode=0o755, exist_ok=True)
        os.chmod(self.scratch_root, 0o755)
        self.seq = 0
        for path in cfg.get("sys_path", []):
            if path not in sys.path:
                sys.path.append(path)
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.append(here)
        if hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(50000)  # LiveCodeBench's harness sets this at import
        import site

        site.setquit()  # exit() and quit(), which -S leaves out
        self.preamble = compile(PREAMBLE, "<preamble>", "exec")
        # the preamble only imports: run it once here, children copy the names it binds
        self.preamble_names = {}
        exec(self.preamble, self.preamble_names)
        self.preamble_names.pop("__builtins__", None)
        import atexit  # noqa: F401
        import builtins  # noqa: F401
        import threading  # noqa: F401
        import traceback  # noqa: F401
        import types  # noqa: F401

        self.lcb = None
        self.open_mocks = []
        seccomp_on = cfg.get("seccomp", False)
        shared_uid = self.uid is None  # tests run as our own uid: keep them from signalling us
        program = seccomp_program(no_process_creation=cfg.get("deny_fork", False),
                                  no_kill_all=not self.pidns or shared_uid,
                                  protect_pid=os.getpid() if shared_uid else None) if seccomp_on else None
        self.seccomp = SeccompFilter(program) if program is not None else None
        self.landlock_fd = None
        if cfg.get("landlock"):
            self.landlock_fd, _ = landlock_ruleset(cfg.get("landlock_read", []), [self.scratch_root])
        _libc()
        self.base_vm = _vm_size()
        # not dumpable: a test running as our uid (no dedicated uid) cannot read our memory via /proc
        _libc().prctl(4, 0, 0, 0, 0)
        import gc

        gc.collect()
        gc.freeze()
        self.program = None

    def _load_lcb(self):
        """LiveCodeBench's harness, loaded the first time a ``parity=lcb`` program comes (a zygote serving
        only script programs stays smaller, and forks faster): ``lcb_reference`` and ``unittest.mock``;
        numpy, which LiveCodeBench's process has imported before its reliability_guard (testing_util
        imports it) and which cannot be imported after the guard; and the premade ``mock_open()``s."""
        if self.lcb is not None:
            return self.lcb
        import lcb_reference  # LiveCodeBench's code (mounted next to this file)
        from unittest.mock import mock_open

        try:
            import numpy  # noqa: F401
        except Exception:
            pass
        # LiveCodeBench makes a mock_open() per stdin test (~1.4 ms, more than half a trivial test's
        # cost): make them here once; each test process uses its own copies, fresh, one per test
        self.open_mocks = [mock_open() for _ in range(PREMADE_OPEN_MOCKS)]
        self.lcb = lcb_reference
        self.base_vm = _vm_size()  # a program's address-space allowance comes on top of what we map
        import gc

        gc.collect()
        gc.freeze()
        return self.lcb

    # ---- protocol -------------------------------------------------------------------------------

    def serve(self):
        write_frame(self.ctl_out, {"op": "ready", "pid": os.getpid(), "uid": os.getuid(),
                                   "child_uid": self.uid, "seccomp": self.seccomp is not None,
                                   "landlock": self.landlock_fd is not None, "base_vm": self.base_vm})
        while True:
            try:
                header, payload = read_frame(self.ctl_in)
            except EOFError:
                return
            op = header.get("op")
            if op in ("program", "test"):
                try:
                    (self.on_program if op == "program" else self.on_test)(header, payload)
                except Exception as exc:  # a bug of ours: report it (the grader restarts this slot)
                    import traceback

                    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                    sys.stderr.write(text)
                    sys.stderr.flush()
                    write_frame(self.ctl_out, {"op": "compiled" if op == "program" else "result",
                                               "status": "SETUP", "error": text[-STDERR_TAIL:]})
            elif op == "end":
                self.on_end()
            elif op == "ping":
                write_frame(self.ctl_out, {"op": "pong"})
            elif op == "exit":
                self.on_end()
                return
            else:
                write_frame(self.ctl_out, {"op": "error", "error": f"unknown op {op!r}"})

    def on_program(self, header, payload):
        self.on_end()
        source = payload.decode("utf-8", "replace")
        program = {"mode": header["mode"], "parity": header.get("parity", "script"),
                   "func_name": header.get("func_name"), "limits": header["limits"], "source": source,
                   "code": None, "session": None, "ntests": header.get("ntests", 1),
                   "isolate": bool(header.get("isolate"))}
        reply = {"op": "compiled", "status": "ok"}
        if program["parity"] == "script":
            try:
                program["code"] = compile(source, PROGRAM_NAME, "exec", dont_inherit=True)
            except BaseException as exc:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
                reply = {"op": "compiled", "status": "CE", "error": _exception_only(exc)}
            if program["code"] is not None and program["isolate"]:
                # the program's module, preamble names included, built here once: test children only
                # add to it (copying ~1000 names in each child would cost a page fault per object)
                import builtins
                import types

                module = types.ModuleType("__main__" if program["mode"] == "stdin" else "solution")
                module.__dict__.update(self.preamble_names)
                module.__file__ = PROGRAM_NAME
                module.__builtins__ = builtins
                program["module"] = module
        elif program["parity"] == "lcb":
            self._load_lcb()
        self.program = program
        write_frame(self.ctl_out, reply)

    def on_test(self, header, payload):
        program = self.program
        if program is None:
            write_frame(self.ctl_out, {"op": "result", "status": "RE", "error": "no program"})
            return
        if program["parity"] == "lcb":
            reply, out = self.test_session(program, payload, self._lcb_child)
        elif program["isolate"]:
            reply, out = self.test_script(program, payload)
        else:
            reply, out = self.test_session(program, payload, self._script_session_child)
        reply["op"] = "result"
        reply["index"] = header.get("index")
        write_frame(self.ctl_out, reply, out)

    def on_end(self):
        program = self.program
        self.program = None
        if program is not None and program.get("session") is not None:
            self._close_session(program["session"])
        self._kill_leftovers()

    # ---- one test in a fresh child (parity=script) ------------------------------------------------

    def _new_io(self, stdin_bytes, session=False):
        """A fresh scratch directory (owned by the test's uid) and anonymous in-memory files for the
        test's stdin (the input only), stdout, stderr, status record and return value.

        For a session (several tests in one process) the scratch directory is ``<dir>/work`` inside a
        directory of the zygote's, so that a test cannot leave files outside ``work``, which is wiped
        between tests; ``scratch`` is then ``<dir>`` (removed as a whole at the end)."""
        self.seq += 1
        scratch = os.path.join(self.scratch_root, f"w{self.seq}")
        if session:
            os.mkdir(scratch)
            os.chmod(scratch, 0o755)  # (our umask is 077)
            work = os.path.join(scratch, "work")
            os.mkdir(work, 0o700)
            if self.uid is not None:
                os.chown(work, self.uid, self.gid)
        else:
            os.mkdir(scratch, 0o700)
            if self.uid is not None:
                os.chown(scratch, self.uid, self.gid)
        fds = {name: os.memfd_create(f"mars2-{name}", os.MFD_CLOEXEC) for name in ("in", "out", "err", "rec", "val")}
        if stdin_bytes:
            _write_all(fds["in"], stdin_bytes)
            os.lseek(fds["in"], 0, os.SEEK_SET)
        return scratch, fds

    def _cleanup_io(self, scratch, fds):
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        _rmtree(scratch)

    def test_script(self, program, payload):
        limits = program["limits"]
        mode = program["mode"]
        if program["code"] is None:
            return {"status": "CE", "error": "program did not compile"}, b""
        scratch, fds = self._new_io(payload if mode == "stdin" else b"")
        try:
            pid = os.fork()
            if pid == 0:
                self._child(limits, scratch, fds, stdout_to_null=(mode != "stdin"))
                try:
                    self._run_script_child(program, payload)
                finally:
                    os._exit(EXIT_SETUP_FAILED)
            waited = self._wait(pid, limits["wall_s"])
            self._kill_leftovers()
            return self._collect(waited, limits, fds, mode)
        finally:
            self._cleanup_io(scratch, fds)

    def _child(self, limits, scratch, fds, stdout_to_null=False):
        """Runs in the forked child: confine it. Any failure ends the child (never runs the program)."""
        try:
            # the zygote installs no handlers; Python itself ignores SIGXFSZ (restored: the file size
            # limit kills) and SIGPIPE (kept, as in any Python program), and handles SIGINT
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if not self.pidns:
                os.setsid()  # a process group to kill (a pid namespace does better)
            out = os.open(os.devnull, os.O_WRONLY) if stdout_to_null else fds["out"]
            # move the sources out of the way first, so that no dup2 overwrites a later source
            sources = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (fds["in"], out, fds["err"], fds["rec"], fds["val"])]
            for target, fd in enumerate(sources):
                os.dup2(fd, target)
            keep = [fd for fd in (self.landlock_fd,) if fd is not None]
            lo = 5
            for fd in sorted(keep):
                os.closerange(lo, fd)
                lo = fd + 1
            os.closerange(lo, 1 << 20)
            os.chdir(scratch)
            _set_limits(limits, self.base_vm)
            if self.uid is not None:
                os.setgroups([])
                os.setresgid(self.gid, self.gid, self.gid)
                os.setresuid(self.uid, self.uid, self.uid)
            libc = _libc()
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
            if os.getppid() != self.pid:  # the zygote died before the line above
                os._exit(EXIT_SETUP_FAILED)
            libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE (reset by the uid change): a normal /proc/self
            try:  # the out-of-memory killer (slot cgroup) picks the test, never the zygote
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")
            except OSError:
                pass
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            if self.landlock_fd is not None:
                landlock_restrict(self.landlock_fd)
                os.close(self.landlock_fd)
            if self.seccomp is not None:
                self.seccomp.install()
            # the environment is already the scrubbed one the zygote was started with
        except BaseException as exc:
            try:
                os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
            finally:
                os._exit(EXIT_SETUP_FAILED)

    def _run_script_child(self, program, payload):
        """One test in this fresh child (``isolate_tests``): run it, write the record and value, exit."""
        import atexit

        atexit._clear()
        _std_streams()
        signal.setitimer(signal.ITIMER_PROF, program["limits"]["time_s"])  # SIGPROF ends us at the CPU limit
        record, value = self._exec_program(program, program["module"], payload)
        if record["status"] == "ok" and program["mode"] == "functional":
            _write_all(4, encode_value_bytes(value))
        _write_all(3, _dumps(record).encode("utf-8", "replace"))
        os._exit(0)

    def _exec_program(self, program, module, payload):
        """Run the program as a script in ``module`` on the current stdin; ``(record, return value)``.

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
                exec(program["code"], namespace)
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
            _join_threads(threading)
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
                record = {"status": "RE", "error": "error while flushing output at exit: " + _exception_only(exc)}
        return record, value

    def _grader_gone(self):
        """The grader closed our control pipe (it exited or was killed): take everything down."""
        poller = select.poll()
        poller.register(self.ctl_in, select.POLLIN)
        events = poller.poll(0)
        return bool(events) and bool(events[0][1] & (select.POLLHUP | select.POLLERR))

    def _die(self):
        self._kill_leftovers()
        os._exit(0)

    def _wait(self, pid, wall_s):
        """Wait for ``pid`` until the wall-clock deadline; kill it then. Returns (status, rusage, wall, killed).

        Also watches the control pipe: if the grader goes away, the test and the zygote end at once.
        """
        start = time.monotonic()
        deadline = start + wall_s
        killed = False
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if pidfd is not None:
                    poller = select.poll()
                    poller.register(pidfd, select.POLLIN)
                    poller.register(self.ctl_in, select.POLLHUP)
                    events = dict(poller.poll(max(1, int(remaining * 1000) + 1)))
                    if pidfd in events:
                        break
                    if self.ctl_in in events:
                        os.kill(pid, signal.SIGKILL)
                        self._die()
                else:
                    if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                        break
                    if self._grader_gone():
                        os.kill(pid, signal.SIGKILL)
                        self._die()
                    time.sleep(0.002)
            if time.monotonic() >= deadline and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                killed = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        finally:
            if pidfd is not None:
                os.close(pidfd)
        _, status, rusage = os.wait4(pid, 0)
        return status, rusage, time.monotonic() - start, killed

    def _collect(self, waited, limits, fds, mode):
        status, rusage, wall, killed = waited
        cpu = rusage.ru_utime + rusage.ru_stime
        out = _read_head(fds["out"], limits["output_bytes"]) if mode == "stdin" else b""
        err = _read_tail(fds["err"], STDERR_TAIL).decode("utf-8", "replace")
        reply = {"cpu_s": round(cpu, 4), "wall_s": round(wall, 4), "maxrss_kb": rusage.ru_maxrss}
        if killed:
            reply.update(status="TLE", error=f"wall-clock limit ({limits['wall_s']:g} s)")
            return reply, out
        if os.WIFSIGNALED(status):
            reply.update(_signal_verdict(os.WTERMSIG(status), cpu, limits, err))
            return reply, out
        if cpu > limits["time_s"]:
            reply.update(status="TLE", error=f"CPU time limit ({limits['time_s']:g} s; used {cpu:.2f} s)")
            return reply, out
        code = os.WEXITSTATUS(status)
        record = _parse_record(_read_head(fds["rec"], RECORD_CAP))
        if code == EXIT_SETUP_FAILED and record is None:
            reply.update(status="SETUP", error=_join("the sandbox could not confine the test", err))
            return reply, out
        if record is None or code != 0:
            reason = f"exited with code {code}" if code != 0 else "exited before the runner could report (os._exit?)"
            reply.update(status="RE", error=_join(reason, err))
            return reply, out
        run_status = record.get("status")
        if run_status not in ("ok", "RE", "MLE", "CE"):
            reply.update(status="RE", error="malformed runner record")
            return reply, out
        reply["status"] = run_status
        if run_status != "ok":
            reply["error"] = str(record.get("error", ""))[-STDERR_TAIL:]
        elif mode == "functional":
            out = _read_head(fds["val"], limits["output_bytes"] + 1)
            if len(out) > limits["output_bytes"]:
                reply.update(status="OLE", error=f"return value larger than {limits['output_bytes']} bytes")
                out = b""
        if mode == "stdin" and os.fstat(fds["out"]).st_size > limits["output_bytes"]:
            reply.update(status="OLE", error=f"output limit ({limits['output_bytes']} bytes) exceeded")
        return reply, out

    # ---- parity=lcb: one child per program serves every test, like LiveCodeBench's process ----------

    def test_session(self, program, payload, child_fn, retried=False):
        """One test in the program's long-lived test process (opened on demand, see :meth:`_open_session`).

        The process is closed, and the next test gets a fresh one, after a test that timed out, crashed,
        or (script mode) left threads or processes behind. If a process that already ran tests cannot
        even start the next one (an earlier test broke something the runner needs), the test is run
        again in a fresh process: only a fresh process failing that way is reported as a sandbox fault.
        """
        reply, out = self._test_session_once(program, payload, child_fn)
        session_tests = reply.pop("session_tests", 0)
        if reply.get("status") == "SETUP" and session_tests > 0 and not retried:
            return self.test_session(program, payload, child_fn, retried=True)
        return reply, out

    def _test_session_once(self, program, payload, child_fn):
        limits = program["limits"]
        session = program.get("session")
        if session is None:
            session = self._open_session(program, child_fn)
            program["session"] = session
        cpu_before = _proc_cpu(session["pid"])
        done_before = session["tests"]
        session["tests"] += 1
        start = time.monotonic()
        try:
            write_frame(session["to_child"], {"op": "test"}, payload)
            frame = self._read_child(session, start + limits["wall_s"])
        except OSError:
            frame = "eof"
        wall = time.monotonic() - start
        if not isinstance(frame, tuple):
            # "eof": the process is exiting (its pipe closes before it becomes a zombie: give it a moment)
            alive = frame == "timeout" or not _wait_exit(session["pid"], 2.0)
            self._close_session(session)
            program["session"] = None
            status, rusage = session.get("exit", (None, None))
            cpu = max(0.0, rusage.ru_utime + rusage.ru_stime - cpu_before) if rusage is not None else 0.0
            reply = {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4), "session_tests": done_before}
            if alive:
                reply.update(status="TLE", error=f"wall-clock limit ({limits['wall_s']:g} s)")
            elif status is not None and os.WIFSIGNALED(status):
                reply.update(_signal_verdict(os.WTERMSIG(status), cpu, limits))
            elif status is not None and os.WEXITSTATUS(status) == EXIT_SETUP_FAILED:
                reply.update(status="SETUP", error=_join("the test process could not start", session.get("err_tail", "")))
            elif session.get("error"):
                reply.update(status="RE", error=session["error"])
            elif program["parity"] == "lcb":
                reply.update(status="RE", error="the test process exited without a result "
                                                "(LiveCodeBench counts this as a global failure, -1)")
            else:
                code = os.WEXITSTATUS(status) if status is not None else -1
                reply.update(status="RE", error=(f"exited with code {code}" if code else
                                                 "exited before the runner could report (os._exit?)"))
            return reply, b""
        header, out = frame
        cpu = max(0.0, _proc_cpu(session["pid"]) - cpu_before)
        reply = {"status": header.get("status", "RE"), "wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
                 "session_tests": done_before}
        if reply["status"] == "SETUP":
            reply["error"] = str(header.get("error", ""))[-STDERR_TAIL:]
        elif reply["status"] not in ("ok", "RE", "MLE", "CE", "TLE"):
            reply.update(status="RE", error="malformed result from the test process")
        elif "error" in header:
            reply["error"] = str(header["error"])[-STDERR_TAIL:]
        if reply["status"] == "ok" and cpu > limits["time_s"]:
            reply.update(status="TLE", error=f"CPU time limit ({limits['time_s']:g} s; used {cpu:.2f} s)")
        if len(out) > limits["output_bytes"]:
            reply.update(status="OLE", error=f"output limit ({limits['output_bytes']} bytes) exceeded")
            out = b""
        if header.get("dirty") or reply["status"] in ("TLE", "SETUP"):
            self._close_session(session)
            program["session"] = None
        return reply, out

    def _open_session(self, program, child_fn):
        """Fork the confined process that runs this program's tests one after the other (fd 3: test
        frames in, fd 4: result frames out)."""
        limits = dict(program["limits"])
        # one process runs every test: its CPU cap covers all of them (each test is checked on its own)
        limits["time_s_total"] = (limits["time_s"] + 1) * max(1, program["ntests"]) + 1
        scratch, fds = self._new_io(b"", session=True)
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe2(os.O_CLOEXEC)
        os.set_inheritable(to_child_w, False)
        pid = os.fork()
        if pid == 0:
            # the child reads test frames on fd 3 and writes results on fd 4 (where script children
            # find their record/value files)
            self._child(limits, os.path.join(scratch, "work"), {**fds, "rec": to_child_r, "val": from_child_w},
                        stdout_to_null=False)
            try:
                child_fn(program)
            except BaseException as exc:
                try:
                    text = "test process failed: " + format_error(exc, "/sandbox/_runner.py")
                    os.write(2, text.encode("utf-8", "replace"))
                    write_frame(4, {"status": "SETUP", "error": text})
                finally:
                    os._exit(EXIT_SETUP_FAILED)
            finally:
                os._exit(EXIT_SETUP_FAILED)
        os.close(to_child_r)
        os.close(from_child_w)
        return {"pid": pid, "to_child": to_child_w, "from_child": from_child_r, "buf": b"", "scratch": scratch,
                "fds": fds, "dead": False, "tests": 0}

    def _read_child(self, session, deadline):
        """One ``(header, payload)`` frame from the test process before ``deadline``; else ``"timeout"``
        or ``"eof"`` (it exited, or sent something malformed)."""
        fd = session["from_child"]
        buf = session["buf"]
        while True:
            if len(buf) >= FRAME.size:
                hlen, plen = FRAME.unpack(buf[:FRAME.size])
                if hlen > RECORD_CAP or plen > self.program["limits"]["output_bytes"] + 1:
                    session["error"] = "malformed or oversized result from the test process"
                    return "eof"
                total = FRAME.size + hlen + plen
                if len(buf) >= total:
                    try:
                        header = json.loads(buf[FRAME.size:FRAME.size + hlen].decode("utf-8"))
                    except (ValueError, UnicodeDecodeError):
                        session["error"] = "malformed result from the test process"
                        return "eof"
                    session["buf"] = buf[total:]
                    return (header if isinstance(header, dict) else {}), buf[FRAME.size + hlen:total]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.register(self.ctl_in, select.POLLHUP)
            events = dict(poller.poll(max(1, int(remaining * 1000) + 1)))
            if self.ctl_in in events and fd not in events:
                self._close_session(session)
                self._die()
            if fd not in events:
                return "timeout"
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return "eof"
            buf += chunk
            session["buf"] = buf

    def _close_session(self, session):
        if session.get("closed"):
            return
        session["closed"] = True
        for key in ("to_child", "from_child"):
            try:
                os.close(session[key])
            except OSError:
                pass
        try:
            os.kill(session["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            _, status, rusage = os.wait4(session["pid"], 0)
            session["exit"] = (status, rusage)
        except ChildProcessError:
            pass
        try:
            session["err_tail"] = _read_tail(session["fds"]["err"], STDERR_TAIL).decode("utf-8", "replace")
        except OSError:
            pass
        self._cleanup_io(session["scratch"], session["fds"])
        self._kill_leftovers()

    def _script_session_child(self, program):
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
        # bound now: a program replacing these module attributes cannot take our bookkeeping down with it
        setitimer, ITIMER_PROF, waitpid, WNOHANG = signal.setitimer, signal.ITIMER_PROF, os.waitpid, os.WNOHANG
        _exit = os._exit
        read_head = _read_head
        n = 0
        while True:
            try:
                _, payload = read_frame(3)
            except EOFError:
                os._exit(0)
            n += 1
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
                    _write_all(fd, data)
                    os.lseek(fd, 0, os.SEEK_SET)
                fds.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64))
                os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            _std_streams()
            os.chdir(work)
            module = types.ModuleType(name)
            module.__dict__.update(self.preamble_names)
            module.__file__ = PROGRAM_NAME
            module.__builtins__ = builtins
            signal.setitimer(signal.ITIMER_PROF, limits["time_s"])  # SIGPROF ends us at the CPU limit
            record, value = self._exec_program(program, module, payload)
            # from here on the program has run: whatever it broke is its own failure, never a sandbox fault
            out = b""
            try:
                setitimer(ITIMER_PROF, 0)
                if record["status"] == "ok":
                    try:
                        out = (read_head(fds[1], limits["output_bytes"] + 1) if mode == "stdin"
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
                record = {"status": "RE", "error": "the program broke the test runner: " + _exception_only(exc)}
                dirty = True
            record["dirty"] = dirty or record["status"] == "MLE"  # a fresh heap for the next test
            try:
                self._reset_after_test(saved_builtins, saved_sys, saved_path, saved_meta_path, saved_path_hooks,
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

    def _reset_after_test(self, saved_builtins, saved_sys, saved_path, saved_meta_path, saved_path_hooks,
                          saved_thread_hook, saved_env, saved_random, saved_umask, saved_gc, saved_signals, work,
                          fds):
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
        _wipe(work)
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        os.closerange(5, 1 << 20)  # descriptors the test left open

    def _lcb_child(self, program):
        """LiveCodeBench's ``run_test`` loop, serving one test per frame (fd 3 in, fd 4 out)."""
        import io

        lcb = self.lcb
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)),
                                                     encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "wb", closefd=False)),
                                                       encoding="utf-8")
        ctl_in, ctl_out = 3, 4
        limits = program["limits"]
        timeout = max(1, int(limits["time_s"] + 0.999999))
        signal.signal(signal.SIGALRM, lcb.timeout_handler)
        lcb.reliability_guard()
        mode = program["mode"]
        code = program["source"]
        method = None
        setup_error = None
        try:
            if mode == "functional":
                compiled = lcb.compile_code(lcb.import_string + "\n\n" + code, timeout)
                method = lcb.get_function(compiled, program["func_name"])
            else:
                code = lcb.make_function(lcb.clean_if_name(code))
                compiled = lcb.compile_code(code, timeout)
                method = lcb.get_function(compiled, "wrapped_function")
            if method is None:
                setup_error = "the program does not define the function LiveCodeBench calls"
        except SyntaxError as exc:
            setup_error = ("CE", _exception_only(exc))
        except MemoryError as exc:
            setup_error = ("MLE", repr(exc))
        except Exception as exc:  # as LiveCodeBench: an error while compiling fails every test (-4)
            setup_error = ("TLE" if "timeoutexception" in repr(exc).lower() else "RE", repr(exc))
        if isinstance(setup_error, str):
            setup_error = ("RE", setup_error)
        while True:
            try:
                header, payload = read_frame(ctl_in)
            except EOFError:
                os._exit(0)
            if setup_error is not None:
                write_frame(ctl_out, {"status": setup_error[0], "error": setup_error[1]})
                continue
            text = payload.decode("utf-8")
            if mode == "functional":
                result, out = self._lcb_call(lcb, method, text, timeout)
            else:
                result, out = self._lcb_stdio(lcb, method, text, timeout)
            write_frame(ctl_out, result, out)

    def _lcb_call(self, lcb, method, text, timeout):
        try:
            args = [json.loads(line) for line in text.split("\n")]
        except ValueError as exc:
            return {"status": "RE", "error": f"Error during testing: {exc}"}, b""
        signal.alarm(timeout)
        try:
            prediction = method(*args)
            signal.alarm(0)
            if isinstance(prediction, tuple):
                prediction = list(prediction)
            return {"status": "ok"}, encode_value_bytes(prediction)
        except MemoryError as exc:
            signal.alarm(0)
            return {"status": "MLE", "error": repr(exc)}, b""
        except Exception as exc:
            signal.alarm(0)
            if "timeoutexception" in repr(exc).lower():
                return {"status": "TLE", "error": repr(exc)}, b""
            return {"status": "RE", "error": repr(exc)}, b""
        finally:
            signal.alarm(0)

    def _lcb_stdio(self, lcb, method, text, timeout):
        open_mock = None
        if self.open_mocks:
            try:
                open_mock = premade_open_mock(self.open_mocks.pop(), text)
            except Exception:  # (a MemoryError, the program broke io, another mock_open): call_method makes a
                pass  # fresh one and fails there, if it must, inside the test as LiveCodeBench does
        signal.alarm(timeout)
        error = None
        with lcb.Capturing() as captured:
            try:
                lcb.call_method(method, text, open_mock)
                signal.alarm(0)
            except MemoryError as exc:
                signal.alarm(0)
                error = ("MLE", repr(exc))
            except Exception as exc:
                signal.alarm(0)
                error = ("TLE" if "timeoutexception" in repr(exc).lower() else "RE", repr(exc))
            finally:
                signal.alarm(0)
        if error is not None:
            return {"status": error[0], "error": error[1]}, b""
        return {"status": "ok"}, captured[0].encode("utf-8", "surrogatepass")

    # ---- cleanup ----------------------------------------------------------------------------------

    def _kill_leftovers(self):
        """Kill every process a test left behind (daemons, setsid() escapees), then wait until gone."""
        if self.pidns:
            me = os.getpid()
            others = _ns_pids(me)
            if not others:
                return
            try:
                os.kill(-1, signal.SIGKILL)  # everything in our pid namespace but us and its init
            except ProcessLookupError:
                return
            _reap_children()
            deadline = time.monotonic() + 5.0
            while _ns_pids(me) and time.monotonic() < deadline:
                _reap_children()
                time.sleep(0.005)
        elif self.uid is not None:
            pid = os.fork()
            if pid == 0:
                try:
                    os.setgroups([])
                    os.setresgid(self.gid, self.gid, self.gid)
                    os.setresuid(self.uid, self.uid, self.uid)
                    for _ in range(3):
                        try:
                            os.kill(-1, signal.SIGKILL)  # every process of the slot's own uid but us
                        except ProcessLookupError:
                            break
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
            _reap_children()
        else:
            _reap_children()


# --------------------------------------------------------------------------------------------------
# helpers


def _ns_pids(me):
    """Pids in our (small) pid namespace other than init (1) and ``me``."""
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
    except OSError:
        return []


def _reap_children():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait_exit(pid, timeout):
    """Wait (without reaping) until ``pid`` has exited; False if it still runs after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def _alive(pid):
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def _proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    except (OSError, ValueError, IndexError):
        return 0.0


def _vm_size():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _set_limits(limits, base_vm):
    cpu = int(limits.get("time_s_total", limits["time_s"]) + 0.999999)
    memory = int(limits["memory_mb"]) << 20
    wanted = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory + base_vm, memory + base_vm),
        (resource.RLIMIT_FSIZE, limits["output_bytes"], limits["output_bytes"]),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
    ]
    if limits.get("nproc"):
        wanted.append((resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"]))
    for res, soft, hard in wanted:
        cur_soft, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))


def _std_streams():
    """Fresh ``sys.stdin``/``stdout``/``stderr`` on descriptors 0/1/2, as a Python interpreter makes them."""
    import io

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)),
                                                 encoding="utf-8", errors="surrogateescape")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "wb", closefd=False)),
                                                   encoding="utf-8", errors="surrogateescape")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "wb", closefd=False)),
                                                   encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _join_threads(threading):
    while True:
        pending = [t for t in threading.enumerate()
                   if t is not threading.current_thread() and not t.daemon and t.is_alive()]
        if not pending:
            return
        for thread in pending:
            thread.join()


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_head(fd, limit):
    size = min(os.fstat(fd).st_size, limit)
    chunks = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _read_tail(fd, limit):
    size = os.fstat(fd).st_size
    start = max(0, size - limit)
    return os.pread(fd, size - start, start)


def _parse_record(data):
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _exception_only(exc):
    import traceback

    try:
        return "".join(traceback.format_exception_only(type(exc), exc)).strip()
    except BaseException:
        return type(exc).__name__


def _join(*parts):
    return "\n".join(p.strip() for p in parts if p and p.strip())


def premade_open_mock(mock, read_data):
    """``mock``, a ``unittest.mock.mock_open()`` made ahead of time and never used, turned into what
    ``mock_open(read_data=read_data)`` returns: its ``reset_data`` closure (the side effect each ``open()``
    call runs) gets the data in its ``read_data`` cell, and running it once puts the handle's stream and
    readline generator where a fresh mock has them. Raises (``ValueError``, ...) when this Python's
    ``mock_open`` is built differently."""
    reset = mock.side_effect
    cell = reset.__closure__[reset.__code__.co_freevars.index("read_data")]
    cell.cell_contents = read_data
    reset()
    return mock


def _signal_verdict(sig, cpu, limits, err=""):
    """Status fields for a test process killed by ``sig`` after ``cpu`` seconds of CPU."""
    if sig in (signal.SIGXCPU, signal.SIGPROF) or (sig == signal.SIGKILL and cpu >= limits["time_s"]):
        return {"status": "TLE", "error": f"CPU time limit ({limits['time_s']:g} s)"}
    if sig == signal.SIGXFSZ:
        return {"status": "OLE", "error": f"output limit ({limits['output_bytes']} bytes) exceeded"}
    return {"status": "SIGNAL", "signal": sig, "error": _join(f"killed by signal {_signame(sig)}", err)}


def _signame(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _wipe(directory):
    """Remove everything inside ``directory`` (ours), even entries a program made unreadable."""
    import shutil

    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for name in entries:
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                for root, dirs, _ in os.walk(path):
                    for d in dirs:
                        try:
                            os.chmod(os.path.join(root, d), 0o700)
                        except OSError:
                            pass
                os.chmod(path, 0o700)
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def _rmtree(path):
    try:
        os.rmdir(path)  # the usual case: the program wrote nothing
    except OSError:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def main(argv):
    if len(argv) > 1 and argv[1] == "--probe":
        sys.stdout.write(_dumps(probe()) + "\n")
        sys.stdout.flush()
        return
    cfg = json.loads(argv[1])
    os.umask(0o077)
    zygote = Zygote(cfg)
    if os.environ.get("MARS2_SANDBOX_PROFILE"):  # development aid: profile the zygote, stats to stderr
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(zygote.serve)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(15)
        return
    zygote.serve()


if __name__ == "__main__":
    main(sys.argv)
