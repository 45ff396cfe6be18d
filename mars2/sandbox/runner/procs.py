"""Process bookkeeping of the zygote: who is still alive in the slot, reaping, CPU time and address space, and what
test processes may see of the slot's pid namespace."""

import os
import time

_MS_REMOUNT = 32


def hide_other_processes(gid):
    """Remount the slot's ``/proc`` with ``hidepid=invisible``: a test process sees only processes of its own uid,
    not the zygote (whose counters a program could otherwise modulate for a later program to read); group ``gid``
    (the zygote's) still sees everything. Needs CAP_SYS_ADMIN in the pid namespace's owner."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"proc", b"/proc", b"proc", _MS_REMOUNT, f"hidepid=invisible,gid={gid}".encode()) != 0:
        raise OSError(ctypes.get_errno(), "cannot remount /proc with hidepid")


_PID_SPAN = []


def scramble_next_pid(rng=os.urandom):
    """Start the slot's pid namespace's next pid at a random value, so that no program can read from its own pid how
    many pids the programs before it used (a covert channel across programs). Needs CAP_SYS_ADMIN (or, from Linux
    5.9, CAP_CHECKPOINT_RESTORE) over the namespace; returns False where it is refused."""
    try:
        if not _PID_SPAN:
            with open("/proc/sys/kernel/pid_max") as f:
                _PID_SPAN.append(max(1, int(f.read()) - 65536 - 1000))
        fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY)
        try:
            os.write(fd, str(1000 + int.from_bytes(rng(4), "little") % _PID_SPAN[0]).encode())
        finally:
            os.close(fd)
        return True
    except (OSError, ValueError):
        return False


def ns_pids(me):
    """Pids in our (small) pid namespace other than init (1) and ``me``."""
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
    except OSError:
        return []


def children_of(pid):
    """The pids of ``pid``'s live or unreaped children (``/proc/<pid>/task/*/children``, else a scan of ``/proc``)."""
    found = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update(int(p) for p in f.read().split())
        return found
    except OSError:
        pass
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.add(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found


def reap_children():
    """Reap every child that has exited; the CPU seconds they used, their own waited-for descendants included (the
    zygote is a child subreaper: a test's orphans, however detached, end up here)."""
    cpu = 0.0
    while True:
        try:
            pid, _, rusage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return cpu
        if pid == 0:
            return cpu
        cpu += rusage.ru_utime + rusage.ru_stime


def wait_exit(pid, timeout):
    """Wait (without reaping) until ``pid`` has exited; False if it still runs after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def alive(pid):
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    except (OSError, ValueError, IndexError):
        return 0.0


def vm_size():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
