"""``parity=lcb``: LiveCodeBench's own ``run_test`` loop in the test process, one frame per test (descriptor 3
in, 4 out), and the ``mock_open()``s the zygote makes ahead for its stdin tests.

LiveCodeBench's harness code is :mod:`mars2.sandbox.lcb_reference`, imported as ``lcb_reference`` from the
directory the sandbox mounts (the zygote puts it on ``sys.path``) the first time an ``lcb`` program comes.
"""

import json
import os
import signal
import sys

from .confine import signal_ready
from .errors import exception_only
from .values import encode_value_bytes
from .wire import read_frame, write_frame

PREMADE_OPEN_MOCKS = 16  # parity=lcb: tests per program served by mock_open()s made in the zygote


def premade_open_mock(mock, read_data):
    """``mock``, a ``unittest.mock.mock_open()`` made ahead of time and never used, turned into what
    ``mock_open(read_data=read_data)`` returns: its ``reset_data`` closure (the side effect each ``open()``
    call runs) gets the data in its ``read_data`` cell, and running it once puts the handle's stream and
    readline generator where a fresh mock has them. Raises (``ValueError``, ...) when this Python's
    ``mock_open`` is built differently."""
    reset = mock.side_effect
    cell = reset.__closure__[reset.__code__.co_freevars.index("read_data")]
    cell.cell_contents = read_data
    reset()
    return mock


def load_harness():
    """LiveCodeBench's harness for a zygote's first ``parity=lcb`` program: ``(lcb_reference, premade mock_open()s)``.

    Imports ``lcb_reference`` and ``unittest.mock``; numpy, which LiveCodeBench's process has imported before its
    reliability_guard (testing_util imports it) and which cannot be imported after the guard; and makes
    ``PREMADE_OPEN_MOCKS`` ``mock_open()``s.
    """
    import lcb_reference  # LiveCodeBench's code (mounted next to this package)
    from unittest.mock import mock_open

    try:
        import numpy  # noqa: F401
    except Exception:
        pass
    # LiveCodeBench makes a mock_open() per stdin test (~1.4 ms, more than half a trivial test's
    # cost): make them here once; each test process uses its own copies, fresh, one per test
    return lcb_reference, [mock_open() for _ in range(PREMADE_OPEN_MOCKS)]


def lcb_child(program, lcb, open_mocks):
    """LiveCodeBench's ``run_test`` loop, serving one test per frame (fd 3 in, fd 4 out)."""
    import io

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)),
                                                 encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "wb", closefd=False)),
                                                   encoding="utf-8")
    ctl_in, ctl_out = 3, 4
    limits = program["limits"]
    timeout = max(1, int(limits["time_s"] + 0.999999))
    signal.signal(signal.SIGALRM, lcb.timeout_handler)
    lcb.reliability_guard()
    mode = program["mode"]
    code = program["source"]
    method = None
    setup_error = None
    signal_ready()
    try:
        if mode == "functional":
            compiled = lcb.compile_code(lcb.import_string + "\n\n" + code, timeout)
            method = lcb.get_function(compiled, program["func_name"])
        else:
            code = lcb.make_function(lcb.clean_if_name(code))
            compiled = lcb.compile_code(code, timeout)
            method = lcb.get_function(compiled, "wrapped_function")
        if method is None:
            setup_error = "the program does not define the function LiveCodeBench calls"
    except SyntaxError as exc:
        setup_error = ("CE", exception_only(exc))
    except MemoryError as exc:
        setup_error = ("MLE", repr(exc))
    except Exception as exc:  # as LiveCodeBench: an error while compiling fails every test (-4)
        setup_error = ("TLE" if "timeoutexception" in repr(exc).lower() else "RE", repr(exc))
    if isinstance(setup_error, str):
        setup_error = ("RE", setup_error)
    while True:
        try:
            header, payload = read_frame(ctl_in)
        except EOFError:
            os._exit(0)
        if setup_error is not None:
            write_frame(ctl_out, {"status": setup_error[0], "error": setup_error[1]})
            continue
        text = payload.decode("utf-8")
        if mode == "functional":
            result, out = lcb_call(lcb, method, text, timeout)
        else:
            result, out = lcb_stdio(lcb, method, text, timeout, open_mocks)
        write_frame(ctl_out, result, out)


def lcb_call(lcb, method, text, timeout):
    try:
        args = [json.loads(line) for line in text.split("\n")]
    except ValueError as exc:
        return {"status": "RE", "error": f"Error during testing: {exc}"}, b""
    signal.alarm(timeout)
    try:
        prediction = method(*args)
        signal.alarm(0)
        if isinstance(prediction, tuple):
            prediction = list(prediction)
        return {"status": "ok"}, encode_value_bytes(prediction)
    except MemoryError as exc:
        signal.alarm(0)
        return {"status": "MLE", "error": repr(exc)}, b""
    except Exception as exc:
        signal.alarm(0)
        if "timeoutexception" in repr(exc).lower():
            return {"status": "TLE", "error": repr(exc)}, b""
        return {"status": "RE", "error": repr(exc)}, b""
    finally:
        signal.alarm(0)


def lcb_stdio(lcb, method, text, timeout, open_mocks):
    open_mock = None
    if open_mocks:
        try:
            open_mock = premade_open_mock(open_mocks.pop(), text)
        except Exception:  # (a MemoryError, the program broke io, another mock_open): call_method makes a
            pass  # fresh one and fails there, if it must, inside the test as LiveCodeBench does
    signal.alarm(timeout)
    error = None
    with lcb.Capturing() as captured:
        try:
            lcb.call_method(method, text, open_mock)
            signal.alarm(0)
        except MemoryError as exc:
            signal.alarm(0)
            error = ("MLE", repr(exc))
        except Exception as exc:
            signal.alarm(0)
            error = ("TLE" if "timeoutexception" in repr(exc).lower() else "RE", repr(exc))
        finally:
            signal.alarm(0)
    if error is not None:
        return {"status": error[0], "error": error[1]}, b""
    return {"status": "ok"}, captured[0].encode("utf-8", "surrogatepass")
