"""Worker slots: one long-lived sandboxed zygote each, fed programs and tests over pipes.

A :class:`SandboxPool` holds ``workers`` :class:`Slot` objects (one per core by default). A slot owns
a dedicated uid (when the grader runs as root), optionally a cgroup, and one zygote process
(``_entry.py``, :mod:`mars2.sandbox.runner`) inside its sandbox (see :mod:`mars2.sandbox.isolation`),
spoken to in :mod:`mars2.sandbox.runner.wire` frames. :meth:`Slot.run` sends one program, then its tests
one at a time, handing each raw result (stdout bytes or typed return value) to a callback; the comparison with the
expected output is made apart, in a :class:`Judge` process (:mod:`mars2.sandbox.grader` decides when).
A zygote that dies, stops answering, or reports that it could not confine a test process (decided from its own
checks, never from anything a program controls) is killed and restarted; the program it was running is retried once
on the fresh zygote, then reported as that program's sandbox failure (:class:`SandboxError`), which the grader turns
into an ``RE`` verdict: one program never takes a batch down.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mars2.config import MAX_MEMORY_MB, MAX_TIME_S, MAX_WORKERS, MIN_TIME_S
from mars2.cpu import usable_cpus
from mars2.procs import exit_code, kill_group, wait_exit
from mars2.sandbox import isolation
from mars2.sandbox.runner.wire import encode_frame, read_frame, take_frame, write_frame

log = logging.getLogger(__name__)

MIB = 1 << 20
JUDGE_PATH = os.path.join(isolation.SANDBOX_DIR, "_judge.py")
START_TIMEOUT_S = 60.0
REPLY_GRACE_S = 15.0
JUDGE_TIMEOUT_S = 600.0  # one judgment at most (the slowest measured: 4-6 s for a 16 MiB nested return value)
HELD_BYTES = 32 * MIB  # outputs run but not yet judged, kept in memory by a pool (beyond: spooled to disk)
SPOOL_BYTES = 2 << 30  # ... and on disk, beyond which the slots wait for the judges


JUDGE_CORE_FROM = 8  # a host with this many usable cores gives the judge processes a core of their own


class SandboxError(RuntimeError):
    """The sandbox itself failed (zygote died, stopped answering, or could not confine a test process), not the
    program: retried once on a fresh zygote, then the program's ``RE`` ("sandbox failure") verdict."""


class SandboxStartError(SandboxError):
    """A slot's zygote could not start at all."""


@dataclass(frozen=True)
class Limits:
    """Per-test limits.

    ``time_s``: CPU time (user + system) a test may use; also LiveCodeBench's alarm in
    ``parity=lcb``. ``wall_s``: wall-clock cap per test (default ``2 * time_s + 1``: time limits are
    judged on CPU time so that a loaded machine does not turn correct programs into timeouts, the
    wall clock only catches sleeping or blocked programs), between ``MIN_TIME_S`` and ``MAX_TIME_S``.
    ``memory_mb``: address space available to the program (``RLIMIT_AS``, on top of the warmed interpreter's
    own). ``output_bytes``: cap on stdout, on any file written, and on a functional return value. ``nproc``:
    processes + threads of the slot's uid (when it has a dedicated one). ``nofile``: open descriptors.
    ``disk_mb`` and ``max_files``: what a program may hold in its scratch folder at once (bytes on disk, files and
    folders); more ends the test as ``QUOTA``.
    """

    time_s: float = 6.0
    memory_mb: int = 1024
    output_bytes: int = 16 * MIB
    wall_s: float | None = None
    nproc: int = 256
    nofile: int = 256
    disk_mb: int = 32
    max_files: int = 512

    def __post_init__(self) -> None:
        if not (isinstance(self.time_s, (int, float)) and math.isfinite(self.time_s)
                and MIN_TIME_S <= self.time_s <= MAX_TIME_S):
            raise ValueError(f"time_s must be a number of seconds from {MIN_TIME_S} to {MAX_TIME_S:g}, "
                             f"got {self.time_s!r}")
        if self.wall_s is not None and not (math.isfinite(self.wall_s) and self.wall_s >= MIN_TIME_S):
            raise ValueError(f"wall_s must be finite and >= {MIN_TIME_S}, got {self.wall_s!r}")
        for name, top in (("memory_mb", MAX_MEMORY_MB), ("output_bytes", 1 << 40), ("disk_mb", MAX_MEMORY_MB),
                          ("max_files", 1 << 20), ("nproc", 1 << 16), ("nofile", 1 << 16)):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= top):
                raise ValueError(f"{name} must be a whole number from 1 to {top}, got {value!r}")

    @property
    def wall(self) -> float:
        return self.wall_s if self.wall_s is not None else 2 * self.time_s + 1

    def to_wire(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "wall_s": self.wall, "memory_mb": self.memory_mb,
                "output_bytes": self.output_bytes, "nproc": self.nproc, "nofile": self.nofile,
                "disk_bytes": self.disk_mb * MIB, "max_files": self.max_files}


@dataclass
class TestRun:
    """What the sandbox reports for one test: ``status`` is ``ok`` (compare ``output``), ``TLE``,
    ``RE``, ``MLE``, ``CE``, ``OLE`` (output limit), ``QUOTA`` (the scratch folder's disk or file quota) or
    ``SIGNAL`` (killed by a signal; ``MLE`` when the slot's cgroup saw an OOM kill)."""

    __test__ = False

    status: str
    output: bytes = b""
    error: str = ""
    cpu_s: float = 0.0
    wall_s: float = 0.0


class _Channel:
    """Framed messages (:mod:`mars2.sandbox.runner.wire`) over the zygote's stdin/stdout pipes, with deadlines."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.wfd = proc.stdin.fileno()
        self.rfd = proc.stdout.fileno()
        self.buf = bytearray()

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        blob = memoryview(encode_frame(header, payload))
        try:
            while blob:
                blob = blob[os.write(self.wfd, blob):]
        except (BrokenPipeError, OSError) as e:
            raise SandboxError(f"sandbox pipe closed ({e})") from None

    def recv(self, timeout: float) -> tuple[dict[str, Any], bytes]:
        deadline = time.monotonic() + timeout
        while True:
            frame = take_frame(self.buf)
            if frame is not None:
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxError(f"sandbox did not answer within {timeout:.1f} s")
            ready, _, _ = select.select([self.rfd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise SandboxError("sandbox exited")
            self.buf += chunk


class Slot:
    """One worker slot: a dedicated uid (as root), a cgroup (when writable) and a zygote in its sandbox."""

    def __init__(self, index: int, pool: SandboxPool) -> None:
        self.index = index
        self.pool = pool
        self.proc: subprocess.Popen | None = None
        self.chan: _Channel | None = None
        self.lease: isolation.UidLease | None = None
        self.cgroup: isolation.SlotCgroup | None = None
        self.dir: isolation.SlotDir | None = None
        self.log: Any = None
        self.sandbox_pidfd: int | None = None  # bwrap: the sandbox's init, whose death ends everything in it
        self.info: dict[str, Any] = {}
        self.starts = 0
        self.cgroup_memory_mb = 0

    @staticmethod
    def _cgroup_memory(memory_mb: int) -> int:
        """The slot cgroup's cap: the program's own allowance, a quarter more for its children, the
        warmed zygote and the tmpfs files, plus 256 MiB."""
        return (memory_mb + memory_mb // 4 + 256) * MIB

    # ---- life cycle -----------------------------------------------------------------------------

    def _uid(self) -> int | None:
        """The slot's dedicated uid (leased once), or None when tests run as the grader's own uid."""
        probe = self.pool.probe
        if not (probe["root"] and (self.pool.level == "bwrap" or probe.get("process_dedicated_uid"))):
            return None
        if self.lease is None:
            self.lease = isolation.UidLease()
            isolation.kill_uid_processes(self.lease.uid)  # whatever a killed grader's slot left under this uid
        return self.lease.uid

    def _ensure_cgroup(self, uid: int | None) -> None:
        pool = self.pool
        if self.cgroup is not None or not pool.probe.get("cgroup") or not pool.use_cgroups:
            return
        try:
            name = f"slot-{uid}" if uid is not None else f"pid{os.getpid()}-slot{self.index}"
            self.cgroup = isolation.SlotCgroup(pool.probe["cgroup"], name, self._cgroup_memory(pool.memory_ceiling_mb),
                                               pool.nproc_ceiling + 64, cpu_cores=pool.slot_cpu_cores())
            self.cgroup_memory_mb = pool.memory_ceiling_mb
        except OSError as e:
            log.warning("sandbox slot %d: cgroup not usable (%s); continuing without", self.index, e)
            self.cgroup = None

    def zygote_config(self) -> dict[str, Any]:
        """The configuration the slot's zygote starts with (:class:`mars2.sandbox.runner.zygote.Zygote`): the
        tests' uid, the scratch root (bubblewrap's private ``/tmp``, or this slot's host folder at the ``process``
        level, which the zygote removes if the grader goes away) and the confinement it applies."""
        pool = self.pool
        probe = pool.probe
        uid = self._uid()
        cfg: dict[str, Any] = {"uid": uid, "gid": uid, "sys_path": isolation.site_paths(), "env": isolation.CHILD_ENV,
                               "seccomp": bool(probe.get("seccomp"))}
        if pool.level == "bwrap":
            cfg.update(pidns=True, isolate_pidns=bool(probe.get("root")), scratch_root=isolation.SCRATCH_IN_BWRAP,
                       deny_fork=False)
            return cfg
        if self.dir is None:
            self.dir = isolation.SlotDir(self.index)
        ours = isolation.python_roots() + [isolation.SANDBOX_DIR]
        read_paths = ours + ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime", "/dev/null",
                             "/dev/urandom", "/dev/zero"]
        cfg.update(pidns=False, scratch_root=os.path.join(self.dir.path, "scratch"),
                   private_mounts=bool(probe.get("private_mounts")),
                   expose=[p for p in ours + [self.dir.path]
                           if uid is not None and not isolation.reachable_by_others(p)],
                   remove_on_exit=self.dir.path, deny_fork=uid is None, landlock=bool(probe.get("landlock_abi")),
                   landlock_read=read_paths)
        return cfg

    def start(self) -> None:
        """Start the zygote and wait for its ``ready``; any failure is a :class:`SandboxStartError`."""
        try:
            self._start()
        except SandboxStartError:
            raise
        except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as e:
            self.stop()
            raise SandboxStartError(f"sandbox slot {self.index} failed to start: {type(e).__name__}: {e}") from None

    def _start(self) -> None:
        cfg = self.zygote_config()
        self._ensure_cgroup(cfg["uid"])
        info_r = info_w = None
        if self.pool.level == "bwrap":
            info_r, info_w = os.pipe()
            runner = os.path.join(isolation.MOUNTED_SANDBOX_DIR, "_entry.py")
            spec = isolation.SandboxSpec("bwrap", self.pool.probe["root"], tmpfs_bytes=self.pool.tmpfs_bytes)
            argv = isolation.bwrap_argv(spec, isolation.runner_command(runner, cfg), info_fd=info_w)
            env = {"PATH": os.environ.get("PATH", os.defpath)}
            cwd = "/"
        else:
            argv = isolation.runner_command(isolation.RUNNER_PATH, cfg)
            env = dict(isolation.CHILD_ENV)
            cwd = self.dir.path if self.dir is not None else "/"
        if self.log is None:  # the zygote's stderr: unnamed, so nothing is left on disk whatever happens
            self.log = tempfile.TemporaryFile(prefix=f"mars2-slot{self.index}-")
        cgroup, cpus = self.cgroup, self.pool.slot_cpus

        def preexec() -> None:  # inherited by everything in the sandbox; its seccomp refuses sched_setaffinity
            if cgroup is not None:
                cgroup.attach_current()
            if cpus:
                os.sched_setaffinity(0, cpus)

        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                         cwd=cwd, start_new_session=True, preexec_fn=preexec, bufsize=0,
                                         pass_fds=(info_w,) if info_w is not None else ())
        finally:
            if info_w is not None:
                os.close(info_w)
        self.chan = _Channel(self.proc)
        self.starts += 1
        try:
            if info_r is not None:
                self.sandbox_pidfd = _sandbox_init(info_r, START_TIMEOUT_S)
            header, _ = self.chan.recv(START_TIMEOUT_S)
        except SandboxError as e:
            self.stop()
            raise SandboxStartError(f"sandbox slot {self.index} failed to start: {e}; {self.log_tail()}") from None
        finally:
            if info_r is not None:
                os.close(info_r)
        if header.get("op") != "ready":
            self.stop()
            raise SandboxStartError(f"sandbox slot {self.index} sent {header!r} instead of ready")
        self.info = header

    def log_tail(self, limit: int = 2000) -> str:
        if self.log is None:
            return ""
        try:
            self.log.flush()
            size = os.fstat(self.log.fileno()).st_size
            return os.pread(self.log.fileno(), limit, max(0, size - limit)).decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def scratch_root_on_host(self) -> str | None:
        """Where the zygote's scratch root is seen from the host (diagnostics and tests): this slot's folder at the
        ``process`` level, the zygote's own mount namespace (``/proc/<pid>/root``) at the ``bwrap`` level."""
        if self.pool.level != "bwrap":
            return os.path.join(self.dir.path, "scratch") if self.dir is not None else None
        if self.proc is None:
            return None
        children = [pid for pid, (ppid, _, _) in _process_table().items() if ppid == self.proc.pid]
        return f"/proc/{children[0]}/root{isolation.SCRATCH_IN_BWRAP}" if children else None

    def sandbox_pids(self) -> list[int]:
        """Host pids of the processes programs left in this slot (diagnostics and tests): everything in
        the slot's pid namespace but its init, the zygote and the zygote's mount helper (``bwrap``), or every process
        of the slot's uid plus the zygote's descendants but its mount helper (``process``)."""
        if self.proc is None:
            return []
        table = _process_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        if self.pool.level == "bwrap":
            inits = children.get(self.proc.pid, [])
            if not inits:
                return []
            ns = table[inits[0]][2]
            zygotes = set(children.get(inits[0], []))
            # the zygote's mount helper (root, its child); programs run as the slot's uid
            helpers = {pid for z in zygotes for pid in children.get(z, []) if table[pid][1] == 0}
            return sorted(pid for pid, (_, _, pns) in table.items()
                          if pns == ns and pid != inits[0] and pid not in zygotes | helpers)
        found: set[int] = set()
        helper = (self.info or {}).get("mount_helper")
        stack = [pid for pid in children.get(self.proc.pid, []) if pid != helper]
        while stack:
            pid = stack.pop()
            if pid not in found:
                found.add(pid)
                stack.extend(children.get(pid, []))
        if self.lease is not None:
            found |= {pid for pid, (_, uid, _) in table.items() if uid == self.lease.uid}
        return sorted(found)

    def alive(self) -> bool:
        return self.proc is not None and exit_code(self.proc) is None  # unreaped: stop() may still signal its group

    def stop(self) -> None:
        """Kill the zygote and everything it started: the sandbox's init at the ``bwrap`` level (its pid namespace
        dies with it, however stuck the zygote is), the process group, and every process of the slot's uid."""
        proc = self.proc
        self.proc = None
        self.chan = None
        if self.sandbox_pidfd is not None:
            try:
                signal.pidfd_send_signal(self.sandbox_pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(self.sandbox_pidfd)
            self.sandbox_pidfd = None
        if proc is None:
            return
        if proc.returncode is None:  # reaped, its id may name another group by now (mars2.procs.exit_code)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("sandbox slot %d: zygote %d did not die", self.index, proc.pid)
        if self.lease is not None:
            isolation.kill_uid_processes(self.lease.uid)

    def close(self) -> None:
        if self.chan is not None and self.alive():
            try:
                self.chan.send({"op": "exit"})
                wait_exit(self.proc, 5)  # type: ignore[arg-type]
            except (SandboxError, OSError):
                pass
        self.stop()
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self.dir is not None:
            self.dir.remove()
            self.dir = None
        if self.log is not None:
            self.log.close()
            self.log = None

    # ---- one program --------------------------------------------------------------------------------

    def run(self, *, code: str, mode: str, parity: str, func_name: str | None, limits: Limits,
            inputs: list[bytes], on_result: Callable[[int, TestRun], None],
            stop_after: Callable[[TestRun], bool] = lambda run: False, isolate_tests: bool = False) -> int:
        """Run ``code`` on ``inputs`` in order, stopping after a run for which ``stop_after(run)`` is true; each
        run goes to ``on_result(i, run)`` in this thread, its ``output`` held by the pool (:class:`HeldOutputs`:
        the caller gets the bytes with ``pool.held.take``). Returns the number of runs handed over. A pacing thread
        feeds the tests (:meth:`_pace`) and never waits for ``on_result``: whatever the caller does with a run
        never reaches the program.

        A sandbox failure (the zygote cannot start, dies, stops answering, or could not confine a test process)
        restarts the zygote and retries the program once from the start (the callback sees every test again);
        a second failure raises :class:`SandboxError`.
        """
        for attempt in (1, 2):
            try:
                if not self.alive():
                    self.start()
                return self._run_once(code, mode, parity, func_name, limits, inputs, on_result, stop_after,
                                      isolate_tests)
            except SandboxError as e:
                self.pool.count_failure()
                log.warning("sandbox slot %d failed (%s); restarting%s. %s", self.index, e,
                            "" if attempt == 1 else ", giving up on this program", self.log_tail(500))
                self.stop()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _run_once(self, code, mode, parity, func_name, limits, inputs, on_result, stop_after, isolate_tests) -> int:
        chan = self.chan
        assert chan is not None
        if self.cgroup is not None and limits.memory_mb != self.cgroup_memory_mb:
            # lowered too, not only raised: what a program holds outside its address space (memfd pages, tmpfs
            # files) is bounded by this cap alone, and a cap left at the pool's ceiling let 1.4 GiB of memfds
            # through a 64 MiB allowance
            try:
                self.cgroup.set_memory(self._cgroup_memory(limits.memory_mb))
            except OSError as e:  # below what the slot holds now (EBUSY): a restarted slot holds less
                raise SandboxError(f"cannot set the slot's memory cap to {limits.memory_mb} MiB: {e}") from e
            self.cgroup_memory_mb = limits.memory_mb
        wire = limits.to_wire()
        chan.send({"op": "program", "mode": mode, "parity": parity, "func_name": func_name, "limits": wire,
                   "ntests": len(inputs), "isolate": isolate_tests}, code.encode("utf-8", "surrogatepass"))
        header, _ = chan.recv(REPLY_GRACE_S + 30)
        if header.get("status") != "ok":
            raise SandboxError(f"the sandbox could not take the program: {header.get('error', header)}")
        if not inputs:
            chan.send({"op": "end"})
            return 0
        runs: queue.SimpleQueue = queue.SimpleQueue()
        held = self.pool.held
        halt = threading.Event()
        meter = SlotCpuMeter(self.cgroup, header.get("zygote_cpu_s"))
        pacer = threading.Thread(target=self._pace, args=(chan, limits, inputs, stop_after, runs, held, halt, meter),
                                 name=f"mars2-sandbox-slot{self.index}", daemon=True)
        pacer.start()
        ran = 0
        try:
            while (item := runs.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                index, run = item
                ran += 1
                on_result(index, run)
                del run, item
        except BaseException:
            halt.set()  # the pacer ends the program after the test in flight (at most one test's wall time)
            raise
        finally:
            pacer.join()
            held.drop(runs)
        return ran

    def _pace(self, chan: _Channel, limits: Limits, inputs: list[bytes], stop_after: Callable[[TestRun], bool],
              runs: queue.SimpleQueue, held: HeldOutputs, halt: threading.Event, meter: SlotCpuMeter) -> None:
        """Feed the program its tests one after the other, each as soon as the previous one's run is back (or end
        it after a run ``stop_after`` stops at), and hand each run to the calling thread through ``runs`` (None at
        the end, or the exception that ended it). Never waits for the caller: how fast the grader judges, and how
        it judged, cannot reach the program through the moment its next test starts."""
        try:
            for index in range(len(inputs)):
                oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0
                chan.send({"op": "test", "index": index}, inputs[index])
                header, payload = chan.recv(limits.wall + REPLY_GRACE_S)
                status = str(header.get("status", "RE"))
                error = str(header.get("error", ""))
                if status == "SIGNAL" and self.cgroup is not None and self.cgroup.oom_kills() > oom_before:
                    status, error = "MLE", f"killed by the out-of-memory killer (memory cgroup); {error}"
                if status == "SETUP":  # the zygote's own finding: the test process never reached the program
                    raise SandboxError(f"a test process could not be confined: {error}")
                cpu = float(header.get("cpu_s", 0.0))
                slot_cpu = meter.test_cpu_s(header.get("zygote_cpu_s"))
                if slot_cpu is not None and slot_cpu > cpu:  # processes the zygote could not see (kernel-reaped)
                    cpu = slot_cpu
                    if status == "ok" and cpu > limits.time_s:
                        status, error = "TLE", (f"CPU time limit ({limits.time_s:g} s; the test's processes used "
                                                f"{cpu:.2f} s, the slot's cgroup counts)")
                run = TestRun(status=status, output=b"", error=error, cpu_s=cpu,
                              wall_s=float(header.get("wall_s", 0.0)))
                last = stop_after(run) or index + 1 == len(inputs) or halt.is_set()
                if last:
                    chan.send({"op": "end"})  # no reply: the zygote cleans up while we compare
                run.output = held.put(payload)
                del payload
                runs.put((index, run))
                if last:
                    break
            runs.put(None)
        except BaseException as e:  # noqa: BLE001 - handed to the judging thread, which raises it
            runs.put(e if not halt.is_set() else None)


class SlotCpuMeter:
    """A test's CPU as the slot's cgroup counts it: everything every process of the slot spent between the reply
    before the test and the test's own, less what the zygote itself spent (it says so in each reply). Unlike the
    zygote's ``wait4`` and ``/proc`` readings this includes processes nobody in the sandbox reaped (a program that
    ignores SIGCHLD has its exited children reaped by the kernel). The pool sends one test at a time, so the span
    holds one test. None without a cgroup that counts CPU."""

    def __init__(self, cgroup: isolation.SlotCgroup | None, zygote_cpu_s: float | None) -> None:
        self.cgroup = cgroup
        self.slot = cgroup.cpu_s() if cgroup is not None else None
        self.zygote = zygote_cpu_s

    def test_cpu_s(self, zygote_cpu_s: float | None) -> float | None:
        slot = self.cgroup.cpu_s() if self.cgroup is not None else None
        spent = None
        if None not in (slot, self.slot, zygote_cpu_s, self.zygote):
            spent = max(0.0, (slot - self.slot) - (float(zygote_cpu_s) - float(self.zygote)))
        self.slot, self.zygote = slot, zygote_cpu_s
        return spent


class HeldOutputs:
    """A pool's outputs run but not yet judged: in memory up to ``HELD_BYTES`` in all, each one past that in an
    unlinked temporary file, so the grader's memory does not grow with the number of tests or programs however
    slowly it judges. The files hold at most ``SPOOL_BYTES``: past that, :meth:`put` (so the slot that ran the
    output) waits for judgments to take some back. :meth:`put` returns what stands for an output, :meth:`take`
    gives the bytes back (once)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.in_memory = 0
        self.on_disk = 0

    def put(self, payload: bytes):
        with self.lock:
            if self.in_memory + len(payload) <= HELD_BYTES:
                self.in_memory += len(payload)
                return payload
            while self.on_disk and self.on_disk + len(payload) > SPOOL_BYTES:
                self.lock.wait()
            self.on_disk += len(payload)
        spool = tempfile.TemporaryFile(prefix="mars2-output-")  # noqa: SIM115 - closed by take() or drop()
        spool.write(payload)
        return spool

    def take(self, held) -> bytes:
        if isinstance(held, bytes):
            with self.lock:
                self.in_memory -= len(held)
            return held
        with held:
            held.seek(0)
            payload = held.read()
        with self.lock:
            self.on_disk -= len(payload)
            self.lock.notify_all()
        return payload

    def drop(self, runs: queue.SimpleQueue) -> None:
        """Give back what the ``(index, run)`` items left in ``runs`` (never taken) hold: their share of the memory
        budget, their spooled files."""
        while not runs.empty():
            item = runs.get()
            if isinstance(item, tuple):
                self.take(item[1].output)


class Judge:
    """A judge process (``_judge.py``, :mod:`mars2.sandbox.judging`): the grader's comparisons run there, niced to the
    lowest priority, not in the grader's own process, whose threads feed programs their tests (why: the module
    docstring of :mod:`mars2.sandbox.judging`). One program at a time: :meth:`load` its tests, then :meth:`judge`
    each run; a judge process that died is started again once per call."""

    NICE = 19

    def __init__(self, cpus: frozenset[int] = frozenset()) -> None:
        self.proc: subprocess.Popen | None = None
        self.loaded: bytes = b""
        self.cpus = cpus  # the pool's judge cores (none: anywhere)

    def _start(self) -> None:
        self.proc = subprocess.Popen([isolation.python_executable(), "-I", "-S", "-B", "-X", "utf8", JUDGE_PATH],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env={"PATH": os.defpath}, start_new_session=True, bufsize=0)
        try:
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, self.NICE)
        except OSError:
            pass
        if self.cpus:
            os.sched_setaffinity(self.proc.pid, self.cpus)

    def _send(self, header: dict[str, Any], payload: bytes) -> None:
        if self.proc is None or exit_code(self.proc) is not None:
            self.close()
            self._start()
            if header["op"] != "load" and self.loaded:
                self._write({"op": "load"}, self.loaded)
        self._write(header, payload)

    def _write(self, header: dict[str, Any], payload: bytes) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        write_frame(self.proc.stdin.fileno(), header, payload)  # whole: a raw pipe write may be partial

    def load(self, tests: list[dict[str, str]], memory_mb: int) -> None:
        """The next program's tests (``{"input", "output", "mode"}``) and memory allowance; sent before it runs."""
        self.loaded = json.dumps({"tests": tests, "memory_mb": memory_mb}).encode()
        try:
            self._send({"op": "load"}, self.loaded)
        except OSError:
            self.close()  # started again with these tests at the first judgment

    def judge(self, index: int, run: TestRun) -> tuple[str, str]:
        """``(status, detail)`` of ``run``, the program's run of its test ``index``."""
        header = {"op": "judge", "index": index, "status": run.status, "error": run.error}
        for attempt in range(2):
            try:
                self._send(header, run.output)
                assert self.proc is not None and self.proc.stdout is not None
                if not select.select([self.proc.stdout], [], [], JUDGE_TIMEOUT_S)[0]:
                    self.close()  # a judgment past any measured one: the judge is stuck, not worth a second try
                    raise SandboxError(f"judging test {index + 1} took over {JUDGE_TIMEOUT_S:g} s")
                reply, _ = read_frame(self.proc.stdout.fileno())
                break
            except (OSError, EOFError, ValueError) as e:
                self.close()
                if attempt:
                    raise SandboxError(f"the judge process failed twice: {type(e).__name__}: {e}") from None
        if "error" in reply:
            raise RuntimeError(f"judging test {index + 1} failed: {reply['error']}")
        return reply["status"], reply["detail"]

    def close(self) -> None:
        if self.proc is not None:
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            kill_group(self.proc)
            self.proc = None


class SandboxPool:
    """``workers`` slots (default: one per CPU core available to this process) at one isolation level.

    ``isolation``: ``auto`` (the strongest that works here, see :func:`mars2.sandbox.isolation.choose_level`),
    ``bwrap`` (fail if unavailable) or ``process``. Slots start lazily and are reused across calls;
    :meth:`close` (also run at interpreter exit) stops them and removes their folders; folders a killed grader
    left are reclaimed when a ``process`` pool starts. ``failures`` counts the sandbox failures met (each one a
    slot restart).
    """

    def __init__(self, workers: int | None = None, isolation_level: str = "auto", *, memory_ceiling_mb: int = 1024,
                 nproc_ceiling: int = 512, tmpfs_mb: int = 256, use_cgroups: bool = True,
                 judge_cores: int | None = None) -> None:
        self.workers = default_workers() if not workers else int(workers)
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be from 1 to {MAX_WORKERS}, got {workers}")
        self.judge_cores = default_judge_cores() if judge_cores is None else judge_cores
        self.slot_cpus, self.judge_cpus = split_cores(self.judge_cores)
        self.probe = isolation.probe_isolation()
        self.level = isolation.choose_level(isolation_level, self.probe)
        self.requested = isolation_level
        isolation.warn_once_if_weaker(self.level, self.probe, isolation_level)
        if self.level == "process":
            isolation.reclaim_stale_slot_dirs()
        self.failures = 0
        self._failures_lock = threading.Lock()
        self.memory_ceiling_mb = memory_ceiling_mb
        self.nproc_ceiling = nproc_ceiling
        self.tmpfs_bytes = tmpfs_mb * MIB
        self.use_cgroups = use_cgroups
        self.slots = [Slot(i, self) for i in range(self.workers)]
        self._free: queue.Queue[Slot] = queue.Queue()
        for slot in self.slots:
            self._free.put(slot)
        self._closed = False
        self.held = HeldOutputs()
        self._judges: queue.LifoQueue[Judge] = queue.LifoQueue()
        self._all_judges: list[Judge] = []
        self._judges_lock = threading.Lock()
        atexit.register(self.close)

    def slot_cpu_cores(self) -> float:
        """The CPU a slot's sandbox may use at most (its cgroup's bandwidth cap): the slots' cores shared among the
        slots, and at least one core (a single-threaded program is never slowed by the cap)."""
        cores = len(self.slot_cpus) or usable_cpus()
        return max(1.0, cores / self.workers)

    def params(self) -> dict[str, str]:
        """Flat ``sandbox.*`` strings describing the isolation in use (for MLflow params)."""
        return {**isolation.describe(self.level, self.probe), "sandbox.workers": str(self.workers),
                "sandbox.judge_cpus": ",".join(map(str, sorted(self.judge_cpus))) or "shared"}

    def count_failure(self) -> None:
        with self._failures_lock:
            self.failures += 1

    def acquire(self) -> Slot:
        if self._closed:
            raise RuntimeError("sandbox pool is closed")
        return self._free.get()

    def release(self, slot: Slot) -> None:
        self._free.put(slot)

    def acquire_judge(self) -> Judge:
        """A judge process for one program (a new one when every judge is in use; :func:`mars2.sandbox.grade_many`
        judges at most ``workers`` programs at once)."""
        try:
            return self._judges.get_nowait()
        except queue.Empty:
            judge = Judge(self.judge_cpus)
            with self._judges_lock:
                self._all_judges.append(judge)
            return judge

    def release_judge(self, judge: Judge) -> None:
        self._judges.put(judge)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for slot in self.slots:
            slot.close()
            if slot.cgroup is not None:
                slot.cgroup.remove()
        with self._judges_lock:
            for judge in self._all_judges:
                judge.close()


def _sandbox_init(info_fd: int, timeout: float) -> int:
    """A pidfd of the sandbox's init, from what bubblewrap writes on its ``--info-fd`` (``{"child-pid": N}``)."""
    import json

    data = b""
    deadline = time.monotonic() + timeout
    while not data.rstrip().endswith(b"}"):
        ready, _, _ = select.select([info_fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(info_fd, 4096) if ready else b""
        if not chunk:
            raise SandboxError(f"bubblewrap gave no sandbox pid ({data[:200]!r})")
        data += chunk
    try:
        return os.pidfd_open(int(json.loads(data)["child-pid"]))
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise SandboxError(f"bubblewrap's sandbox pid is unusable ({data[:200]!r}: {e})") from None


def _process_table() -> dict[int, tuple[int, int, str]]:
    """``pid -> (ppid, real uid, pid-namespace link)`` for every visible process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            ns = os.readlink(f"/proc/{entry}/ns/pid")
            table[int(entry)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]), ns)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return table


def default_workers() -> int:
    """One slot per core this process may use (:func:`mars2.cpu.usable_cpus`) and the judges do not."""
    return max(1, usable_cpus() - default_judge_cores())


def default_judge_cores() -> int:
    """Cores kept for the judge processes: one where this process may use ``JUDGE_CORE_FROM`` or more, else none
    (the judges share the cores with the slots, at nice 19)."""
    return 1 if usable_cpus() >= JUDGE_CORE_FROM else 0


def split_cores(judge_cores: int) -> tuple[frozenset[int], frozenset[int]]:
    """``(slot_cpus, judge_cpus)``: the last ``judge_cores`` physical cores of this process's affinity, each with its
    SMT siblings, for the judges; the rest for the slots. Two empty sets when ``judge_cores`` is 0 or nothing would
    be left for the slots (everything runs anywhere)."""
    if judge_cores < 0:
        raise ValueError(f"judge_cores must be >= 0, got {judge_cores}")
    try:
        allowed = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(), frozenset()
    judges: set[int] = set()
    for _ in range(judge_cores):
        rest = allowed - judges
        if not rest:
            break
        judges |= _smt_siblings(max(rest)) & allowed
    if not judges or judges >= allowed:
        return frozenset(), frozenset()
    return frozenset(allowed - judges), frozenset(judges)


def _smt_siblings(cpu: int) -> set[int]:
    """``cpu`` and the logical CPUs sharing its physical core (``thread_siblings_list``: ``"3,7"`` or ``"6-7"``)."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        found: set[int] = set()
        for part in text.split(","):
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
        return found | {cpu}
    except (OSError, ValueError):
        return {cpu}


_pools: dict[tuple[int, str, int], SandboxPool] = {}
_pools_lock = threading.Lock()


def shared_pool(workers: int | None = None, isolation_level: str = "auto",
                judge_cores: int | None = None) -> SandboxPool:
    """The process-wide pool for ``(workers, isolation, judge_cores)`` (None: the defaults), created on first use."""
    n = default_workers() if not workers else int(workers)
    judges = default_judge_cores() if judge_cores is None or judge_cores < 0 else judge_cores
    key = (n, isolation_level, judges)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool._closed:
            pool = SandboxPool(n, isolation_level, judge_cores=judges)
            _pools[key] = pool
        return pool


def close_shared_pools() -> None:
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()
