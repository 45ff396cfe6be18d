"""Confinement of a test process, applied in the child right after the zygote forks it, and the probe of
what this kernel allows (``_entry.py --probe``, run by :func:`mars2.sandbox.isolation.probe_isolation`).

A test process gets its own scratch directory, stdin/stdout/stderr files and no other descriptor; rlimits
(CPU, address space, file size, open files, processes, no core); the slot's dedicated unprivileged uid/gid
(when the zygote may); no capability in any set (effective, permitted, inheritable, ambient, bounding); no-new-privs
and parent-death SIGKILL; Landlock (weaker level: read-only system paths, writes only in its own scratch directory)
and the seccomp filter (:mod:`.seccomp`).

The zygote learns that the confinement is complete from one byte on the *ready* descriptor (5), written and
closed by :func:`signal_ready` right before the program's code is first compiled: a test process that ends
without it failed in the sandbox's own set-up; anything after it is the program's doing, whatever its exit status
or the bytes it writes, so no program can pass its failure off as the sandbox's.
"""

import ctypes
import fcntl
import os
import resource
import signal
import sys

from .landlock import landlock_abi, landlock_restrict, landlock_ruleset
from .libc import libc as _libc
from .seccomp import install_seccomp, seccomp_program

# exit code of a test child whose own set-up (ours, not the program's) failed; the zygote decides by the ready byte
EXIT_SETUP_FAILED = 121
READY_FD = 5
PROGRAM_RECURSION_LIMIT = 50000  # LiveCodeBench's harness sets it; the zygote itself keeps Python's default
_CAPABILITY_V3 = 0x20080522
_CAP_SETPCAP = 8
_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE and KEEP_CAPS off, each locked: uid 0 never regains a capability
_SECUREBITS_LOCKED = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
_ready_sent = []
_write, _close = os.write, os.close  # bound once: LiveCodeBench's reliability_guard nulls parts of os


def confine_test_process(limits, scratch, fds, *, zygote_pid, uid, gid, pidns, base_vm, landlock_read, seccomp,
                         stdout_to_null=False):
    """Runs in the forked child: confine it. Any failure ends the child (never runs the program).

    Descriptors 0-5 become ``fds`` ``in``, ``out`` (or /dev/null), ``err``, ``rec``, ``val``, ``ready`` and every
    other one is closed; cwd ``scratch``; rlimits (:func:`set_limits`); ``uid``/``gid`` when given; no capabilities
    (:func:`drop_capabilities`); parent-death SIGKILL (ends at once if the zygote ``zygote_pid`` is already gone);
    no-new-privs; a Landlock ruleset reading ``landlock_read`` and writing ``scratch`` only, when ``landlock_read``
    is given; the seccomp filter ``seccomp`` (a ``SeccompFilter``) when given."""
    try:
        # the zygote installs no handlers; Python itself ignores SIGXFSZ (restored: the file size
        # limit kills) and SIGPIPE (kept, as in any Python program), and handles SIGINT
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if not pidns:
            os.setsid()  # a process group to kill (a pid namespace does better)
        out = os.open(os.devnull, os.O_WRONLY) if stdout_to_null else fds["out"]
        # move the sources out of the way first, so that no dup2 overwrites a later source
        sources = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100)
                   for fd in (fds["in"], out, fds["err"], fds["rec"], fds["val"], fds["ready"])]
        for target, fd in enumerate(sources):
            os.dup2(fd, target)
        os.closerange(READY_FD + 1, 1 << 20)
        os.chdir(scratch)
        ruleset = landlock_ruleset(landlock_read, [scratch])[0] if landlock_read is not None else None
        if landlock_read is not None and ruleset is None:
            raise OSError("Landlock ruleset refused")
        set_limits(limits, base_vm)
        if uid is not None:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        drop_capabilities()
        libc = _libc()
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != zygote_pid:  # the zygote died before the line above
            os._exit(EXIT_SETUP_FAILED)
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE (reset by the uid change): a normal /proc/self
        try:  # the out-of-memory killer (slot cgroup) picks the test, never the zygote
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        if ruleset is not None:
            landlock_restrict(ruleset)
            os.close(ruleset)
        if seccomp is not None:
            seccomp.install()
        sys.setrecursionlimit(PROGRAM_RECURSION_LIMIT)
        # the environment is already the scrubbed one the zygote was started with
    except BaseException as exc:
        try:
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        finally:
            os._exit(EXIT_SETUP_FAILED)


def signal_ready():
    """Tell the zygote that the confinement is complete: write the ready byte and close the descriptor, so that the
    program, which runs after this, cannot use it. Called once, right before the program's code is compiled."""
    if not _ready_sent:
        _ready_sent.append(True)
        try:
            _write(READY_FD, b"R")
        finally:
            _close(READY_FD)


def drop_capability(cap):
    """Remove capability ``cap`` from this process's effective, permitted and inheritable sets (the zygote gives up
    CAP_SYS_ADMIN once it has hidden the other processes)."""
    libc = _libc()
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_V3, 0)
    sets = (ctypes.c_uint32 * 6)()
    if libc.capget(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    word, bit = divmod(cap, 32)
    for i in range(3):  # (effective, permitted, inheritable) for capabilities 0-31, then for 32-63
        sets[3 * word + i] &= ~(1 << bit) & 0xFFFFFFFF
    if libc.capset(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def drop_capabilities():
    """Empty every capability set of this process. Still holding CAP_SETPCAP (root outside a user namespace: the
    ``process`` level without a dedicated uid), it first locks the securebits (uid 0 never regains a capability) and
    empties the bounding set; then the ambient, effective, permitted and inheritable sets are cleared, and checked."""
    libc = _libc()
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_V3, 0)
    held = (ctypes.c_uint32 * 6)()
    if libc.capget(header, held) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    if held[0] & (1 << _CAP_SETPCAP):
        libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKED, 0, 0, 0)
        for cap in range(64):
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last capability
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if any(held):
        if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
            raise OSError(ctypes.get_errno(), "capset failed")
        if libc.capget(header, held) != 0 or any(held):
            raise OSError("capabilities remain after dropping them")


# Every other inherited rlimit, clamped to a value of ours (never raised past what the grader holds): no real-time
# priority or time, no priority above the default, a little locked memory, few queued signals. (RLIMIT_LOCKS: Linux
# enforces it no more; Python does not name it.)
CLAMPED_LIMITS = {"RLIMIT_RTPRIO": 0, "RLIMIT_RTTIME": 0, "RLIMIT_NICE": 0, "RLIMIT_MEMLOCK": 64 << 10,
                  "RLIMIT_SIGPENDING": 256}


def set_limits(limits, base_vm):
    """Every rlimit a test process has: CPU, address space and data (the memory allowance on top of the runner's
    own mappings), stack (at most the memory allowance), output file size, no core, open files, no message queues,
    processes when asked, and :data:`CLAMPED_LIMITS`."""
    cpu = int(limits.get("time_s_total", limits["time_s"]) + 0.999999)
    memory = int(limits["memory_mb"]) << 20
    stack_soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack_soft = memory if stack_soft == resource.RLIM_INFINITY else min(stack_soft, memory)
    wanted = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, memory + base_vm, memory + base_vm),
        (resource.RLIMIT_DATA, memory + base_vm, memory + base_vm),
        (resource.RLIMIT_STACK, stack_soft, memory),
        (resource.RLIMIT_FSIZE, limits["output_bytes"], limits["output_bytes"]),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
        *((getattr(resource, name), value, value) for name, value in CLAMPED_LIMITS.items()),
    ]
    if limits.get("nproc"):
        wanted.append((resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"]))
    for res, soft, hard in wanted:
        cur_soft, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))


def probe():
    """What this kernel lets a child process do (run by the grader as ``_entry.py --probe``)."""
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
    result["private_mounts"] = _probe_private_mounts()
    return result


def _probe_private_mounts():
    """Whether a child may enter a mount namespace of its own and mount a tmpfs there (root with CAP_SYS_ADMIN)."""
    import tempfile

    from .mounts import enter_private_mount_namespace

    target = tempfile.mkdtemp(prefix="mars2-probe-")
    try:
        pid = os.fork()
        if pid == 0:
            try:
                enter_private_mount_namespace()
                libc = ctypes.CDLL(None, use_errno=True)
                os._exit(0 if libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", 0, b"size=4096") == 0 else 1)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0
    finally:
        os.rmdir(target)
