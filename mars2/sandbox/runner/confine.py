"""Confinement of a test process, applied in the child right after the zygote forks it, and the probe of
what this kernel allows (``_runner.py --probe``, run by :func:`mars2.sandbox.isolation.probe_isolation`).

A test process gets its own scratch directory, stdin/stdout/stderr files and no other descriptor; rlimits
(CPU, address space, file size, open files, processes, no core); the slot's dedicated unprivileged uid/gid
(when the zygote may); no-new-privs and parent-death SIGKILL; Landlock (weaker level only) and the seccomp
filter (:mod:`.seccomp`).
"""

import fcntl
import os
import resource
import signal

from .landlock import landlock_abi, landlock_restrict
from .libc import libc as _libc
from .seccomp import install_seccomp, seccomp_program

# exit codes of a test child that never reached the program
EXIT_SETUP_FAILED = 121


def confine_test_process(limits, scratch, fds, *, zygote_pid, uid, gid, pidns, base_vm, landlock_fd, seccomp,
                         stdout_to_null=False):
    """Runs in the forked child: confine it. Any failure ends the child (never runs the program).

    Descriptors 0-4 become ``fds`` ``in``, ``out`` (or /dev/null), ``err``, ``rec``, ``val`` and every other one
    but ``landlock_fd`` is closed; cwd ``scratch``; rlimits (:func:`set_limits`); ``uid``/``gid`` when given;
    parent-death SIGKILL (ends at once if the zygote ``zygote_pid`` is already gone); no-new-privs; the
    Landlock ruleset ``landlock_fd`` and the seccomp filter ``seccomp`` (a ``SeccompFilter``) when given."""
    try:
        # the zygote installs no handlers; Python itself ignores SIGXFSZ (restored: the file size
        # limit kills) and SIGPIPE (kept, as in any Python program), and handles SIGINT
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if not pidns:
            os.setsid()  # a process group to kill (a pid namespace does better)
        out = os.open(os.devnull, os.O_WRONLY) if stdout_to_null else fds["out"]
        # move the sources out of the way first, so that no dup2 overwrites a later source
        sources = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (fds["in"], out, fds["err"], fds["rec"], fds["val"])]
        for target, fd in enumerate(sources):
            os.dup2(fd, target)
        keep = [fd for fd in (landlock_fd,) if fd is not None]
        lo = 5
        for fd in sorted(keep):
            os.closerange(lo, fd)
            lo = fd + 1
        os.closerange(lo, 1 << 20)
        os.chdir(scratch)
        set_limits(limits, base_vm)
        if uid is not None:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
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
        if landlock_fd is not None:
            landlock_restrict(landlock_fd)
            os.close(landlock_fd)
        if seccomp is not None:
            seccomp.install()
        # the environment is already the scrubbed one the zygote was started with
    except BaseException as exc:
        try:
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        finally:
            os._exit(EXIT_SETUP_FAILED)


def set_limits(limits, base_vm):
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
