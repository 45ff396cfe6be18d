"""Grade candidate programs against tests, with LiveCodeBench's verdict semantics.

Programs run in sandboxed worker slots (:mod:`mars2.sandbox.pool`); the sandbox gets only the
program and the test inputs, and hands back raw stdout (stdin tests) or the typed return value
(functional tests). The comparison with the expected output (:mod:`mars2.sandbox.compare`) happens in a judge
process of the grader's (:mod:`mars2.sandbox.judging`: not in this process, whose threads feed programs their tests),
ignoring exit codes and requiring one result per test run. Tests run
in order; by default grading stops at the first test the program *visibly* failed (a crash, a timeout, a memory,
output or disk limit), never at a wrong answer: whether the next test comes, and when, must not tell a program that
its output was wrong (it could carry that to the next sample of the problem). The verdict is the first failure's,
as LiveCodeBench's.

Two parity modes (``GradingConfig.parity``):

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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from mars2.config import PARITIES, GradingConfig
from mars2.data.schema import TestCase
from mars2.sandbox.pool import Limits, SandboxError, SandboxPool, TestRun, shared_pool
from mars2.sandbox.verdict import AC, CE, NO_CODE, NO_TESTS, RE, TestVerdict, Verdict

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


def _lcb_blank_line_error(tests: Sequence[TestCase]) -> str | None:
    for i, test in enumerate(tests, start=1):
        if test.testtype == "functional" and any(not line.strip() for line in test.input.split("\n")):
            return (f"test {i}/{len(tests)}: runtime error (LiveCodeBench parses every input line as JSON "
                    f"and fails on the blank line in this test's input)")
    return None


def grade_program(code: str | None, tests: Sequence[TestCase], *, func_name: str | None = None,
                  grading: GradingConfig | None = None, pool: SandboxPool | None = None, isolate_tests: bool = False,
                  limits: Limits | None = None) -> Verdict:
    """Run ``code`` on every test (in order) and return its :class:`Verdict`, with the outcome of each test that ran.

    ``tests`` of type ``stdin`` feed ``input`` on stdin and compare stdout with ``output`` (line-wise, Decimal-aware);
    ``functional`` tests call ``Solution().<func_name>`` (or the top-level function ``func_name``) with one JSON
    argument per input line and compare the return value with the JSON ``output``.

    ``grading`` (default: :class:`~mars2.config.GradingConfig`'s defaults) gives the per-test limits
    (``time_limit_s`` CPU seconds, ``memory_mb``), ``parity`` (``script`` or ``lcb``, see the module docstring),
    ``isolation`` (of the shared pool used when ``pool`` is None) and ``stop_at_visible_failure``. An empty test
    list gives ``NO_TESTS`` (checked first), a missing or blank program ``NO_CODE``. A compile error stops
    grading at once whatever ``stop_at_visible_failure`` says (every test would fail the same way). A wrong answer
    never stops it, and each test is sent before the previous one's output is judged: which tests a program runs,
    and when, depends only on what it did itself, never on the expected outputs. ``passed`` counts the passing
    tests among those that ran; ``status``/``detail`` describe the first failure.

    ``limits``: every per-test limit at once (replaces ``time_limit_s`` and ``memory_mb``).
    ``isolate_tests=True`` runs every test in its own freshly forked process (script mode; slower) instead of one
    process per program with the state reset between tests. Raises :class:`TestDataError` for unusable tests
    (before running anything).
    """
    grading = grading or GradingConfig()
    start = time.monotonic()
    tests = tuple(tests)
    total = len(tests)
    if grading.parity not in PARITIES:
        raise ValueError(f"parity={grading.parity!r} is unknown; use one of {PARITIES}")
    if total == 0:
        return Verdict(NO_TESTS, 0, 0, time.monotonic() - start, "no tests to run")
    if not has_program(code):
        return Verdict(NO_CODE, 0, total, time.monotonic() - start, "no program")
    parity = grading.parity
    prepared = [_prepare(test, func_name, i, parity) for i, test in enumerate(tests, start=1)]
    if len({p.mode for p in prepared}) != 1:
        raise TestDataError("a program's tests mix stdin and functional test types")
    if parity == "lcb" and (blank := _lcb_blank_line_error(tests)) is not None:
        return Verdict(RE, 0, total, time.monotonic() - start, blank)
    if len(code.encode("utf-8", "surrogatepass")) > MAX_PROGRAM_BYTES:
        return Verdict(CE, 0, total, time.monotonic() - start,
                       f"compile error\nprogram larger than {MAX_PROGRAM_BYTES} bytes")
    limits = limits or Limits(time_s=grading.time_limit_s, memory_mb=grading.memory_mb)
    pool = pool or shared_pool(None, grading.isolation)
    outcomes: list[TestVerdict] = []
    judge = pool.acquire_judge()  # the comparisons run in a judge process, not in this one (mars2.sandbox.judging)

    def on_result(index: int, run: TestRun) -> None:
        if index == 0:  # a retried program starts again from its first test
            outcomes.clear()
        try:
            status, detail = judge.judge(index, run)
        except RuntimeError as e:  # the judge failed (twice, or could not compare): this program's verdict alone,
            pool.count_failure()   # never an error raised where the slot already serves the next program
            status, detail = RE, f"sandbox failure: {e}"
        outcomes.append(TestVerdict(index + 1, status, detail, run.cpu_s, run.wall_s))

    def stop_after(run: TestRun) -> bool:  # the raw run only: the judgment must not decide what comes next
        return run.status == "CE" or (grading.stop_at_visible_failure and run.status != "ok")

    try:  # what the program is judged against goes to the judge before the program runs
        judge.load([{"input": t.input, "output": t.output, "mode": p.mode} for t, p in zip(tests, prepared)],
                   limits.memory_mb)
        slot = pool.acquire()
    except BaseException:
        pool.release_judge(judge)
        raise
    released = threading.Lock()

    def release() -> None:  # once: when the program has ended (the pacer), else when this call ends
        if released.acquire(blocking=False):
            pool.release(slot)

    try:
        slot.run(code=code, mode=prepared[0].mode, parity=parity, func_name=func_name, limits=limits,
                 inputs=[p.payload for p in prepared], on_result=on_result, stop_after=stop_after,
                 isolate_tests=isolate_tests, on_paced=release)
    except SandboxError as e:  # twice, on a fresh zygote: this program's verdict (the pool counts it and warns)
        return Verdict(RE, 0, total, time.monotonic() - start, f"sandbox failure: {e}")
    finally:
        release()
        pool.release_judge(judge)
    return _verdict(outcomes, total, time.monotonic() - start)


def _verdict(outcomes: list[TestVerdict], total: int, elapsed: float) -> Verdict:
    """AC when every test that ran passed, else the first failure's status, with ``test i/total: <detail>``."""
    passed = sum(t.status == AC for t in outcomes)
    failure = next((t for t in outcomes if t.status != AC), None)
    if failure is None:
        return Verdict(AC, passed, total, elapsed, "", tuple(outcomes))
    return Verdict(failure.status, passed, total, elapsed, f"test {failure.index}/{total}: {failure.detail}",
                   tuple(outcomes))


def has_program(code: str | None) -> bool:
    """A response with no program (none extracted, or only whitespace) is NO_CODE without running anything."""
    return code is not None and bool(code.strip())


def grade_many(jobs: Sequence[GradeJob], *, grading: GradingConfig | None = None, pool: SandboxPool | None = None,
               progress: Callable[[int, int], None] | None = None, isolate_tests: bool = False,
               limits: Limits | None = None) -> list[Verdict]:
    """Grade many programs concurrently, each as :func:`grade_program` does; the verdicts come back in the order of
    ``jobs``.

    ``grading.workers`` sandbox slots (0: one per CPU core) of the shared pool for ``grading.isolation`` (or
    ``pool``'s) each grade one job at a time (its tests sequentially). ``progress`` is told ``(graded, total)``
    after each job (the caller's display). Every job's tests are validated first: a :class:`TestDataError` naming
    the job and the test is raised before anything runs. After that one verdict comes back per job whatever the
    programs do: a program that breaks its slot twice is ``RE`` ("sandbox failure").
    """
    grading = grading or GradingConfig()
    jobs = list(jobs)
    if grading.workers < 0:
        raise ValueError(f"workers must be >= 1 (or 0 for one per core), got {grading.workers}")
    if grading.parity not in PARITIES:
        raise ValueError(f"parity={grading.parity!r} is unknown; use one of {PARITIES}")
    for i, job in enumerate(jobs):  # every job's tests are checked before anything runs
        try:
            validate_job(job, grading.parity)
        except TestDataError as e:
            raise TestDataError(f"job {i}, {e}") from None
    limits = limits or Limits(time_s=grading.time_limit_s, memory_mb=grading.memory_mb)  # bad limits fail here
    pool = pool or shared_pool(grading.workers or None, grading.isolation)
    results: list[Verdict | None] = [None] * len(jobs)
    graded = 0

    def finished(i: int, result: Verdict) -> None:
        nonlocal graded
        results[i] = result
        graded += 1
        if progress is not None:
            progress(graded, len(jobs))

    def grade_job(job: GradeJob) -> Verdict:
        return grade_program(job.code, job.tests, func_name=job.func_name, grading=grading, pool=pool,
                             isolate_tests=isolate_tests, limits=limits)

    programs = [i for i, job in enumerate(jobs) if has_program(job.code)]
    # two threads a slot: one judges a program's last outputs while the other already runs the next program on the
    # slot it released (grade_program), so when a program starts never waits on the judging of the one before
    threads = ThreadPoolExecutor(max_workers=min(2 * pool.workers, max(1, len(programs))),
                                 thread_name_prefix="mars2-grade") if programs else None
    try:
        for i, job in enumerate(jobs):  # no program: NO_CODE (or NO_TESTS) at once, no thread or sandbox
            if not has_program(job.code):
                finished(i, grade_job(job))
        futures = {threads.submit(grade_job, jobs[i]): i for i in programs}
        for future in as_completed(futures):
            finished(futures[future], future.result())
    except BaseException:
        if threads is not None:
            threads.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        if threads is not None:
            threads.shutdown(wait=True)
    return [r for r in results if r is not None]
