"""Grade candidate programs against tests, with LiveCodeBench's verdict semantics.

Programs run in sandboxed worker slots (:mod:`mars2.sandbox.pool`); the sandbox gets only the
program and the test inputs, and hands back raw stdout (stdin tests) or the typed return value
(functional tests). The comparison with the expected output (:mod:`mars2.sandbox.compare`) happens
here, in the grader's process, ignoring exit codes and requiring one result per test run. Tests run
in order; by default grading stops at the first failing test, as LiveCodeBench does.

Two parity modes (``parity=``):

``script`` (default)
    The program runs as a real script: ``__main__`` with real stdin (``sys.stdin.buffer``,
    ``for line in sys.stdin``, ``open(0)``, ``if __name__ == "__main__":`` anywhere, ``global``
    statements, threads and ``atexit`` writers all work). A program's tests run in one process
    forked from a warmed interpreter, each in a fresh module with fresh standard streams and scratch
    directory and the process state reset in between; after a crash, a timeout or a leftover thread
    or process the next test gets a fresh process. ``isolate_tests=True`` forks a process per test.
``lcb``
    Reproduces LiveCodeBench's current harness inside the sandbox, quirks included (the stdin
    program wrapped in a function, its mocked stdin, captured ``sys.stdout``, ``quit`` disabled,
    one process and one ``Solution()`` instance for all tests of a program), for scores comparable
    with published LCB numbers.

Both modes compare outputs exactly as LiveCodeBench does, treat any ``SystemExit`` in a stdin
program as a normal end, set LiveCodeBench's preamble and ``sys.set_int_max_str_digits(50000)``,
and differ from it deliberately only in: an empty test list is ``NO_TESTS`` (a failure, not a pass);
a functional return value with an overridden ``__eq__`` is compared by its base value (a set or an
arbitrary object is a wrong answer); time limits are on CPU time (wall clock capped at ``2 T + 1`` s);
memory is capped (``memory_mb``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from mars2.config import PARITIES
from mars2.data.schema import TestCase
from mars2.sandbox.compare import (
    MalformedValue,
    decode_value,
    show_value,
    stdout_matches,
    truncate,
    value_matches,
    value_too_large,
)
from mars2.sandbox.pool import Limits, SandboxError, SandboxPool, TestRun, shared_pool
from mars2.sandbox.verdict import AC, CE, MLE, NO_CODE, NO_TESTS, RE, TLE, WA, Verdict

ERROR_TAIL_LINES = 10
ERROR_TAIL_CHARS = 1000
MAX_PROGRAM_BYTES = 1 << 20


class TestDataError(ValueError):
    """A test that cannot be used (e.g. functional input or output that is not JSON).

    Raised rather than turned into a verdict: bad test data must not silently become a zero reward.
    """

    __test__ = False


@dataclass(frozen=True)
class GradeJob:
    """One program and its tests, for :func:`grade_many`."""

    code: str | None
    tests: tuple[TestCase, ...]
    func_name: str | None = None


@dataclass(frozen=True)
class TestVerdict:
    """The outcome of one test that was run: ``status`` as in :class:`Verdict` (``AC`` = passed)."""

    __test__ = False

    index: int
    status: str
    detail: str = ""
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.index, "status": self.status, "detail": self.detail, "cpu_s": round(self.cpu_s, 4),
                "wall_s": round(self.wall_s, 4)}


@dataclass(frozen=True)
class Graded:
    """A :class:`Verdict` and the per-test outcomes behind it (only the tests that ran)."""

    verdict: Verdict
    tests: tuple[TestVerdict, ...] = field(default=())


@dataclass(frozen=True)
class _Prepared:
    mode: str
    payload: bytes
    expected: Any


def _text_bytes(text: str, what: str, index: int) -> bytes:
    """``text`` as the bytes a program reads (UTF-8; a lone low surrogate U+DC80..U+DCFF stands for the byte it
    escapes, as Python decodes undecodable input). A lone high surrogate is not text: unusable test data."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise TestDataError(f"test {index}: its {what} holds a lone surrogate {text[e.start]!r} at character "
                            f"{e.start}, which is not text a program could read or print") from None


def _prepare(test: TestCase, func_name: str | None, index: int, parity: str) -> _Prepared:
    if not isinstance(test, TestCase) or not isinstance(test.input, str) or not isinstance(test.output, str):
        raise TestDataError(f"test {index}: not a TestCase with text input and output ({test!r:.80})")
    if test.testtype == "stdin":
        _text_bytes(test.output, "expected output", index)
        return _Prepared("stdin", _text_bytes(test.input, "input", index), test.output)
    if test.testtype != "functional":
        raise TestDataError(f"test {index}: unknown testtype {test.testtype!r}")
    if not func_name:
        raise TestDataError(f"test {index}: functional tests need a func_name")
    try:
        for line in test.input.split("\n"):
            if line.strip():
                json.loads(line)
        expected = json.loads(test.output)
    except (ValueError, RecursionError) as e:
        raise TestDataError(f"test {index}: functional input/output is not JSON ({e})") from None
    payload = test.input if parity == "lcb" else "\n".join(line for line in test.input.split("\n") if line.strip())
    return _Prepared("functional", _text_bytes(payload, "input", index), expected)


def validate_job(job: GradeJob, parity: str = "script") -> None:
    """Raise :class:`TestDataError` if ``job``'s tests cannot be used (nothing is run)."""
    if job.code is not None and not isinstance(job.code, str):
        raise TestDataError(f"the program is a {type(job.code).__name__}, not text")
    if job.func_name is not None and not isinstance(job.func_name, str):
        raise TestDataError(f"func_name is a {type(job.func_name).__name__}, not text")
    kinds = set()
    for i, test in enumerate(job.tests, start=1):
        kinds.add(_prepare(test, job.func_name, i, parity).mode)
    if len(kinds) > 1:
        raise TestDataError("a program's tests mix stdin and functional test types")


def _tail(text: str) -> str:
    lines = text.strip().splitlines()[-ERROR_TAIL_LINES:]
    joined = "\n".join(lines)
    return joined if len(joined) <= ERROR_TAIL_CHARS else "..." + joined[-ERROR_TAIL_CHARS:]


def _judge(run: TestRun, test: TestCase, prepared: _Prepared, limits: Limits) -> tuple[str, str]:
    """``(status, detail)`` of one test run; detail is ``""`` on AC."""
    shown_input = f"input: {truncate(test.input)!r}"
    shown_expected = f"expected: {truncate(test.output)!r}"
    if run.status == "ok":
        if prepared.mode == "stdin":
            got = run.output.decode("utf-8", errors="replace")
            ok, reason = stdout_matches(got, prepared.expected)
            if ok:
                return AC, ""
            return WA, f"wrong answer ({reason})\n{shown_input}\n{shown_expected}\ngot: {truncate(got)!r}"
        if value_too_large(run.output, test.output):
            return WA, (f"wrong answer (a return value of {len(run.output)} bytes as typed JSON, far larger than the "
                        f"expected one)\n{shown_input}\n{shown_expected}")
        try:
            value = decode_value(run.output)
        except MalformedValue as e:
            return WA, f"wrong answer (unreadable return value: {e})\n{shown_input}\n{shown_expected}"
        if value_matches(value, prepared.expected):
            return AC, ""
        return WA, f"wrong answer\n{shown_input}\n{shown_expected}\ngot: {show_value(value)!r}"
    if run.status == "TLE":
        return TLE, f"time limit exceeded ({run.error})\n{shown_input}"
    if run.status == "CE":
        return CE, f"compile error\n{_tail(run.error)}"
    if run.status == "MLE":
        return MLE, f"memory limit exceeded ({limits.memory_mb} MiB)\n{shown_input}\n{_tail(run.error)}"
    if run.status in ("OLE", "QUOTA"):
        return RE, f"runtime error: {run.error}\n{shown_input}"
    return RE, f"runtime error\n{shown_input}\n{_tail(run.error)}"


def _lcb_blank_line_error(tests: Sequence[TestCase]) -> str | None:
    for i, test in enumerate(tests, start=1):
        if test.testtype == "functional" and any(not line.strip() for line in test.input.split("\n")):
            return (f"test {i}/{len(tests)}: runtime error (LiveCodeBench parses every input line as JSON "
                    f"and fails on the blank line in this test's input)")
    return None


def grade_detailed(
    code: str | None,
    tests: Sequence[TestCase],
    *,
    func_name: str | None = None,
    time_limit_s: float = 6.0,
    memory_mb: int = 1024,
    stop_at_first_failure: bool = True,
    parity: str = "script",
    pool: SandboxPool | None = None,
    limits: Limits | None = None,
    isolate_tests: bool = False,
) -> Graded:
    """:func:`grade_program` plus the outcome of every test that ran."""
    start = time.monotonic()
    tests = tuple(tests)
    total = len(tests)
    if parity not in PARITIES:
        raise ValueError(f"parity={parity!r} is unknown; use one of {PARITIES}")
    if total == 0:
        return Graded(Verdict(NO_TESTS, 0, 0, time.monotonic() - start, "no tests to run"))
    if not has_program(code):
        return Graded(Verdict(NO_CODE, 0, total, time.monotonic() - start, "no program"))
    prepared = [_prepare(test, func_name, i, parity) for i, test in enumerate(tests, start=1)]
    modes = {p.mode for p in prepared}
    if len(modes) != 1:
        raise TestDataError("a program's tests mix stdin and functional test types")
    if parity == "lcb":
        blank = _lcb_blank_line_error(tests)
        if blank is not None:
            return Graded(Verdict(RE, 0, total, time.monotonic() - start, blank))
    if len(code.encode("utf-8", "surrogatepass")) > MAX_PROGRAM_BYTES:
        return Graded(Verdict(CE, 0, total, time.monotonic() - start,
                              f"compile error\nprogram larger than {MAX_PROGRAM_BYTES} bytes"))
    limits = limits or Limits(time_s=time_limit_s, memory_mb=memory_mb)
    pool = pool or shared_pool()

    passed = 0
    first_failure: list[tuple[str, str]] = []
    outcomes: list[TestVerdict] = []

    def on_result(index: int, run: TestRun) -> bool:
        nonlocal passed
        if index == 0:  # a retried program starts again from its first test
            passed = 0
            first_failure.clear()
            outcomes.clear()
        status, detail = _judge(run, tests[index], prepared[index], limits)
        outcomes.append(TestVerdict(index + 1, status, detail, run.cpu_s, run.wall_s))
        if status == AC:
            passed += 1
            return True
        if not first_failure:
            first_failure.append((status, f"test {index + 1}/{total}: {detail}"))
        return not (stop_at_first_failure or status == CE)

    slot = pool.acquire()
    try:
        slot.run(code=code, mode=prepared[0].mode, parity=parity, func_name=func_name, limits=limits,
                 inputs=[p.payload for p in prepared], on_result=on_result, isolate_tests=isolate_tests)
    except SandboxError as e:  # twice, on a fresh zygote: this program's verdict (the pool counts it and warns)
        return Graded(Verdict(RE, 0, total, time.monotonic() - start, f"sandbox failure: {e}"))
    finally:
        pool.release(slot)
    elapsed = time.monotonic() - start
    if not first_failure:
        return Graded(Verdict(AC, passed, total, elapsed, ""), tuple(outcomes))
    status, detail = first_failure[0]
    return Graded(Verdict(status, passed, total, elapsed, detail), tuple(outcomes))


def grade_program(
    code: str | None,
    tests: Sequence[TestCase],
    *,
    func_name: str | None = None,
    time_limit_s: float = 6.0,
    memory_mb: int = 1024,
    stop_at_first_failure: bool = True,
    executor: SandboxPool | None = None,
    parity: str = "script",
    isolation: str = "auto",
    isolate_tests: bool = False,
) -> Verdict:
    """Run ``code`` on every test (in order) and return its :class:`Verdict`.

    ``tests`` of type ``stdin`` feed ``input`` on stdin and compare stdout with ``output``
    (line-wise, Decimal-aware); ``functional`` tests call ``Solution().<func_name>`` (or the
    top-level function ``func_name``) with one JSON argument per input line and compare the
    return value with the JSON ``output``. ``time_limit_s`` (CPU seconds) and ``memory_mb`` are per test.

    An empty test list gives ``NO_TESTS`` (checked first), a missing or blank program ``NO_CODE``.
    A compile error stops grading at once whatever ``stop_at_first_failure`` says (every test
    would fail the same way). With ``stop_at_first_failure=False`` every test runs, ``passed``
    counts all passing tests, and ``status``/``detail`` describe the first failure.

    ``executor``: the :class:`~mars2.sandbox.pool.SandboxPool` to run in (default: the shared pool
    for ``isolation``). ``parity``: ``script`` or ``lcb`` (see the module docstring).
    ``isolate_tests=True`` runs every test in its own freshly forked process (script mode; slower)
    instead of one process per program with the state reset between tests.
    Raises :class:`TestDataError` for unusable tests (before running anything).
    """
    pool = executor or shared_pool(None, isolation)
    return grade_detailed(code, tests, func_name=func_name, time_limit_s=time_limit_s, memory_mb=memory_mb,
                          stop_at_first_failure=stop_at_first_failure, parity=parity, pool=pool,
                          isolate_tests=isolate_tests).verdict


def has_program(code: str | None) -> bool:
    """A response with no program (none extracted, or only whitespace) is NO_CODE without running anything."""
    return code is not None and bool(code.strip())


def grade_many_detailed(
    jobs: Sequence[GradeJob],
    *,
    workers: int | None = None,
    time_limit_s: float = 6.0,
    memory_mb: int = 1024,
    progress: Callable[[int, int], None] | None = None,
    executor: SandboxPool | None = None,
    stop_at_first_failure: bool = True,
    parity: str = "script",
    isolation: str = "auto",
    isolate_tests: bool = False,
    limits: Limits | None = None,
) -> list[Graded]:
    """:func:`grade_many` with the per-test outcomes. ``progress``: told ``(graded, total)`` after each program (the
    caller's display). ``limits``: every per-test limit at once (replaces ``time_limit_s`` and ``memory_mb``)."""
    jobs = list(jobs)
    if workers is not None and workers < 0:
        raise ValueError(f"workers must be >= 1 (or 0/None for one per core), got {workers}")
    if parity not in PARITIES:
        raise ValueError(f"parity={parity!r} is unknown; use one of {PARITIES}")
    limits = limits or Limits(time_s=time_limit_s, memory_mb=memory_mb)
    for i, job in enumerate(jobs):  # every job's tests are checked before anything runs
        try:
            validate_job(job, parity)
        except TestDataError as e:
            raise TestDataError(f"job {i}, {e}") from None
    pool = executor or shared_pool(workers or None, isolation)
    results: list[Graded | None] = [None] * len(jobs)
    graded = 0

    def finished(i: int, result: Graded) -> None:
        nonlocal graded
        results[i] = result
        graded += 1
        if progress is not None:
            progress(graded, len(jobs))

    def grade_job(job: GradeJob) -> Graded:
        return grade_detailed(job.code, job.tests, func_name=job.func_name, stop_at_first_failure=stop_at_first_failure,
                              parity=parity, pool=pool, limits=limits, isolate_tests=isolate_tests)

    programs = [i for i, job in enumerate(jobs) if has_program(job.code)]
    executor_threads = ThreadPoolExecutor(max_workers=min(pool.workers, max(1, len(programs))),
                                          thread_name_prefix="mars2-grade") if programs else None
    try:
        for i, job in enumerate(jobs):  # no program: NO_CODE (or NO_TESTS) at once, no thread or sandbox
            if not has_program(job.code):
                finished(i, grade_job(job))
        futures = {executor_threads.submit(grade_job, jobs[i]): i for i in programs}
        for future in as_completed(futures):
            finished(futures[future], future.result())
    except BaseException:
        if executor_threads is not None:
            executor_threads.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        if executor_threads is not None:
            executor_threads.shutdown(wait=True)
    return [r for r in results if r is not None]


def grade_many(jobs: Sequence[GradeJob], **options: Any) -> list[Verdict]:
    """Grade many programs concurrently; the verdicts come back in the order of ``jobs``. ``options`` are those of
    :func:`grade_many_detailed` (workers, time_limit_s, memory_mb, progress, executor, stop_at_first_failure, parity,
    isolation, isolate_tests, limits).

    ``workers`` sandbox slots (``None``/0: one per CPU core) each grade one job at a time (its
    tests sequentially). ``progress`` is told ``(graded, total)`` after each job. Every job's tests are validated first:
    a :class:`TestDataError` naming the job and the test is raised before anything runs. After that one verdict
    comes back per job whatever the programs do: a program that breaks its slot twice is ``RE`` ("sandbox
    failure"). ``executor``: a :class:`~mars2.sandbox.pool.SandboxPool` to use instead of the shared one.
    """
    return [g.verdict for g in grade_many_detailed(jobs, **options)]


def grade_programs(programs: Sequence[tuple[str | None, Sequence[TestCase], str | None]], grading, *,
                   stop_at_first_failure: bool | None = None,
                   progress: Callable[[int, int], None] | None = None) -> list[Verdict]:
    """``(code, tests, func_name)`` programs graded with the run's :class:`mars2.config.GradingConfig` (slots, limits,
    isolation, parity); HumanEval-style check tests are wrapped first (:func:`mars2.data.gradable`).
    ``stop_at_first_failure``: None = the config's (rewards); False = run every test (a public-test score)."""
    from mars2.data.checks import gradable

    stop = grading.stop_at_first_failure if stop_at_first_failure is None else stop_at_first_failure
    return grade_many([GradeJob(*gradable(code, tests, func)) for code, tests, func in programs],
                      workers=grading.workers or None, time_limit_s=grading.time_limit_s, memory_mb=grading.memory_mb,
                      progress=progress, isolation=grading.isolation, parity=grading.parity,
                      stop_at_first_failure=stop)
