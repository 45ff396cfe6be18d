"""Descriptor and scratch-directory helpers of the zygote and its test processes."""

import os


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_head(fd, limit):
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


def read_tail(fd, limit):
    size = os.fstat(fd).st_size
    start = max(0, size - limit)
    return os.pread(fd, size - start, start)


def open_up(directory):
    """Make every real folder under ``directory`` (not ``directory`` itself) ``0700``, so that its owner (or root) can
    list and empty it even where a program made folders unreadable. Symbolic links are never followed: each folder is opened
    ``O_PATH | O_NOFOLLOW | O_DIRECTORY`` relative to its parent and changed through ``/proc/self/fd``, so a link a
    program left (or swaps in) cannot point the change at a folder outside. Best effort: errors are skipped."""
    def chmod_at(parent_fd, name):
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent_fd)
        except OSError:
            return None
        try:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
        except OSError:
            pass
        return fd

    try:
        top = os.open(directory, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    stack = [top]
    while stack:
        fd = stack.pop()
        try:
            listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                names = [e.name for e in os.scandir(listing) if e.is_dir(follow_symlinks=False)]
            finally:
                os.close(listing)
            for name in names:
                child = chmod_at(fd, name)
                if child is not None:
                    stack.append(child)
        except OSError:
            pass
        finally:
            os.close(fd)


def wipe(directory):
    """Remove everything inside ``directory`` (ours), even entries a program made unreadable (:func:`open_up`)."""
    import shutil

    open_up(directory)
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for name in entries:
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def rmtree(path):
    try:
        os.rmdir(path)  # the usual case: the program wrote nothing
    except OSError:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def tree_usage(top, max_entries):
    """``(bytes on disk, entries)`` under ``top`` (files, folders and links; not following links); the walk stops
    once it has counted more than ``max_entries``."""
    import stat

    used, entries = 0, 0
    stack = [top]
    while stack:
        try:
            listing = os.scandir(stack.pop())
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries > max_entries:
                    return used, entries
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return used, entries


def held_unlinked_bytes(pid, device):
    """Bytes of the regular files on filesystem ``device`` (the scratch folder's) that process ``pid`` holds open
    after they were unlinked: a walk cannot see them. In-memory files (memfds) are memory, not disk: they live on
    another device and count against the memory limits."""
    import stat

    used = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for name in names:
        path = f"/proc/{pid}/fd/{name}"
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink or st.st_dev != device:
                continue
        except OSError:
            continue
        used += st.st_blocks * 512
    return used


class ScratchMeter:
    """Whether one program is over its scratch folder's quotas, read by the zygote while the program runs and after.

    ``private_mounts`` (the ``bwrap`` level): the folder is a tmpfs of the program's own, sized to the quotas
    (:mod:`.mounts`), so the kernel refuses what goes over (``ENOSPC``, files unlinked while open included) and a
    full one is the verdict. Otherwise (the ``process`` level: scratch on a host filesystem others write to too) the
    folder is walked, and the files the test process holds open after unlinking them are added from
    ``/proc/<pid>/fd``.
    """

    def __init__(self, private_mounts):
        self.private_mounts = private_mounts

    def usage(self, folder, pid, max_entries):
        """``(bytes, entries)`` the program holds: in ``folder`` (and, for a live ``pid``, unlinked but open)."""
        used, entries = tree_usage(folder, max_entries)
        if pid:
            try:
                used += held_unlinked_bytes(pid, os.stat(folder).st_dev)
            except OSError:
                pass
        return used, entries

    def exceeded(self, folder, pid, limits):
        """Why the program is over its quota (``limits["disk_bytes"]``, ``limits["max_files"]``), or None."""
        mib = limits["disk_bytes"] / (1 << 20)
        if self.private_mounts:
            try:
                st = os.statvfs(folder)
            except OSError:
                return None
            if st.f_bavail == 0:
                return f"disk quota exceeded: the scratch folder's {mib:g} MiB are full"
            if st.f_favail == 0:
                return f"file quota exceeded: the scratch folder holds {limits['max_files']} files and folders"
            return None
        used, entries = self.usage(folder, pid, limits["max_files"])
        if used > limits["disk_bytes"]:
            return f"disk quota exceeded: {used / (1 << 20):.1f} MiB in the scratch folder (limit {mib:g} MiB)"
        if entries > limits["max_files"]:
            return f"file quota exceeded: more than {limits['max_files']} files and folders in the scratch folder"
        return None


def quota_error(error, limits):
    """``(status, error)`` for a test that failed with ``error``: a program can write only in its scratch folder, so
    a "No space left on device" there is its disk or file quota (the kernel's, at the ``bwrap`` level)."""
    if "[Errno 28]" in error or "No space left on device" in error:
        return "QUOTA", (f"disk or file quota exceeded ({limits['disk_bytes'] / (1 << 20):g} MiB, "
                         f"{limits['max_files']} files and folders): {error}")
    return None
