"""Landlock through raw system calls: a ruleset (read-only paths, one read-write folder, no TCP, scoped signals)
that each test process builds for its own scratch folder and applies at the ``process`` isolation level."""

import os
import struct

from .libc import libc as _libc

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
