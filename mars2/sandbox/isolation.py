"""What isolation this host offers, and how a worker slot's sandbox is built from it.

:func:`probe_isolation` runs once per process (cached) and reports what works here: bubblewrap and
the namespaces it can create, seccomp, Landlock, a dedicated unprivileged uid per worker slot, and
writable cgroups (v1 or v2). :func:`choose_level` turns a requested level (``auto``, ``bwrap``,
``process``) into the one used:

``bwrap``
    Each worker slot is one long-lived bubblewrap sandbox: new pid, network, mount, ipc, uts (and
    cgroup) namespaces; a read-only view of ``/usr``, the Python prefix(es) and this package's
    directory, a size-capped private ``/tmp``, a minimal ``/dev`` and a private ``/proc``; no network
    but loopback; everything in it dies with the slot. Started as root, bubblewrap keeps only the
    capabilities the zygote needs (:data:`BWRAP_CAPS`) and every test runs as the slot's dedicated uid
    with none; started as another user, bubblewrap uses a user namespace and tests run as that user.
``process``
    The zygote is a plain child process (for hosts where bubblewrap cannot create namespaces, e.g.
    Docker's default seccomp profile). Tests still get rlimits, their own session, a private scratch
    folder, a scrubbed environment, no capabilities, seccomp (also no process creation when no dedicated
    uid is possible, and no ``kill(-1)``), Landlock (read-only view of the interpreter, writes only in the
    program's own folder, no TCP, signals scoped to the test) and a dedicated uid when the interpreter is
    reachable by one. ``auto`` falls back to it only where it holds what ``bwrap`` holds
    (:func:`process_level_gaps` is empty); ``isolation=process`` takes it as it is, with a warning.

See ``docs/sandbox.md`` for what each level protects against and what a GPU worker or a Docker
deployment should enable.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mars2.config import ISOLATIONS as LEVELS

log = logging.getLogger(__name__)

SANDBOX_DIR = str(Path(__file__).resolve().parent)
RUNNER_PATH = os.path.join(SANDBOX_DIR, "_entry.py")
MOUNTED_SANDBOX_DIR = "/sandbox"
SCRATCH_IN_BWRAP = "/tmp/sb"
UID_BASE = int(os.environ.get("MARS2_SANDBOX_UID_BASE", "61000"))
UID_COUNT = int(os.environ.get("MARS2_SANDBOX_UID_COUNT", "512"))
CGROUP_NAME = "mars2-sandbox"
# the zygote's (tests drop them all): uid changes, kills and cleanup; CAP_SYS_ADMIN only to remount /proc hidepid
# and fork its mount helper at its start, then dropped (the helper keeps it: a tmpfs and a random next pid per program)
BWRAP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SYS_ADMIN")
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "OMP_NUM_THREADS": "1",  # LiveCodeBench's reliability_guard sets this
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "2",  # glibc: 64 MiB of address space per thread arena otherwise
}

SLOT_PARENT = "mars2-sandbox"  # <tmp>/mars2-sandbox-<euid>/<pid>-<slot>-<random>/: the process level's slot folders
STALE_GRACE_S = 10.0  # a slot folder is reclaimed only once unchanged this long (one being created is not yet locked)

_probe_lock = threading.Lock()
_probe_cache: dict[str, Any] | None = None
_warned: set[str] = set()


def python_executable() -> str:
    return os.path.realpath(sys.executable)


def python_roots() -> list[str]:
    """Directories the interpreter needs: its prefixes and site-packages, minimal (nested ones dropped)."""
    candidates = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix)}
    candidates.add(os.path.dirname(os.path.dirname(python_executable())))
    for path in site.getsitepackages():
        if os.path.isdir(path):
            candidates.add(os.path.realpath(path))
    roots: list[str] = []
    for path in sorted(candidates, key=len):
        if not any(path == r or path.startswith(r + os.sep) for r in roots):
            roots.append(path)
    return roots


def site_paths() -> list[str]:
    return [p for p in site.getsitepackages() if os.path.isdir(p)]


def reachable_by_others(path: str) -> bool:
    """Whether a user with no special rights can traverse to ``path`` and read it."""
    parts = Path(os.path.realpath(path)).parts
    current = Path(parts[0])
    for part in parts[1:]:
        try:
            mode = current.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
        current = current / part
    try:
        return bool(current.stat().st_mode & stat.S_IROTH)
    except OSError:
        return False


# --- dedicated uids -------------------------------------------------------------------------------


class UidLease:
    """An exclusive lease on one uid of the sandbox range, held through a ``flock`` for this object's life.

    Worker slots of every grader process on the host (tests, the pipeline, benchmarks running at the
    same time) get distinct uids, so the per-uid process limit and ``kill``-by-uid never touch
    another slot's programs.
    """

    def __init__(self) -> None:
        import pwd

        # one place per host, whatever TMPDIR a grader runs with
        base = "/run" if os.geteuid() == 0 and os.access("/run", os.W_OK) else tempfile.gettempdir()
        lock_dir = os.path.join(base, "mars2-sandbox-uids")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            try:
                pwd.getpwuid(uid)
                continue  # a real account: not ours to use
            except KeyError:
                pass
            fd = os.open(os.path.join(lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid = self.gid = uid
            self._fd: int | None = fd
            return
        raise RuntimeError(f"no free sandbox uid in {UID_BASE}..{UID_BASE + UID_COUNT - 1}")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def kill_uid_processes(uid: int) -> int:
    """SIGKILL every process whose real uid is ``uid`` (leftovers of a crashed grader). Returns the count."""
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            os.kill(int(entry), 9)
                            killed += 1
                        break
        except (OSError, ValueError):
            continue
    return killed


# --- slot folders (process level) ------------------------------------------------------------------


def slot_parent() -> str:
    """Where this user's ``process``-level slot folders live (one parent per user: a shared ``/tmp`` works)."""
    return os.path.join(tempfile.gettempdir(), f"{SLOT_PARENT}-{os.geteuid()}")


class SlotDir:
    """A ``process``-level slot's folder on the host, ``<tmp>/mars2-sandbox-<euid>/<pid>-<slot>-<random>/``, holding the
    zygote's scratch root. The grader holds an ``flock`` on its ``lock`` file for as long as the slot lives; the
    grader removes it on close, the zygote when the grader goes away, and :func:`reclaim_stale_slot_dirs` when both
    were killed. Folders are ``0711``: a program passes through them to its own scratch folder, lists none."""

    def __init__(self, index: int) -> None:
        parent = slot_parent()
        os.makedirs(parent, mode=0o711, exist_ok=True)
        self.path = tempfile.mkdtemp(prefix=f"{os.getpid()}-{index}-", dir=parent)
        os.chmod(self.path, 0o711)
        self._lock: int | None = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def remove(self) -> None:
        _remove_tree(self.path)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def reclaim_stale_slot_dirs(parent: str | None = None) -> int:
    """Remove the slot folders under ``parent`` (default :func:`slot_parent`) whose grader is gone: unchanged for
    ``STALE_GRACE_S`` and their lock file free or missing. Returns how many were removed."""
    import time

    parent = parent or slot_parent()
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(parent, name)
        try:
            if time.time() - os.lstat(path).st_mtime < STALE_GRACE_S:
                continue
            fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            if os.path.isdir(path):
                _remove_tree(path)
                removed += 1
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live grader holds it
        finally:
            os.close(fd)
        _remove_tree(path)
        removed += 1
    return removed


def _remove_tree(path: str) -> None:
    """Remove ``path`` whole, even folders a program made unreadable; never follows a link, never raises."""
    from mars2.sandbox.runner.files import open_up

    open_up(path)
    shutil.rmtree(path, ignore_errors=True)


# --- cgroups --------------------------------------------------------------------------------------


CFS_PERIOD_US = 100_000  # the kernel's default period of CPU bandwidth control


class SlotCgroup:
    """Memory and pids limits, and a CPU share, for one slot's whole sandbox (cgroup v1 or v2), created once,
    reused.

    The memory limit caps everything the slot holds (the zygote, a test and all its children, its
    tmpfs files), which ``RLIMIT_AS`` (per process) cannot; an OOM kill inside it is reported as
    ``MLE``. The pids limit caps fork bombs independently of uids. The CPU controller (where the host has one)
    gives every slot the same weight whatever number of processes it runs, and caps it at ``cpu_cores`` cores (CFS
    bandwidth: ``cpu.cfs_quota_us`` / ``cpu.max`` = ``cpu_cores`` periods a period), so the processes one program
    leaves spinning cannot starve the program in another slot into a wall-clock time-out (equal weights alone did
    not hold against many processes of many threads). :meth:`cpu_s` is the CPU every process of the slot has spent,
    however it was reaped: the pool charges a test what the slot spent while it ran, less the zygote's own.
    """

    def __init__(self, version: str, name: str, memory_bytes: int, pids_max: int,
                 cpu_cores: float | None = None) -> None:
        self.version = version
        self.dirs: list[str] = []
        self.cpu_usage: str | None = None
        if version == "v1":
            for controller in ("memory", "pids"):
                path = os.path.join("/sys/fs/cgroup", controller, CGROUP_NAME, name)
                os.makedirs(path, exist_ok=True)
                self.dirs.append(path)
            self.memory_dir, self.pids_dir = self.dirs
            _write(os.path.join(self.memory_dir, "memory.limit_in_bytes"), str(memory_bytes))
            _write(os.path.join(self.pids_dir, "pids.max"), str(pids_max))
            self.events = os.path.join(self.memory_dir, "memory.oom_control")
            # at the top of the cpu hierarchy, with the default weight (cpu.shares 1024): each slot weighs as much
            # as one process on the host, as its test process did before, however many processes a program starts
            cpu = os.path.join("/sys/fs/cgroup", "cpu", f"{CGROUP_NAME}-{name}")
            try:
                os.makedirs(cpu, exist_ok=True)
                self.dirs.append(cpu)
            except OSError:
                pass  # no cpu controller here: slots share the CPU as their processes do (docs/sandbox.md)
            else:
                if cpu_cores is not None:
                    _write(os.path.join(cpu, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
                    _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(round(cpu_cores * CFS_PERIOD_US)))
            # the CPU every process of the slot spent, the exited ones' included: cpuacct, mounted with cpu or alone
            if os.path.exists(os.path.join(cpu, "cpuacct.usage")):
                self.cpu_usage = os.path.join(cpu, "cpuacct.usage")
            else:
                acct = os.path.join("/sys/fs/cgroup", "cpuacct", CGROUP_NAME, name)
                try:
                    os.makedirs(acct, exist_ok=True)
                except OSError:
                    pass  # no cpuacct controller: the zygote's own accounting alone (docs/sandbox.md)
                else:
                    self.dirs.append(acct)
                    self.cpu_usage = os.path.join(acct, "cpuacct.usage")
        else:
            top = os.path.join("/sys/fs/cgroup", CGROUP_NAME)
            os.makedirs(top, exist_ok=True)
            _write(os.path.join(top, "cgroup.subtree_control"), "+memory +pids")
            try:  # the same weight (cpu.weight 100) for every slot, where the cpu controller is delegated
                _write(os.path.join(top, "cgroup.subtree_control"), "+cpu")
            except OSError:
                pass
            path = os.path.join(top, name)
            os.makedirs(path, exist_ok=True)
            self.dirs.append(path)
            self.memory_dir = self.pids_dir = path
            _write(os.path.join(path, "memory.max"), str(memory_bytes))
            try:
                _write(os.path.join(path, "memory.swap.max"), "0")
            except OSError:
                pass
            _write(os.path.join(path, "pids.max"), str(pids_max))
            if cpu_cores is not None and os.path.exists(os.path.join(path, "cpu.max")):
                _write(os.path.join(path, "cpu.max"), f"{round(cpu_cores * CFS_PERIOD_US)} {CFS_PERIOD_US}")
            self.events = os.path.join(path, "memory.events")
            self.cpu_usage = os.path.join(path, "cpu.stat")
        self.procs = [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def set_memory(self, memory_bytes: int) -> None:
        name = "memory.limit_in_bytes" if self.version == "v1" else "memory.max"
        _write(os.path.join(self.memory_dir, name), str(memory_bytes))

    def attach_current(self) -> None:
        """Move the calling process into the cgroup (used in the sandbox launcher's pre-exec hook)."""
        pid = str(os.getpid()).encode()
        for path in self.procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def oom_kills(self) -> int:
        try:
            with open(self.events) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def cpu_s(self) -> float | None:
        """The CPU seconds every process that ever ran in the slot has spent (exited ones included, however they
        were reaped): ``cpuacct.usage`` (v1, ns) or ``cpu.stat``'s ``usage_usec`` (v2); None where neither is."""
        if self.cpu_usage is None:
            return None
        try:
            with open(self.cpu_usage) as f:
                text = f.read()
            if self.version == "v1":
                return int(text) / 1e9
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def remove(self) -> None:
        for path in self.dirs:
            try:
                os.rmdir(path)
            except OSError:
                pass


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _cgroup_support() -> dict[str, Any]:
    """Which cgroup hierarchy we can create slot cgroups in (root only)."""
    if os.geteuid() != 0:
        return {"cgroup": None}
    v1 = all(os.path.isdir(f"/sys/fs/cgroup/{c}") and os.access(f"/sys/fs/cgroup/{c}", os.W_OK)
             for c in ("memory", "pids"))
    if v1:
        try:
            probe = SlotCgroup("v1", f"probe-{os.getpid()}", 64 << 20, 64)
            probe.remove()
            return {"cgroup": "v1"}
        except OSError as e:
            log.debug("cgroup v1 not usable: %s", e)
    controllers = Path("/sys/fs/cgroup/cgroup.controllers")
    if controllers.exists():
        try:
            have = set(controllers.read_text().split())
            if {"memory", "pids"} <= have:
                probe = SlotCgroup("v2", f"probe-{os.getpid()}", 64 << 20, 64)
                probe.remove()
                return {"cgroup": "v2"}
        except OSError as e:
            log.debug("cgroup v2 not usable: %s", e)
    return {"cgroup": None}


# --- bubblewrap -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxSpec:
    """How one slot's zygote is started."""

    level: str  # bwrap | process
    privileged: bool  # started as root: a dedicated uid per slot
    tmpfs_bytes: int = 256 << 20


def bwrap_argv(spec: SandboxSpec, command: list[str], info_fd: int | None = None) -> list[str]:
    """The bubblewrap command line wrapping ``command`` for one slot; ``info_fd``: where bubblewrap writes the host pid
    of the sandbox's init (``{"child-pid": N}``), whose death takes the whole sandbox down."""
    bwrap = shutil.which("bwrap") or "bwrap"
    # no --die-with-parent: it is tied to the *thread* that started bwrap (PR_SET_PDEATHSIG), and grader
    # threads come and go; the zygote exits when its control pipe closes instead (grader gone)
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--new-session"]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    if spec.privileged:
        args += ["--cap-drop", "ALL"]
        for cap in BWRAP_CAPS:
            args += ["--cap-add", cap]
    else:
        args += ["--unshare-user", "--disable-userns"]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    made: set[str] = {"/", "/usr", "/etc", "/tmp", "/dev", "/proc"}
    for root in python_roots():
        if root == "/usr" or root.startswith("/usr/"):
            continue
        parent = os.path.dirname(root)
        chain = []
        while parent not in made and parent != "/":
            chain.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(chain):
            args += ["--perms", "0755", "--dir", directory]
            made.add(directory)
        args += ["--ro-bind", root, root]
        made.add(root)
    args += ["--ro-bind", SANDBOX_DIR, MOUNTED_SANDBOX_DIR, "--proc", "/proc", "--dev", "/dev"]
    for path in HOST_COUNTERS:  # read as empty (a bind of /dev/null: no file of the sandbox's own to write to)
        if os.path.exists(path):
            args += ["--dev-bind", "/dev/null", path]
    args += ["--perms", "0755", "--size", str(spec.tmpfs_bytes), "--tmpfs", "/tmp",
             "--chdir", "/tmp", "--clearenv"]
    for key, value in CHILD_ENV.items():
        args += ["--setenv", key, value]
    return args + ["--"] + command


HOST_COUNTERS = (
    "/proc/stat", "/proc/loadavg", "/proc/meminfo", "/proc/vmstat", "/proc/zoneinfo", "/proc/buddyinfo",
    "/proc/pagetypeinfo", "/proc/interrupts", "/proc/softirqs", "/proc/schedstat", "/proc/diskstats", "/proc/locks",
    "/proc/swaps", "/proc/key-users", "/proc/pressure/cpu", "/proc/pressure/io", "/proc/pressure/memory",
    "/proc/pressure/irq", "/proc/sys/fs/file-nr", "/proc/sys/fs/inode-nr", "/proc/sys/fs/inode-state",
    "/proc/sys/fs/dentry-state", "/proc/sys/fs/aio-nr", "/proc/sys/kernel/pty/nr",
    "/proc/sys/kernel/random/entropy_avail", "/proc/uptime", "/proc/cpuinfo",
)
"""Host-wide kernel counters a program could move (forks, files, memory, locks, load) for a later program to read,
or read to see how busy the host is (the idle time in ``/proc/uptime`` sums every core's, the judges' included,
so it tells a slow judgment of the previous program's answer from a fast one; the clock rates in ``/proc/cpuinfo``):
at the ``bwrap`` level each reads as empty. (The pid namespace's own counters stay: ``ns_last_pid`` is scrambled
before each program instead; the ``process`` level reads no ``/proc`` at all.)"""


def runner_command(runner_path: str, cfg: dict[str, Any]) -> list[str]:
    return [python_executable(), "-I", "-S", "-B", "-X", "utf8", runner_path, json.dumps(cfg)]


def _probe_bwrap(privileged: bool) -> dict[str, Any]:
    """Start a throw-away sandbox and look at it from inside."""
    code = (
        "import json, os, socket\n"
        "r = {'pid': os.getpid(), 'ifaces': [n for _, n in socket.if_nameindex()]}\n"
        "try:\n    open('/usr/.mars2-probe', 'w'); r['ro'] = False\nexcept OSError:\n    r['ro'] = True\n"
        "r['home_hidden'] = not os.path.exists('/root/.ssh') and not os.path.exists('/home')\n"
        f"uid = {UID_BASE + UID_COUNT}\n"
        "if os.getuid() == 0 and " + repr(privileged) + ":\n"
        "    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)\n"
        "r['uid'] = os.getuid()\n"
        "print(json.dumps(r))\n"
    )
    spec = SandboxSpec("bwrap", privileged, tmpfs_bytes=16 << 20)
    argv = bwrap_argv(spec, [python_executable(), "-I", "-S", "-c", code])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"bwrap": False, "bwrap_error": str(e)}
    if out.returncode != 0:
        return {"bwrap": False, "bwrap_error": (out.stderr or out.stdout).strip()[-500:]}
    try:
        seen = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"bwrap": False, "bwrap_error": f"unexpected probe output {out.stdout[-200:]!r}"}
    return {
        "bwrap": True,
        "pid_namespace": seen["pid"] <= 3,
        "net_namespace": set(seen["ifaces"]) <= {"lo"},
        "readonly_root": bool(seen["ro"]),
        "user_namespace": not privileged,
        "dedicated_uid": privileged and seen["uid"] == UID_BASE + UID_COUNT,
    }


def _probe_kernel() -> dict[str, Any]:
    try:
        out = subprocess.run([python_executable(), "-I", "-S", RUNNER_PATH, "--probe"], capture_output=True,
                             text=True, timeout=30, stdin=subprocess.DEVNULL, env={"PATH": os.defpath})
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as e:
        return {"seccomp": False, "landlock_abi": 0, "kernel_probe_error": str(e)}


def probe_isolation(refresh: bool = False) -> dict[str, Any]:
    """What works on this host (cached after the first call); ``level`` is what ``isolation=auto`` picks.

    Keys: ``root``, ``bwrap`` (and ``pid_namespace``, ``net_namespace``, ``readonly_root``,
    ``user_namespace``, ``dedicated_uid`` when it does, else ``bwrap_error``), ``seccomp``,
    ``landlock_abi`` (0 = none), ``private_mounts`` (whether a slot's zygote may enter a mount namespace of its own
    and mount a tmpfs per program at the ``process`` level: root with CAP_SYS_ADMIN), ``cgroup`` (``v1``, ``v2`` or None), ``process_dedicated_uid``
    (whether the ``process`` level can run tests as a dedicated uid: root, and the interpreter
    readable by other users or made so in the zygote's own mount namespace), ``level``.
    """
    global _probe_cache
    with _probe_lock:
        if _probe_cache is not None and not refresh:
            return dict(_probe_cache)
        root = os.geteuid() == 0
        result: dict[str, Any] = {"root": root, "bwrap_path": shutil.which("bwrap")}
        if result["bwrap_path"]:
            result.update(_probe_bwrap(privileged=root))
        else:
            result.update(bwrap=False, bwrap_error="bwrap not installed (apt-get install bubblewrap)")
        result.update(_probe_kernel())
        result.update(_cgroup_support())
        # the zygote can make the interpreter reachable in a mount namespace of its own (mounts.expose_to_others)
        result["process_dedicated_uid"] = root and (bool(result.get("private_mounts")) or all(
            reachable_by_others(p) for p in python_roots() + [SANDBOX_DIR]))
        result["process_gaps"] = process_level_gaps(result)
        result["level"] = "bwrap" if result.get("bwrap") else "process" if not result["process_gaps"] else None
        _probe_cache = result
        return dict(result)


def process_level_gaps(probe: dict[str, Any]) -> list[str]:
    """What the ``process`` level would miss on this host to hold what the ``bwrap`` level holds (empty: nothing).

    It needs seccomp (no sockets, nothing aimed at another process, no process creation without a dedicated uid),
    Landlock (filesystem: read-only system paths, writes only in the program's own folder), and either a dedicated
    uid per slot or Landlock ABI >= 6 (signals scoped to the test: a test running as the grader's uid could
    otherwise signal the grader's other processes)."""
    gaps = []
    if not probe.get("seccomp"):
        gaps.append("seccomp filters cannot be installed")
    abi = int(probe.get("landlock_abi") or 0)
    if abi < 1:
        gaps.append("Landlock is not available (kernel >= 5.13 with the landlock LSM enabled)")
    elif abi < 6 and not probe.get("process_dedicated_uid"):
        gaps.append(f"Landlock ABI {abi} cannot scope signals (ABI >= 6, kernel >= 6.12) and no dedicated uid is "
                    "possible (run as root, with Python readable by other users)")
    return gaps


def choose_level(requested: str, probe: dict[str, Any]) -> str:
    """The level a pool uses: ``auto`` is ``bwrap`` where bubblewrap works, else ``process`` where that level holds
    the same guarantees (:func:`process_level_gaps`), else an error saying what is missing; ``bwrap`` and
    ``process`` are taken as asked (``bwrap`` fails where it does not work)."""
    if requested not in LEVELS:
        raise ValueError(f"isolation={requested!r} is unknown; use one of {LEVELS}")
    if requested == "auto":
        if probe.get("level") is None:
            raise RuntimeError(
                "no sandbox level that holds the grader's guarantees works on this host: bubblewrap cannot run "
                f"({probe.get('bwrap_error')}), and the process level lacks: {'; '.join(probe.get('process_gaps', []))}. "
                "Install bubblewrap (apt-get install bubblewrap; in Docker see docs/sandbox.md), or pass "
                "isolation=process to accept the weaker guarantees docs/sandbox.md lists for it.")
        return str(probe["level"])
    if requested == "bwrap" and not probe.get("bwrap"):
        raise RuntimeError(f"isolation=bwrap requested but bubblewrap does not work here: {probe.get('bwrap_error')}")
    return requested


def warn_once_if_weaker(level: str, probe: dict[str, Any], requested: str) -> None:
    """Log, once per process and level, that programs are graded at a level weaker than ``bwrap``."""
    if level == "bwrap" or level in _warned:
        return
    _warned.add(level)
    gaps = probe.get("process_gaps") or []
    log.warning(
        "SANDBOX: untrusted programs are graded at the %r isolation level (isolation=%s; bubblewrap: %s). %s "
        "See docs/sandbox.md for what each level guarantees.", level, requested,
        "works" if probe.get("bwrap") else probe.get("bwrap_error", "unavailable"),
        f"This host leaves it WEAKER than bwrap: {'; '.join(gaps)}." if gaps else
        "It holds the same guarantees here (seccomp, Landlock, no capabilities), without namespaces.")


def describe(level: str, probe: dict[str, Any]) -> dict[str, str]:
    """Flat ``sandbox.*`` parameters (strings) describing the isolation in use, for MLflow params."""
    if level == "bwrap":
        namespaces = "pid,net,mount,ipc,uts" + ("" if probe.get("root") else ",user")
        uid = "dedicated-per-slot" if probe.get("dedicated_uid") else "caller (user namespace)"
        fs = "read-only view, private tmpfs"
    else:
        namespaces = "none"
        uid = "dedicated-per-slot" if probe.get("process_dedicated_uid") else "caller, no capabilities"
        fs = ("landlock: read-only system paths, writes only in the program's own folder" if probe.get("landlock_abi")
              else "host (scratch cwd only by convention)")
        fs += ", a tmpfs per program" if probe.get("private_mounts") else ", quotas polled"
    return {
        "sandbox.isolation": level,
        "sandbox.namespaces": namespaces,
        "sandbox.uid": uid,
        "sandbox.filesystem": fs,
        "sandbox.network": "none (loopback only)" if level == "bwrap" else (
            "no sockets (seccomp)" if probe.get("seccomp") else "host network"),
        "sandbox.seccomp": "on" if probe.get("seccomp") else "off",
        "sandbox.landlock_abi": str(probe.get("landlock_abi", 0) if level == "process" else "unused"),
        "sandbox.cgroup": str(probe.get("cgroup") or "none"),
        "sandbox.gaps": "none" if level == "bwrap" else ("; ".join(probe.get("process_gaps") or []) or "none"),
    }
