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


def wipe(directory):
    """Remove everything inside ``directory`` (ours), even entries a program made unreadable."""
    import shutil

    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for name in entries:
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                for root, dirs, _ in os.walk(path):
                    for d in dirs:
                        try:
                            os.chmod(os.path.join(root, d), 0o700)
                        except OSError:
                            pass
                os.chmod(path, 0o700)
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


def held_unlinked_bytes(pid):
    """Bytes of the regular files process ``pid`` holds open after they were unlinked (a walk cannot see them), the
    runner's own in-memory files (``mars2-*`` memfds: stdin, stdout, stderr, records) excepted."""
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
            if not stat.S_ISREG(st.st_mode) or st.st_nlink or os.readlink(path).startswith("/memfd:mars2-"):
                continue
        except OSError:
            continue
        used += st.st_blocks * 512
    return used


class ScratchMeter:
    """How much one program holds in its scratch folder, read by the zygote while the program runs and after.

    ``private_fs``: the scratch root is a filesystem of this slot alone (bubblewrap's ``/tmp``), whose ``statvfs``
    counts every byte and inode a program holds there, files unlinked while open included, against the level
    taken when the program's folder was made (:meth:`begin`). Otherwise (the ``process`` level: scratch on a host
    filesystem others write to too) the program's folder is walked, and the files the test process holds open after
    unlinking them are added from ``/proc/<pid>/fd``.
    """

    def __init__(self, root, private_fs):
        self.root = root
        self.private_fs = private_fs
        self.base = (0, 0)

    def _fs(self):
        st = os.statvfs(self.root)
        return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree

    def begin(self):
        if self.private_fs:
            self.base = self._fs()

    def usage(self, folder, pid, max_entries):
        """``(bytes, entries)`` the program holds: in ``folder`` (and, for a live ``pid``, unlinked but open)."""
        if self.private_fs:
            used, entries = self._fs()
            return max(0, used - self.base[0]), max(0, entries - self.base[1])
        used, entries = tree_usage(folder, max_entries)
        return used + (held_unlinked_bytes(pid) if pid else 0), entries

    def exceeded(self, folder, pid, limits):
        """Why the program is over its quota (``limits["disk_bytes"]``, ``limits["max_files"]``), or None."""
        used, entries = self.usage(folder, pid, limits["max_files"])
        if used > limits["disk_bytes"]:
            return (f"disk quota exceeded: {used / (1 << 20):.1f} MiB in the scratch folder "
                    f"(limit {limits['disk_bytes'] / (1 << 20):g} MiB)")
        if entries > limits["max_files"]:
            return f"file quota exceeded: more than {limits['max_files']} files and folders in the scratch folder"
        return None
