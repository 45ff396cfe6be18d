"""Sandbox-side zygote: runs untrusted programs on test inputs in confined children it forks.

Started through the entry script ``mars2/sandbox/_entry.py`` (``python -I -S -B -X utf8 _entry.py
CONFIG_JSON``) by :class:`mars2.sandbox.pool.Slot`, inside the slot's sandbox (bubblewrap, or a plain
process at the weaker isolation level). It uses only the standard library plus :mod:`lcb_reference`
(LiveCodeBench's own harness code, for ``parity=lcb``), found in the directory above this package.

Process model. The zygote starts once per worker slot, imports LiveCodeBench's preamble modules (and,
when the first ``parity=lcb`` program comes, LiveCodeBench's harness, ``unittest.mock`` and numpy),
then serves requests from the grader on its stdin/stdout pipes (length-prefixed frames, see
:mod:`.wire`): a program, then its tests one at a time. The zygote never executes program code; it
forks a *test process* that (:mod:`.confine`)

1. gets its own scratch directory, stdin/stdout/stderr files, and no other descriptor;
2. sets rlimits (CPU, address space, file size, open files, processes, no core), drops to the slot's
   dedicated unprivileged uid/gid (when the zygote may) and every capability, sets no-new-privs and
   parent-death SIGKILL, applies Landlock (weaker level only: writes only in its own scratch folder) and a
   seccomp filter (:mod:`.seccomp`: no ptrace, no ``socket``, no namespaces, no io_uring, no SysV/mq IPC, no
   kernel-admin calls, nothing aimed at another process; when tests share the zygote's uid also no signal to
   the zygote and no chmod/chown/utime/xattr change, and at the weaker level without a dedicated uid no process
   creation and no ``kill(-1)``);
3. says it is ready (:func:`.confine.signal_ready`), compiles the program, and runs the tests
   (:mod:`.script_parity`, :mod:`.lcb_parity`):

   * ``parity=script`` (default): one test process per program runs its tests one after the other,
     each as a real script in a fresh ``__main__`` module with fresh stdin/stdout/stderr files and a
     wiped scratch directory, the process state a program may change put back between tests; a test
     that crashes, times out or leaves a thread or process running ends the process, and the next
     test gets a fresh one. ``isolate_tests``: a freshly forked process per test instead.
   * ``parity=lcb``: one test process per program runs LiveCodeBench's own ``run_test`` logic (its
     ``reliability_guard``, the stdin program wrapped in ``wrapped_function``, mocked stdin, captured
     ``sys.stdout``, one ``Solution()`` instance shared by the tests).

The zygote never compiles or runs program code. Each program gets a scratch folder of its own, made under an
unguessable name in a scratch root nobody else may list, and removed with everything in it once the program
is done. The zygote measures each test's CPU time (``/proc``, ``wait4``), enforces the wall-clock deadline and
the disk and file quotas of the scratch folder (:class:`.files.ScratchMeter`, polled while the test runs),
kills every process a test process left behind (``kill(-1, SIGKILL)`` inside the pid namespace, or by
uid) and sends the grader the raw stdout (stdin tests) or the typed-JSON return value
(:mod:`.values`, functional tests) with the status. The expected outputs never enter the
sandbox: the grader compares.
"""

import json
import os
import select
import signal
import sys
import time

from .confine import EXIT_SETUP_FAILED, confine_test_process, drop_capability
from .errors import PROGRAM_NAME, STDERR_TAIL, format_error, join_text, parse_record, signal_verdict
from .files import ScratchMeter, quota_error, read_head, read_tail, rmtree, wipe, write_all
from .lcb_parity import lcb_child, load_harness
from .mounts import MountHelper, enter_private_mount_namespace, expose_to_others, mount_own_proc
from .libc import libc as _libc
from .procs import children_of, hide_other_processes, ns_pids, proc_cpu, reap_children, vm_size, wait_exit
from .script_parity import PREAMBLE, run_script_child, script_session_child
from .seccomp import SeccompFilter, seccomp_program
from .wire import FRAME, encode_frame, read_frame, write_frame

RECORD_CAP = 64 * 1024  # a test's status record, and a result frame's header from a test process
QUOTA_POLL_S = 0.02  # how often the scratch folder's quota is read while a test runs
_CAP_SYS_ADMIN = 21


class Zygote:
    """One worker slot's zygote. ``cfg`` is the JSON the grader starts it with (:meth:`mars2.sandbox.pool.Slot.start`):
    ``uid``/``gid`` of the tests (None: our own), ``pidns`` (``isolate_pidns``: hide it from tests and start each
    program at a random pid), ``scratch_root``,
    ``remove_on_exit`` (a folder to remove when the grader goes away), ``private_mounts`` (the process level: enter a
    mount namespace of our own and give each program a tmpfs of its quotas, as at the bwrap level; ``expose``: folders
    to make reachable there by the tests' dedicated uid),
    ``sys_path`` (site directories), ``seccomp``, ``deny_fork``, ``landlock`` and ``landlock_read``."""

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
        os.makedirs(self.scratch_root, mode=0o711, exist_ok=True)
        os.chmod(self.scratch_root, 0o711)  # programs may pass through it to their own folder, not list it
        wipe(self.scratch_root)  # what a zygote killed mid-test left (a restart of this slot)
        self.remove_on_exit = cfg.get("remove_on_exit")
        # at the bwrap level the slot carries nothing from program to program: each program's folder is a tmpfs of
        # its own and its first pid random (both by a helper that keeps CAP_SYS_ADMIN, which we give up), and tests
        # see no other uid's processes (the zygote)
        self.mounter = None
        if cfg.get("isolate_pidns"):
            hide_other_processes(os.getgid())
            self.mounter = MountHelper()
            drop_capability(_CAP_SYS_ADMIN)
        elif cfg.get("private_mounts"):
            # the process level with a root grader: the same tmpfs per program, in a mount namespace of our own
            enter_private_mount_namespace()
            expose_to_others(cfg.get("expose", []))
            if self.uid is not None:  # tests of a uid of their own see their own processes only
                try:
                    mount_own_proc()
                except OSError as e:
                    sys.stderr.write(f"zygote: host processes stay visible to tests by stat: {e}\n")
            self.mounter = MountHelper(scramble_pid=False)
            drop_capability(_CAP_SYS_ADMIN)
        self.mounted = None  # (work, folder) of the program whose tmpfs is mounted
        self.meter = ScratchMeter(private_mounts=self.mounter is not None)
        for path in cfg.get("sys_path", []):
            if path not in sys.path:
                sys.path.append(path)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the mounted sandbox directory
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
        # the preamble raised the recursion limit for programs (confine sets it in each test process); we parse
        # what test processes send, and nesting that deep could overflow our C stack instead of raising
        sys.setrecursionlimit(1000)
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
                                  protect_pids=(os.getpid(),) + ((self.mounter.pid,) if self.mounter else ())
                                  if shared_uid else (),
                                  no_metadata=shared_uid) if seccomp_on else None
        self.seccomp = SeccompFilter(program) if program is not None else None
        self.landlock_read = list(cfg.get("landlock_read", [])) if cfg.get("landlock") else None
        _libc()
        self.base_vm = vm_size()
        # not dumpable: a test running as our uid (no dedicated uid) cannot read our memory via /proc
        _libc().prctl(4, 0, 0, 0, 0)
        # a child subreaper: whatever a test detaches (double forks, setsid) is reparented to us, not to an init
        # outside the test's accounting, so its CPU time reaches the test's verdict when we reap it
        _libc().prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        import gc

        gc.collect()
        gc.freeze()
        self.program = None

    def _load_lcb(self):
        """LiveCodeBench's harness, loaded the first time a ``parity=lcb`` program comes (a zygote serving
        only script programs stays smaller, and forks faster), with the premade ``mock_open()``s
        (:func:`.lcb_parity.load_harness`)."""
        if self.lcb is not None:
            return self.lcb
        self.lcb, self.open_mocks = load_harness()
        self.base_vm = vm_size()  # a program's address-space allowance comes on top of what we map
        import gc

        gc.collect()
        gc.freeze()
        return self.lcb

    # ---- protocol -------------------------------------------------------------------------------

    def serve(self):
        write_frame(self.ctl_out, {"op": "ready", "pid": os.getpid(), "uid": os.getuid(),
                                   "child_uid": self.uid, "seccomp": self.seccomp is not None,
                                   "landlock": self.landlock_read is not None, "base_vm": self.base_vm,
                                   "mount_helper": self.mounter.pid if self.mounter is not None else None})
        while True:
            try:
                header, payload = read_frame(self.ctl_in)
            except EOFError:  # the grader is gone
                self._die()
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
        """Take a program (its source, mode, limits): it is compiled only in its confined test process."""
        self.on_end()
        program = {"mode": header["mode"], "parity": header.get("parity", "script"),
                   "func_name": header.get("func_name"), "limits": header["limits"],
                   "source": payload.decode("utf-8", "replace"), "session": None, "ntests": header.get("ntests", 1),
                   "isolate": bool(header.get("isolate"))}
        if program["parity"] == "script" and program["isolate"]:
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
        write_frame(self.ctl_out, {"op": "compiled", "status": "ok", "zygote_cpu_s": time.process_time()})

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
        reply["zygote_cpu_s"] = time.process_time()  # the grader takes our own CPU out of the slot's (cgroup)
        write_frame(self.ctl_out, reply, out)

    def on_end(self):
        program = self.program
        self.program = None
        if program is not None and program.get("session") is not None:
            self._close_session(program["session"])
        self._kill_leftovers()

    # ---- a program's folder, files and test processes ----------------------------------------------

    def _new_io(self, stdin_bytes, limits, session=False):
        """A fresh scratch folder and anonymous in-memory files for the test's stdin (the input only), stdout,
        stderr, status record and return value. Returns ``(folder, work, fds)``.

        The folder has an unguessable name in the scratch root (which nobody may list), is the program's alone
        and is removed as a whole afterwards. For a session (several tests in one process) the program works in
        ``<folder>/work``, which the test process wipes between tests (the program cannot write beside it);
        otherwise it works in the folder itself. ``work`` is a fresh tmpfs of the program's quotas (:mod:`.mounts`)
        at the bwrap level, and at the process level where the grader is root."""
        folder = os.path.join(self.scratch_root, os.urandom(16).hex())
        if session:
            os.mkdir(folder)
            os.chmod(folder, 0o711)  # (our umask is 077)
            work = os.path.join(folder, "work")
            os.mkdir(work, 0o700)
        else:
            os.mkdir(folder, 0o700)
            work = folder
        if self.uid is not None:
            os.chown(work, self.uid, self.gid)
        if self.mounter is not None:
            self.mounted = (work, folder)
            self.mounter.mount(work, limits["disk_bytes"], limits["max_files"] + 1,
                               os.getuid() if self.uid is None else self.uid, os.getgid() if self.gid is None else self.gid)
        fds = {name: os.memfd_create(f"mars2-{name}", os.MFD_CLOEXEC) for name in ("in", "out", "err", "rec", "val")}
        if stdin_bytes:
            write_all(fds["in"], stdin_bytes)
            os.lseek(fds["in"], 0, os.SEEK_SET)
        return folder, work, fds

    def _cleanup_io(self, folder, work, fds):
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        if self.mounter is not None:
            self.mounter.release(work, folder)
            self.mounted = None
        else:
            rmtree(folder)

    def _fork_test_process(self, limits, work, fds, run, stdout_to_null=False):
        """Fork a test process: confine it (:func:`.confine.confine_test_process`), then ``run()``. Returns its
        pid and the read end of its ready pipe (:meth:`_ready`)."""
        if self.uid is None:  # RLIMIT_NPROC counts every task of a uid: only a dedicated one's are the slot's
            limits = {**limits, "nproc": 0}
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                confine_test_process(limits, work, {**fds, "ready": ready_w}, zygote_pid=self.pid, uid=self.uid,
                                     gid=self.gid, pidns=self.pidns, base_vm=self.base_vm,
                                     landlock_read=self.landlock_read, seccomp=self.seccomp,
                                     stdout_to_null=stdout_to_null)
                run()
            except BaseException as exc:
                try:
                    os.write(2, ("test process failed: " + format_error(exc, __file__)).encode("utf-8", "replace"))
                finally:
                    os._exit(EXIT_SETUP_FAILED)
            finally:
                os._exit(EXIT_SETUP_FAILED)
        os.close(ready_w)
        os.set_blocking(ready_r, False)
        return pid, ready_r

    @staticmethod
    def _ready(proc):
        """Whether the test process ``proc`` (``{"ready_fd", "ready"}``) finished its confinement: its ready byte
        arrived. Read only after it answered or exited, so a byte it wrote is always there."""
        if not proc["ready"] and proc["ready_fd"] is not None:
            try:
                proc["ready"] = os.read(proc["ready_fd"], 1) == b"R"
            except BlockingIOError:
                pass
        return proc["ready"]

    @staticmethod
    def _close_ready(proc):
        if proc.get("ready_fd") is not None:
            os.close(proc["ready_fd"])
            proc["ready_fd"] = None

    # ---- one test in a fresh child (parity=script, isolate_tests) --------------------------------------

    def test_script(self, program, payload):
        limits = program["limits"]
        mode = program["mode"]
        folder, work, fds = self._new_io(payload if mode == "stdin" else b"", limits)
        proc = {"ready_fd": None, "ready": False}
        try:
            pid, proc["ready_fd"] = self._fork_test_process(limits, work, fds,
                                                            lambda: run_script_child(program, payload),
                                                            stdout_to_null=(mode != "stdin"))
            waited = self._wait(pid, limits, work)
            detached = self._kill_leftovers()  # what the test left running or unreaped: its CPU is the test's too
            return self._collect(waited, limits, fds, mode, self._ready(proc), detached)
        finally:
            self._close_ready(proc)
            self._cleanup_io(folder, work, fds)

    def _grader_gone(self):
        """The grader closed our control pipe (it exited or was killed): take everything down."""
        poller = select.poll()
        poller.register(self.ctl_in, select.POLLIN)
        events = poller.poll(0)
        return bool(events) and bool(events[0][1] & (select.POLLHUP | select.POLLERR))

    def _die(self):
        """The grader is gone: kill what programs left, remove the slot's folder (``remove_on_exit``), exit."""
        self._kill_leftovers()
        if self.mounter is not None:  # a program's tmpfs, mounted in our namespace, cannot be removed by us
            if self.mounted is not None:
                self.mounter.release(*self.mounted)
            self.mounter.close()
        if self.remove_on_exit:
            import shutil

            wipe(self.remove_on_exit)
            shutil.rmtree(self.remove_on_exit, ignore_errors=True)
        else:
            wipe(self.scratch_root)
        os._exit(0)

    def _wait(self, pid, limits, work):
        """Wait for ``pid`` until the wall-clock deadline, reading the scratch quota every ``QUOTA_POLL_S``; kill
        it at the deadline or over the quota. Returns ``(status, rusage, wall, killed, quota)``.

        Also watches the control pipe: if the grader goes away, the test and the zygote end at once.
        """
        start = time.monotonic()
        deadline = start + limits["wall_s"]
        killed = False
        quota = None
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                step = min(remaining, QUOTA_POLL_S)
                if pidfd is not None:
                    poller = select.poll()
                    poller.register(pidfd, select.POLLIN)
                    poller.register(self.ctl_in, select.POLLHUP)
                    events = dict(poller.poll(max(1, int(step * 1000) + 1)))
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
                quota = self.meter.exceeded(work, pid, limits)
                if quota is not None:
                    os.kill(pid, signal.SIGKILL)
                    break
            if quota is None and time.monotonic() >= deadline and \
                    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                killed = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        finally:
            if pidfd is not None:
                os.close(pidfd)
        _, status, rusage = os.wait4(pid, 0)
        if quota is None:
            quota = self.meter.exceeded(work, None, limits)
        return status, rusage, time.monotonic() - start, killed, quota

    def _collect(self, waited, limits, fds, mode, ready, detached=0.0):
        reply, out = self._collect_once(waited, limits, fds, mode, ready, detached)
        return self._quota_verdict(reply, limits), out

    @staticmethod
    def _quota_verdict(reply, limits):
        """A runtime error of running out of space is the program's quota (:func:`.files.quota_error`)."""
        if reply.get("status") == "RE":
            found = quota_error(str(reply.get("error", "")), limits)
            if found is not None:
                reply["status"], reply["error"] = found
        return reply

    def _collect_once(self, waited, limits, fds, mode, ready, detached=0.0):
        status, rusage, wall, killed, quota = waited
        cpu = rusage.ru_utime + rusage.ru_stime + detached
        out = read_head(fds["out"], limits["output_bytes"]) if mode == "stdin" else b""
        err = read_tail(fds["err"], STDERR_TAIL).decode("utf-8", "replace")
        reply = {"cpu_s": round(cpu, 4), "wall_s": round(wall, 4), "maxrss_kb": rusage.ru_maxrss}
        if not ready:  # it never reached the program: our set-up failed, whatever the status says
            reply.update(status="SETUP", error=join_text("the sandbox could not confine the test", err))
            return reply, out
        if quota is not None:
            reply.update(status="QUOTA", error=quota)
            return reply, out
        if killed:
            reply.update(status="TLE", error=f"wall-clock limit ({limits['wall_s']:g} s)")
            return reply, out
        if os.WIFSIGNALED(status):
            reply.update(signal_verdict(os.WTERMSIG(status), cpu, limits, err))
            return reply, out
        if cpu > limits["time_s"]:
            reply.update(status="TLE", error=f"CPU time limit ({limits['time_s']:g} s; used {cpu:.2f} s)")
            return reply, out
        code = os.WEXITSTATUS(status)
        record = parse_record(read_head(fds["rec"], RECORD_CAP))
        if record is None or code != 0:
            reason = f"exited with code {code}" if code != 0 else "exited before the runner could report (os._exit?)"
            reply.update(status="RE", error=join_text(reason, err))
            return reply, out
        run_status = record.get("status")
        if run_status not in ("ok", "RE", "MLE", "CE"):
            reply.update(status="RE", error="malformed runner record")
            return reply, out
        reply["status"] = run_status
        if run_status != "ok":
            reply["error"] = str(record.get("error", ""))[-STDERR_TAIL:]
        elif mode == "functional":
            out = read_head(fds["val"], limits["output_bytes"] + 1)
            if len(out) > limits["output_bytes"]:
                reply.update(status="OLE", error=f"return value larger than {limits['output_bytes']} bytes")
                out = b""
        if mode == "stdin" and os.fstat(fds["out"]).st_size > limits["output_bytes"]:
            reply.update(status="OLE", error=f"output limit ({limits['output_bytes']} bytes) exceeded")
        return reply, out

    # ---- one child per program serves every test (parity=lcb, like LiveCodeBench's process; script) --

    def test_session(self, program, payload, child_fn):
        """One test in the program's long-lived test process (opened on demand, see :meth:`_open_session`).

        The process is closed, and the next test gets a fresh one, after a test that timed out, crashed, went
        over its quota, or (script mode) left threads or processes behind. Only a process that never said it
        was ready (:func:`.confine.signal_ready`) is a sandbox fault (``SETUP``)."""
        limits = program["limits"]
        session = program.get("session")
        if session is None:
            session = self._open_session(program, child_fn)
            program["session"] = session
        cpu_before = proc_cpu(session["pid"])
        start = time.monotonic()
        try:
            answer = self._send_child(session, encode_frame({"op": "test"}, payload), start + limits["wall_s"], limits)
            if answer is None:
                answer = self._read_child(session, start + limits["wall_s"], limits)
        except OSError:
            answer = ("eof",)
        wall = time.monotonic() - start
        if answer[0] == "frame" and not self._ready(session):
            answer = ("eof",)  # an answer before the ready byte is not one of our runner's
        if answer[0] != "frame":
            # "eof": the process is exiting (its pipe closes before it becomes a zombie: give it a moment)
            alive = answer[0] != "eof" or not wait_exit(session["pid"], 2.0)
            if answer[0] != "quota":  # what it left in its folder, read before the folder goes
                quota = self.meter.exceeded(session["work"], None, limits)
                if quota is not None and self._ready(session):
                    answer = ("quota", quota)
            self._close_session(session)
            program["session"] = None
            status, rusage = session.get("exit", (None, None))
            cpu = max(0.0, rusage.ru_utime + rusage.ru_stime - cpu_before) if rusage is not None else 0.0
            cpu += session.get("detached_cpu", 0.0)
            reply = {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)}
            if not session["ready"]:
                reply.update(status="SETUP",
                             error=join_text("the test process could not be confined", session.get("err_tail", "")))
            elif answer[0] == "quota":
                reply.update(status="QUOTA", error=answer[1])
            elif alive:
                reply.update(status="TLE", error=f"wall-clock limit ({limits['wall_s']:g} s)")
            elif status is not None and os.WIFSIGNALED(status):
                reply.update(signal_verdict(os.WTERMSIG(status), cpu, limits))
            elif session.get("error"):
                reply.update(status="RE", error=session["error"])
            elif program["parity"] == "lcb":
                reply.update(status="RE", error="the test process exited without a result "
                                                "(LiveCodeBench counts this as a global failure, -1)")
            else:
                code = os.WEXITSTATUS(status) if status is not None else -1
                reply.update(status="RE", error=join_text(f"exited with code {code}" if code else
                                                          "exited before the runner could report (os._exit?)",
                                                          session.get("err_tail", "")))
            return self._quota_verdict(reply, limits), b""
        _, header, out = answer
        cpu = max(0.0, proc_cpu(session["pid"]) - cpu_before)
        if self._strays(session):  # orphans that reached us, not the test process: they used this test's time
            header = {**header, "dirty": True}
        if header.get("dirty"):  # it left threads or processes: they go now, and the CPU they used is this test's
            quota = self.meter.exceeded(session["work"], session["pid"], limits)
            self._close_session(session)
            program["session"] = None
            _, rusage = session.get("exit", (None, None))
            if rusage is not None:
                cpu = max(cpu, rusage.ru_utime + rusage.ru_stime - cpu_before)
            cpu += session.get("detached_cpu", 0.0)
        reply = {"status": header.get("status", "RE"), "wall_s": round(wall, 4), "cpu_s": round(cpu, 4)}
        if reply["status"] not in ("ok", "RE", "MLE", "CE", "TLE"):
            reply.update(status="RE", error="malformed result from the test process")
        elif "error" in header:
            reply["error"] = str(header["error"])[-STDERR_TAIL:]
        if reply["status"] == "ok" and cpu > limits["time_s"]:
            reply.update(status="TLE", error=f"CPU time limit ({limits['time_s']:g} s; used {cpu:.2f} s)")
        if len(out) > limits["output_bytes"]:
            reply.update(status="OLE", error=f"output limit ({limits['output_bytes']} bytes) exceeded")
            out = b""
        if not header.get("dirty"):
            quota = self.meter.exceeded(session["work"], session["pid"], limits)
        if quota is not None:
            reply.update(status="QUOTA", error=quota)
            out = b""
        self._quota_verdict(reply, limits)
        if not session.get("closed") and reply["status"] in ("TLE", "QUOTA"):
            self._close_session(session)
            program["session"] = None
        return reply, out

    def _strays(self, session):
        """Our children other than the session's test process and the mount helper: a test's processes that were
        orphaned to us (the test process is its orphans' reaper, and may not stop being one: seccomp)."""
        keep = {session["pid"]} | ({self.mounter.pid} if self.mounter is not None else set())
        return children_of(os.getpid()) - keep

    def _open_session(self, program, child_fn):
        """Fork the confined process that runs this program's tests one after the other (fd 3: test
        frames in, fd 4: result frames out)."""
        limits = dict(program["limits"])
        # one process runs every test: its CPU cap covers all of them (each test is checked on its own)
        limits["time_s_total"] = (limits["time_s"] + 1) * max(1, program["ntests"]) + 1
        folder, work, fds = self._new_io(b"", limits, session=True)
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe2(os.O_CLOEXEC)
        os.set_inheritable(to_child_w, False)
        os.set_blocking(to_child_w, False)  # the program may stop reading: our writes have deadlines
        # the child reads test frames on fd 3 and writes results on fd 4 (where script children find their
        # record/value files)
        pid, ready_fd = self._fork_test_process(limits, work, {**fds, "rec": to_child_r, "val": from_child_w},
                                                lambda: child_fn(program))
        os.close(to_child_r)
        os.close(from_child_w)
        return {"pid": pid, "to_child": to_child_w, "from_child": from_child_r, "buf": bytearray(), "scratch": folder,
                "work": work, "fds": fds, "ready_fd": ready_fd, "ready": False}

    def _poll_child(self, session, fd, event, deadline):
        """Wait up to ``QUOTA_POLL_S`` (and no later than ``deadline``) for ``event`` on a pipe to the test process;
        the grader going away ends everything. The pipe's events (0: none yet), or None past the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        poller = select.poll()
        poller.register(fd, event)
        poller.register(self.ctl_in, select.POLLHUP)
        events = dict(poller.poll(max(1, int(min(remaining, QUOTA_POLL_S) * 1000) + 1)))
        if self.ctl_in in events and fd not in events:
            self._close_session(session)
            self._die()
        return events.get(fd, 0)

    def _send_child(self, session, data, deadline, limits):
        """Write a test frame to the test process (which the program may keep from reading) before ``deadline``,
        reading the quota meanwhile. None once it is all written, else an answer as :meth:`_read_child` gives one."""
        fd = session["to_child"]
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
                continue
            except BlockingIOError:
                pass
            events = self._poll_child(session, fd, select.POLLOUT, deadline)
            if events is None:
                return ("timeout",)
            if events & (select.POLLERR | select.POLLHUP):
                return ("eof",)
            quota = self.meter.exceeded(session["work"], session["pid"], limits)
            if quota is not None:
                return "quota", quota
        return None

    def _read_child(self, session, deadline, limits):
        """The test process's answer before ``deadline``: ``("frame", header, payload)``; ``("timeout",)``,
        ``("eof",)`` (it exited, or sent something malformed) or ``("quota", why)`` (read every
        ``QUOTA_POLL_S`` while it runs)."""
        fd = session["from_child"]
        buf = session["buf"]
        next_quota = time.monotonic() + QUOTA_POLL_S
        while True:
            if time.monotonic() >= next_quota:  # also while the program keeps the pipe busy
                next_quota = time.monotonic() + QUOTA_POLL_S
                quota = self.meter.exceeded(session["work"], session["pid"], limits)
                if quota is not None:
                    return "quota", quota
            if len(buf) >= FRAME.size:
                hlen, plen = FRAME.unpack(buf[:FRAME.size])
                if hlen > RECORD_CAP or plen > limits["output_bytes"] + 1:
                    session["error"] = "malformed or oversized result from the test process"
                    return ("eof",)
                total = FRAME.size + hlen + plen
                if len(buf) >= total:
                    try:
                        header = json.loads(buf[FRAME.size:FRAME.size + hlen].decode("utf-8"))
                    except (ValueError, UnicodeDecodeError, RecursionError):
                        session["error"] = "malformed result from the test process"
                        return ("eof",)
                    session["buf"] = buf[total:]
                    return "frame", (header if isinstance(header, dict) else {}), bytes(buf[FRAME.size + hlen:total])
            events = self._poll_child(session, fd, select.POLLIN, deadline)
            if events is None:
                return ("timeout",)
            if not events:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return ("eof",)
            buf += chunk  # a bytearray: appending is amortised O(1) (bytes made a 16 MiB output cost seconds)
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
        self._ready(session)
        self._close_ready(session)
        try:
            session["err_tail"] = read_tail(session["fds"]["err"], STDERR_TAIL).decode("utf-8", "replace")
        except OSError:
            pass
        # first: a daemon of the program could re-link files into the folder being removed; what it reaps is the
        # CPU of the last test's detached processes
        session["detached_cpu"] = self._kill_leftovers()
        self._cleanup_io(session["scratch"], session["work"], session["fds"])

    def _script_session_child(self, program):
        script_session_child(program, self.preamble_names)

    def _lcb_child(self, program):
        lcb_child(program, self.lcb, self.open_mocks)

    # ---- cleanup ----------------------------------------------------------------------------------

    def _kill_leftovers(self):
        """Kill every process a test left behind (daemons, setsid() escapees), then wait until gone: everything in
        our pid namespace but us, its init and the mount helper, or every process of the slot's uid. Returns the CPU
        seconds of what was reaped (ours to reap as the subreaper), which the test's own ``wait4`` never saw."""
        keep = {self.mounter.pid} if self.mounter is not None else set()
        if self.pidns:
            me = os.getpid()
            if not [p for p in ns_pids(me) if p not in keep]:
                return reap_children()
            if keep:  # the helper is root: kill as the tests' uid, which reaches exactly theirs
                self._kill_uid()
            else:
                try:
                    os.kill(-1, signal.SIGKILL)  # everything in our pid namespace but us and its init
                except ProcessLookupError:
                    return reap_children()
            cpu = reap_children()
            deadline = time.monotonic() + 5.0
            while [p for p in ns_pids(me) if p not in keep] and time.monotonic() < deadline:
                cpu += reap_children()
                time.sleep(0.005)
            return cpu
        if self.uid is not None:
            self._kill_uid()
            cpu = reap_children()
            deadline = time.monotonic() + 5.0  # killed orphans reach us (the subreaper) as they die
            while self._uid_pids() and time.monotonic() < deadline:
                cpu += reap_children()
                time.sleep(0.005)
            return cpu + reap_children()
        return reap_children()

    def _uid_pids(self):
        """The processes of the slot's uid (at the process level, the tests' processes)."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == self.uid:
                        pids.append(int(entry))
                except OSError:
                    pass
        return pids

    def _kill_uid(self):
        """``kill(-1, SIGKILL)`` as the slot's uid, from a child: every process of that uid but the child dies."""
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setresgid(self.gid, self.gid, self.gid)
                os.setresuid(self.uid, self.uid, self.uid)
                for _ in range(3):
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except ProcessLookupError:
                        break
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
