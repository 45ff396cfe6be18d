"""The C library through ctypes (no third-party package): seccomp, Landlock and ``prctl`` calls."""

_LIBC = []


def libc():
    """The C library through ctypes (the interpreter's own symbols; loaded once, before any fork)."""
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]
