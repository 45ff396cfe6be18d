"""The judgment of one test run (AC, WA, TLE, ...), made in a judge process apart from the grader.

Why a process of its own: comparing an output with the expected one takes time that depends on whether they match
(a wrong line of 200,000 numbers parses every token as a ``Decimal``, ~300 ms; a right one is one string compare).
Made in the grader's process, that work held the interpreter lock the thread feeding the program its next test
needed, so a program could read from its own timing whether its answer was right (an adversarial review: 11 of
12 copies of a learner passed a hidden test they never solved). In a judge process, niced to the lowest priority,
the judging competes with nothing the program can observe but idle CPU (docs/sandbox.md, "Verdicts cannot leak").

Standard library only: the judge process (``_judge.py``) imports this module, :mod:`.matching` and :mod:`.verdict`
from this folder without the ``mars2`` package; the grader imports it as ``mars2.sandbox.judging``.
"""

from __future__ import annotations

import json
from typing import Any

if __package__:
    from .matching import (MalformedValue, decode_value, show_value, stdout_matches, truncate, value_matches,
                          value_too_large)
    from .verdict import AC, CE, MLE, RE, TLE, WA
else:  # the judge process: this folder is on sys.path
    from matching import (MalformedValue, decode_value, show_value, stdout_matches, truncate, value_matches,
                         value_too_large)
    from verdict import AC, CE, MLE, RE, TLE, WA

ERROR_TAIL_LINES = 10
ERROR_TAIL_CHARS = 1000


def tail(text: str) -> str:
    """The last lines of an error text (a traceback), at most ``ERROR_TAIL_CHARS``."""
    lines = text.strip().splitlines()[-ERROR_TAIL_LINES:]
    joined = "\n".join(lines)
    return joined if len(joined) <= ERROR_TAIL_CHARS else "..." + joined[-ERROR_TAIL_CHARS:]


def load_tests(tests: list[dict[str, str]]) -> list[dict[str, Any]]:
    """A program's tests (``{"input", "output", "mode"}``: ``stdin`` or ``functional``) with what each output is
    compared with: the expected text, or the expected JSON value."""
    return [{**t, "expected": t["output"] if t["mode"] == "stdin" else json.loads(t["output"])} for t in tests]


def judge_run(test: dict[str, Any], status: str, output: bytes, error: str, memory_mb: int) -> tuple[str, str]:
    """``(verdict status, detail)`` of one run of ``test`` (from :func:`load_tests`) that ended with the sandbox's
    ``status`` (``ok``, ``TLE``, ``CE``, ``MLE``, ``OLE``, ``QUOTA``, ``RE``, ``SIGNAL``), ``output`` and ``error``;
    detail is ``""`` on AC."""
    shown_input = f"input: {truncate(test['input'])!r}"
    shown_expected = f"expected: {truncate(test['output'])!r}"
    if status == "ok":
        if test["mode"] == "stdin":
            got = output.decode("utf-8", errors="replace")
            ok, reason = stdout_matches(got, test["expected"])
            if ok:
                return AC, ""
            return WA, f"wrong answer ({reason})\n{shown_input}\n{shown_expected}\ngot: {truncate(got)!r}"
        if value_too_large(output, test["output"]):
            return WA, (f"wrong answer (a return value of {len(output)} bytes as typed JSON, far larger than the "
                        f"expected one)\n{shown_input}\n{shown_expected}")
        try:
            value = decode_value(output)
        except MalformedValue as e:
            return WA, f"wrong answer (unreadable return value: {e})\n{shown_input}\n{shown_expected}"
        if value_matches(value, test["expected"]):
            return AC, ""
        return WA, f"wrong answer\n{shown_input}\n{shown_expected}\ngot: {show_value(value)!r}"
    if status == "TLE":
        return TLE, f"time limit exceeded ({error})\n{shown_input}"
    if status == "CE":
        return CE, f"compile error\n{tail(error)}"
    if status == "MLE":
        return MLE, f"memory limit exceeded ({memory_mb} MiB)\n{shown_input}\n{tail(error)}"
    if status in ("OLE", "QUOTA"):
        return RE, f"runtime error: {error}\n{shown_input}"
    return RE, f"runtime error\n{shown_input}\n{tail(error)}"
