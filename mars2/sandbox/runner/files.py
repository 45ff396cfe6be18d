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
