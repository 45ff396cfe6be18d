"""A fresh filesystem per program, and at the ``bwrap`` level a random first pid: each program's scratch folder is a
tmpfs of its own, mounted by a tiny helper process that keeps CAP_SYS_ADMIN so that the zygote can give it up; in the
slot's own pid namespace the helper also sets the next pid to a random value before each program
(:func:`.procs.scramble_next_pid`). At the ``process`` level (no bubblewrap) the zygote first enters a mount namespace
of its own (:func:`enter_private_mount_namespace`, where the grader is root), so the mounts are the slot's alone.

A tmpfs of ``disk_mb`` bytes and ``max_files + 1`` inodes makes the quotas the kernel's (``ENOSPC``, files unlinked
while open included), and its inode numbers and allocation state start afresh: nothing a program does to its
filesystem (how many files it made, how it fragmented it) is visible to a later program. Unmounted (detached) once
the program is done, after its processes are killed (the helper does it while the zygote goes on).
"""

import ctypes
import json
import os
import stat

from .files import rmtree
from .procs import scramble_next_pid
from .wire import read_frame, write_frame

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MS_BIND = 4096
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_MNT_DETACH = 2
_CLONE_NEWNS = 0x00020000


def enter_private_mount_namespace():
    """Move the calling process into a new mount namespace whose mounts propagate nowhere (``unshare(CLONE_NEWNS)``,
    then ``/`` made recursively private), so what it mounts is seen only by it and its children and vanishes with
    them. Needs CAP_SYS_ADMIN; raises OSError where refused."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0 or libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"private mount namespace: {os.strerror(err)}")


def _traversable(path):
    """The first folder on the way to ``path`` that users with no special rights cannot pass through, or None."""
    parts = os.path.realpath(path).split(os.sep)[1:]
    for i in range(len(parts)):
        folder = os.sep + os.path.join(*parts[:i]) if i else os.sep
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder, parts[i]
    return None


def mount_own_proc():
    """A ``/proc`` of this mount namespace's own, ``hidepid=invisible``: a test process (a dedicated uid) sees only
    its own processes there, not the host's (their pids, open files and threads, which a ``stat`` reads whatever
    Landlock says). Needs CAP_SYS_ADMIN; raises OSError where refused (a container that masks parts of /proc)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, b"hidepid=invisible") != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"a /proc of our own: {os.strerror(err)}")


def expose_to_others(paths):
    """Make ``paths`` (the interpreter's folders, the sandbox's code) reachable by the tests' dedicated uid, in this
    process's private mount namespace only: a folder on the way that others may not pass through (``/root``, mode
    0700) is covered by an empty tmpfs of mode 0755 holding bind mounts of just the entries on the way, so nothing
    else in it becomes visible. Needs CAP_SYS_ADMIN; raises OSError when a path stays out of reach."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(16):  # one blocking folder per pass, the outermost first
        blocked = {}
        for path in paths:
            hit = _traversable(path)
            if hit is not None:
                blocked.setdefault(hit[0], set()).add(hit[1])
        if not blocked:
            for path in paths:
                if not os.stat(path).st_mode & stat.S_IXOTH:
                    raise OSError(f"other users cannot enter {path}")
            return
        for folder, names in blocked.items():
            held = {name: os.open(os.path.join(folder, name), os.O_PATH | os.O_CLOEXEC) for name in names}
            try:
                if libc.mount(b"tmpfs", os.fsencode(folder), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755") != 0:
                    raise OSError(ctypes.get_errno(), f"cover {folder}: {os.strerror(ctypes.get_errno())}")
                for name, fd in held.items():
                    target = os.path.join(folder, name)
                    if stat.S_ISDIR(os.fstat(fd).st_mode):
                        os.mkdir(target)
                    else:
                        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
                    if libc.mount(f"/proc/self/fd/{fd}".encode(), os.fsencode(target), None, _MS_BIND | _MS_REC,
                                  None) != 0:
                        raise OSError(ctypes.get_errno(), f"bind {target}: {os.strerror(ctypes.get_errno())}")
            finally:
                for fd in held.values():
                    os.close(fd)
    raise OSError(f"cannot make {paths} reachable by the tests' uid")


class MountHelper:
    """The zygote's side: a forked helper serving ``mount``/``umount`` requests on a private pair of pipes. It dies
    with the zygote (parent-death signal, and the end of its request pipe). ``scramble_pid``: set the next pid to a
    random value after each mount (only in the slot's own pid namespace)."""

    def __init__(self, scramble_pid=True):
        req_r, req_w = os.pipe2(os.O_CLOEXEC)
        rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(req_w)
                os.close(rep_r)
                _serve(req_r, rep_w, scramble_pid)
            finally:
                os._exit(0)
        os.close(req_r)
        os.close(rep_w)
        self.pid, self.req, self.rep = pid, req_w, rep_r

    def _ask(self, request):
        write_frame(self.req, request)
        reply, _ = read_frame(self.rep)
        if reply.get("error"):
            raise OSError(reply["error"])

    def mount(self, path, size_bytes, inodes, uid, gid):
        """A fresh tmpfs on ``path``: ``size_bytes``, ``inodes`` inodes (its root included), owned by ``uid``/``gid``,
        mode 0700, no set-uid programs or devices; then, with ``scramble_pid``, the slot's next pid is made random
        (the program is forked next)."""
        self._ask({"op": "mount", "path": path, "size": int(size_bytes), "inodes": int(inodes),
                   "uid": uid, "gid": gid})

    def release(self, path, folder):
        """Detach the tmpfs on ``path`` and remove ``folder`` (which holds it), without waiting: the helper serves
        requests in order, so the next :meth:`mount`'s answer means this one is done."""
        write_frame(self.req, {"op": "release", "path": path, "folder": folder})


    def close(self):
        """End the helper once it has served every request sent (the end of its request pipe), and reap it."""
        os.close(self.req)
        os.waitpid(self.pid, 0)


def _serve(req, rep, scramble_pid):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: SIGKILL when the zygote dies
    os.closerange(3, min(req, rep))
    os.closerange(max(req, rep) + 1, 1 << 20)
    while True:
        try:
            request, _ = read_frame(req)
        except (EOFError, ValueError, OSError):
            return
        path = os.fsencode(request.get("path", ""))
        if request.get("op") == "mount":
            options = (f"size={request['size']},nr_inodes={request['inodes']},mode=0700,"
                       f"uid={request['uid']},gid={request['gid']}").encode()
            ok = libc.mount(b"tmpfs", path, b"tmpfs", _MS_NOSUID | _MS_NODEV, options) == 0
            if ok and scramble_pid and not scramble_next_pid():
                write_frame(rep, {"error": "the slot's next pid cannot be set (/proc/sys/kernel/ns_last_pid)"})
                continue
        elif request.get("op") == "release":
            libc.umount2(path, _MNT_DETACH)
            rmtree(request.get("folder", ""))
            continue  # no answer: the zygote does not wait for it
        else:
            write_frame(rep, {"error": f"unknown request {json.dumps(request)[:100]}"})
            continue
        write_frame(rep, {} if ok else {"error": f"{request['op']} {request.get('path')}: "
                                                  f"{os.strerror(ctypes.get_errno())}"})
