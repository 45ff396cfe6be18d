"""The seccomp policy of a test process: a classic BPF program, assembled here, loaded through ``prctl``.

Denied (EPERM): ptrace, process_vm_*, kcmp, pidfd_getfd, bpf, perf_event_open, userfaultfd, keys, inotify watches,
``sysinfo`` (host-wide memory, load and process counts), ``statfs``/``fstatfs`` (a filesystem's free space),
mount and
namespace calls (the new mount API included), io_uring, SysV/mq IPC, kernel-admin calls, setting the host name,
the domain name or any clock; ``mknod``/``mknodat`` of a character or block device; ``fallocate`` with any mode
flag (EOPNOTSUPP: ``FALLOC_FL_KEEP_SIZE`` allocates past the file-size limit); ``prlimit64``,
``sched_set{param,scheduler,attr}`` aimed at any process but the caller (pid 0), ``sched_setaffinity`` (the caller
included: it keeps the cores it was given), ``setpriority`` and
``ioprio_set`` other than for the caller itself, ``migrate_pages``/``move_pages``/``process_madvise``.
``socket`` of any family (EACCES): only ``socketpair`` makes sockets, so no host service listening on a path, an
abstract name or a port is reachable. ``clone`` with a CLONE_NEW* flag or CLONE_PARENT; ``clone3`` (ENOSYS, so glibc falls back to
``clone``, whose flags a filter can inspect) and a ``clone`` that is neither a thread nor a child signalling SIGCHLD;
``prctl(PR_SET_CHILD_SUBREAPER, 0)`` (a test process stays its
orphans' reaper); another architecture's calls kill the process. Options add no
process creation, no ``kill(pid <= 0)``, no signal to one protected pid, and no metadata change (chmod, chown,
utime, xattrs) for tests that run as the grader's own uid.
"""

import errno
import os
import struct

from .libc import libc as _libc

_ARCHES = {
    # machine: (AUDIT_ARCH, {name: nr})
    "x86_64": (0xC000003E, {
        "socket": 41, "clone": 56, "fork": 57, "vfork": 58, "kill": 62, "ptrace": 101, "syslog": 103, "sysinfo": 99,
        "uselib": 134, "ustat": 136, "statfs": 137, "fstatfs": 138, "sysfs": 139, "vhangup": 153,
        "modify_ldt": 154, "pivot_root": 155,
        "_sysctl": 156, "chroot": 161, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167,
        "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176,
        "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212, "mq_open": 240, "kexec_load": 246,
        "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
        "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
        "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "clone3": 435, "pidfd_getfd": 438, "shmget": 29, "semget": 64, "msgget": 68,
        "tkill": 200, "tgkill": 234, "pidfd_open": 434,
        "shmat": 30, "shmctl": 31, "shmdt": 67, "semop": 65, "semctl": 66, "msgsnd": 69, "msgrcv": 70,
        "msgctl": 71, "semtimedop": 220, "mq_unlink": 241,
        "mknod": 133, "mknodat": 259, "sethostname": 170, "setdomainname": 171, "settimeofday": 164,
        "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "prlimit64": 302, "setpriority": 141,
        "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203, "sched_setattr": 314,
        "ioprio_set": 251, "migrate_pages": 256, "move_pages": 279, "process_madvise": 440,
        "process_mrelease": 448, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94,
        "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
        "setxattrat": 463, "removexattrat": 466,
        "ioctl": 16, "fcntl": 72, "umask": 95, "mkdir": 83, "mkdirat": 258, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "fallocate": 285, "prctl": 157, "inotify_add_watch": 254,
    }),
    "aarch64": (0xC00000B7, {
        "socket": 198, "clone": 220, "kill": 129, "ptrace": 117, "syslog": 116, "sysinfo": 179, "vhangup": 58, "pivot_root": 41,
        "statfs": 43, "fstatfs": 44,
        "chroot": 51, "acct": 89, "mount": 40, "umount2": 39, "swapon": 224, "swapoff": 225, "reboot": 142,
        "init_module": 105, "delete_module": 106, "quotactl": 60, "nfsservctl": 42, "lookup_dcookie": 18,
        "mq_open": 180, "kexec_load": 104, "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97,
        "perf_event_open": 241, "fanotify_init": 262, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273,
        "kexec_file_load": 294, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "clone3": 435, "pidfd_getfd": 438, "shmget": 194, "semget": 190, "msgget": 186,
        "tkill": 130, "tgkill": 131, "pidfd_open": 434,
        "shmat": 196, "shmctl": 195, "shmdt": 197, "semop": 193, "semctl": 191, "msgsnd": 189, "msgrcv": 188,
        "msgctl": 187, "semtimedop": 192, "mq_unlink": 181,
        "mknodat": 33, "sethostname": 161, "setdomainname": 162, "settimeofday": 170, "clock_settime": 112,
        "clock_adjtime": 266, "adjtimex": 171, "prlimit64": 261, "setpriority": 140, "sched_setparam": 118,
        "sched_setscheduler": 119, "sched_setaffinity": 122, "sched_setattr": 274, "ioprio_set": 30,
        "migrate_pages": 238, "move_pages": 239, "process_madvise": 440, "process_mrelease": 448,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442,
        "fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "fchown": 55, "fchownat": 54, "utimensat": 88,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16,
        "setxattrat": 463, "removexattrat": 466,
        "ioctl": 29, "fcntl": 25, "umask": 166, "mkdirat": 34, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
        "fallocate": 47, "prctl": 167, "inotify_add_watch": 27,
    }),
}
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root", "chroot", "swapon",
    "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "unshare", "setns", "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at",
    "name_to_handle_at", "acct", "quotactl", "syslog", "shmget", "semget", "msgget", "mq_open", "fanotify_init",
    "lookup_dcookie", "vhangup", "iopl", "ioperm", "modify_ldt", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl",
    "shmat", "shmctl", "shmdt", "semop", "semctl", "msgsnd", "msgrcv", "msgctl", "semtimedop", "mq_unlink",
    "sethostname", "setdomainname", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "migrate_pages", "move_pages", "process_madvise", "process_mrelease",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "inotify_add_watch",  # at the process level Landlock does not cover it: a watch on the host's /tmp saw its files
    "sched_setaffinity",  # even for itself: a test keeps the slot's cores, off the judges' (pool.py: split_cores)
    "sysinfo",  # the host's free memory moved with the judge's parsing of a wrong answer (and its load, processes)
    "statfs", "fstatfs",  # the host disk's free space moved with the outputs spooled while a wrong answer was judged
)
METADATA = ("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime", "utimes",
            "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
            "fremovexattr", "setxattrat", "removexattrat")
# with no_metadata: ioctls that change an inode's flags or version, and file leases (an fcntl), need only ownership
INODE_IOCTLS = (0x40086602, 0x40046602, 0x401C5820, 0x40087602, 0x40047602)  # FS_IOC{,32}_SET{FLAGS,VERSION}, FSSETXATTR
F_SETLEASE = 1024
OWNER_RWX = 0o700
SELF_ONLY = ("prlimit64", "sched_setparam", "sched_setscheduler", "sched_setattr")  # arg0 pid == 0
S_IFMT, S_IFCHR, S_IFBLK = 0o170000, 0o020000, 0o060000
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
CLONE_THREAD = 0x00010000
SIGCHLD = 17
PR_SET_CHILD_SUBREAPER = 36
CLONE_PARENT = 0x00008000  # a child of the zygote, not of the test: it would escape the test's reaping and CPU
CLONE_NEW_ANY = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x04000000 | 0x08000000 | 0x02000000 | 0x80
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000


def seccomp_program(no_process_creation=False, no_kill_all=False, protect_pids=(), no_metadata=False):
    """The BPF program (bytes of ``struct sock_filter``) of our seccomp policy, or None on an unknown arch.

    ``no_process_creation``: fork/vfork/clone without CLONE_THREAD fail (EAGAIN). ``no_kill_all``:
    ``kill(pid <= 0, ...)`` fails. ``protect_pids``: no signal can be sent to these pids (the zygote and its mount
    helper, when tests share their uid), ``pidfd_open`` fails, and ``rt_sigqueueinfo``/``rt_tgsigqueueinfo`` are checked as
    ``kill``/``tgkill``. ``no_metadata``: for tests that run as the grader's own uid, which owns files outside the
    sandbox whose metadata Landlock does not cover: chmod, chown, utime and xattr changes, inode flag ioctls and
    file leases fail (EPERM), and so do a ``umask`` or a ``mkdir`` that would leave a folder its owner (the grader's
    uid, which must count and remove everything a program makes) cannot list.
    """
    machine = os.uname().machine
    if machine not in _ARCHES:
        return None
    arch, nrs = _ARCHES[machine]
    # a tiny assembler: ("ld", off) | ("and", k) | ("jeq"/"jne"/"jge"/"jset", k, label) | ("ret", k) | ("label", n);
    # ld offsets are into struct seccomp_data: nr 0, arch 4, args from 16 (8 bytes each, the low word first)
    prog = [("ld", 4), ("jne", arch, "kill"), ("ld", 0)]
    if machine == "x86_64":
        prog.append(("jge", 0x40000000, "eperm"))  # the x32 ABI
    for name in DENIED + (METADATA if no_metadata else ()):
        if name in nrs:
            prog.append(("jeq", nrs[name], "eperm"))
    prog.append(("jeq", nrs["clone3"], "enosys"))  # glibc falls back to clone(), whose flags we can inspect
    prog.append(("jeq", nrs["socket"], "eacces"))
    prog.append(("jeq", nrs["clone"], "clone"))
    for name in SELF_ONLY:
        prog.append(("jeq", nrs[name], "arg0_zero"))
    prog.append(("jeq", nrs["setpriority"], "setpriority"))
    prog.append(("jeq", nrs["ioprio_set"], "ioprio_set"))
    if "mknod" in nrs:
        prog.append(("jeq", nrs["mknod"], "mknod"))
    prog.append(("jeq", nrs["mknodat"], "mknodat"))
    prog.append(("jeq", nrs["fallocate"], "fallocate"))
    prog.append(("jeq", nrs["prctl"], "prctl"))
    for name in ("fork", "vfork"):
        if name in nrs and no_process_creation:
            prog.append(("jeq", nrs[name], "eagain"))
    if no_kill_all or protect_pids:
        prog.append(("jeq", nrs["kill"], "kill_check"))
        prog.append(("jeq", nrs["rt_sigqueueinfo"], "kill_check"))
    if protect_pids:
        prog.append(("jeq", nrs["tkill"], "tkill_check"))
        prog.append(("jeq", nrs["tgkill"], "tkill_check"))
        prog.append(("jeq", nrs["rt_tgsigqueueinfo"], "tkill_check"))
        prog.append(("jeq", nrs["pidfd_open"], "eperm"))
    if no_metadata:
        prog.append(("jeq", nrs["ioctl"], "ioctl_check"))
        prog.append(("jeq", nrs["fcntl"], "fcntl_check"))
        prog.append(("jeq", nrs["umask"], "umask_check"))
        if "mkdir" in nrs:
            prog.append(("jeq", nrs["mkdir"], "mkdir_check"))
        prog.append(("jeq", nrs["mkdirat"], "mkdirat_check"))
    prog += [("ret", _RET_ALLOW),
             ("label", "arg0_zero"), ("ld", 16), ("jeq", 0, "allow"), ("ret", _RET_ERRNO | errno.EPERM),
             ("label", "setpriority"), ("ld", 16), ("jne", PRIO_PROCESS, "eperm"), ("ld", 24), ("jeq", 0, "allow"),
             ("ret", _RET_ERRNO | errno.EPERM),
             ("label", "ioprio_set"), ("ld", 16), ("jne", IOPRIO_WHO_PROCESS, "eperm"), ("ld", 24),
             ("jeq", 0, "allow"), ("ret", _RET_ERRNO | errno.EPERM)]
    for name, mode_offset in (("mknod", 24), ("mknodat", 32)):  # the mode is arg 1 of mknod, arg 2 of mknodat
        if name in nrs:
            prog += [("label", name), ("ld", mode_offset), ("and", S_IFMT), ("jeq", S_IFCHR, "eperm"),
                     ("jeq", S_IFBLK, "eperm"), ("ret", _RET_ALLOW)]
    # fallocate's plain mode (0) only: the file-size limit bounds it; KEEP_SIZE would allocate past it unchecked
    prog += [("label", "fallocate"), ("ld", 24), ("jeq", 0, "allow"), ("ret", _RET_ERRNO | errno.EOPNOTSUPP)]
    # prctl(PR_SET_CHILD_SUBREAPER, 0): a test process may not give up being its orphans' reaper (they would go to
    # the zygote, outside the test's accounting); setting it stays allowed
    prog += [("label", "prctl"), ("ld", 16), ("jne", PR_SET_CHILD_SUBREAPER, "allow"), ("ld", 24),
             ("jeq", 0, "eperm"), ("ret", _RET_ALLOW)]
    prog += [("label", "clone"), ("ld", 16), ("jset", CLONE_NEW_ANY | CLONE_PARENT, "eperm")]
    if no_process_creation:
        prog += [("jset", CLONE_THREAD, "allow"), ("ret", _RET_ERRNO | errno.EAGAIN)]
    else:
        # a thread, or a child that signals SIGCHLD when it ends: one with another exit signal (0) is invisible to
        # waitpid without __WALL, so the test would not see it and its CPU would escape the test's accounting
        prog += [("jset", CLONE_THREAD, "allow"), ("and", 0xFF), ("jeq", SIGCHLD, "allow"),
                 ("ret", _RET_ERRNO | errno.EPERM)]
    if no_kill_all or protect_pids:
        # kill(pid, sig) with pid <= 0 (process groups, -1): the low word is 0 or has its sign bit set
        prog += [("label", "kill_check"), ("ld", 16)]
        prog += [("jeq", pid, "eperm") for pid in protect_pids]
        prog += [("jeq", 0, "eperm"), ("jset", 0x80000000, "eperm"), ("ret", _RET_ALLOW)]
    if protect_pids:
        prog += ([("label", "tkill_check"), ("ld", 16)] + [("jeq", pid, "eperm") for pid in protect_pids]
                 + [("ret", _RET_ALLOW)])
    if no_metadata:
        prog += [("label", "ioctl_check"), ("ld", 24)]  # the request is arg 1
        prog += [("jeq", request, "eperm") for request in INODE_IOCTLS] + [("ret", _RET_ALLOW)]
        prog += [("label", "fcntl_check"), ("ld", 24), ("jeq", F_SETLEASE, "eperm"), ("ret", _RET_ALLOW),
                 ("label", "umask_check"), ("ld", 16), ("jset", OWNER_RWX, "eperm"), ("ret", _RET_ALLOW)]
        for name, mode_offset in (("mkdir", 24), ("mkdirat", 32)):
            if name in nrs:  # (mode & 0700) must be 0700
                prog += [("label", f"{name}_check"), ("ld", mode_offset), ("and", OWNER_RWX),
                         ("jeq", OWNER_RWX, "allow"), ("ret", _RET_ERRNO | errno.EPERM)]
    prog += [("label", "allow"), ("ret", _RET_ALLOW),
             ("label", "eperm"), ("ret", _RET_ERRNO | errno.EPERM),
             ("label", "eagain"), ("ret", _RET_ERRNO | errno.EAGAIN),
             ("label", "eacces"), ("ret", _RET_ERRNO | errno.EACCES),
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
        elif op == "and":
            out.append((0x54, 0, 0, ins[1]))  # BPF_ALU | BPF_AND | BPF_K
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
