"""Grade candidate programs against tests, with LiveCodeBench's verdict semantics.

Programs run in sandboxed worker slots (:mod:`mars2.sandbox.pool`); the sandbox gets only the
program and the test inputs, and hands back raw stdout (stdin tests) or the typed return value
(functional tests). The comparison with the expected output (:mod:`mars2.sandbox.matching`) happens in a judge
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
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    if grading.parity not in PARITIES:
        raise ValueError(f"parity={grading.parity!r} is unknown; use one of {PARITIES}")
    planned = _plan(code, tests, func_name, grading.parity)
    if isinstance(planned, Verdict):
        return planned
    limits = limits or Limits(time_s=grading.time_limit_s, memory_mb=grading.memory_mb)
    pool = pool or shared_pool(None, grading.isolation, grading.judge_cores)
    return _grade({0: planned}, pool, limits, grading, isolate_tests)[0]


@dataclass
class _Program:
    """A program ready to run: its code, tests, what each test sends and expects, and when it was started."""

    code: str
    tests: tuple[TestCase, ...]
    func_name: str | None
    prepared: list[_Prepared]
    parity: str
    started: float = 0.0


def _plan(code: str | None, tests: Sequence[TestCase], func_name: str | None, parity: str) -> Verdict | _Program:
    """The verdict of a job that needs no sandbox (``NO_TESTS``, ``NO_CODE``, LiveCodeBench's blank-line error, a
    program too large to compile), else the :class:`_Program` to run. Raises :class:`TestDataError`."""
    start = time.monotonic()
    tests = tuple(tests)
    total = len(tests)
    if total == 0:
        return Verdict(NO_TESTS, 0, 0, time.monotonic() - start, "no tests to run")
    if not has_program(code):
        return Verdict(NO_CODE, 0, total, time.monotonic() - start, "no program")
    assert code is not None
    prepared = [_prepare(test, func_name, i, parity) for i, test in enumerate(tests, start=1)]
    if len({p.mode for p in prepared}) != 1:
        raise TestDataError("a program's tests mix stdin and functional test types")
    if parity == "lcb" and (blank := _lcb_blank_line_error(tests)) is not None:
        return Verdict(RE, 0, total, time.monotonic() - start, blank)
    if len(code.encode("utf-8", "surrogatepass")) > MAX_PROGRAM_BYTES:
        return Verdict(CE, 0, total, time.monotonic() - start,
                       f"compile error\nprogram larger than {MAX_PROGRAM_BYTES} bytes")
    return _Program(code, tests, func_name, prepared, parity)


def _grade(programs: dict[int, _Program], pool: SandboxPool, limits: Limits, grading: GradingConfig,
           isolate_tests: bool, on_ran: Callable[[], None] | None = None) -> dict[int, Verdict]:
    """Run ``programs`` (by job index) in the pool's slots and judge them apart; their verdicts by index.

    Runner threads (one per slot) only run (:func:`_run`): a slot never waits for a judgment, so when a program
    starts does not depend on how the programs before it were judged. Judge threads (as many) judge the runs as they
    come (:func:`_judge`), in the order the programs started, kept to the pool's judge cores (``pool.judge_cpus``)
    like the judge processes they feed. This thread wakes only when a program's runs are all in (``on_ran()``,
    e.g. progress) and takes the verdicts once every program has run: nothing it does while programs run happens
    at a moment a judgment decides.
    """
    if not programs:
        return {}
    n = min(pool.workers, len(programs))
    runners = ThreadPoolExecutor(max_workers=n, thread_name_prefix="mars2-run")
    judges = ThreadPoolExecutor(max_workers=n, thread_name_prefix="mars2-judge", initializer=_keep_to,
                                initargs=(pool.judge_cpus,))
    ran: queue.SimpleQueue = queue.SimpleQueue()
    judged: queue.SimpleQueue = queue.SimpleQueue()
    cancel = threading.Event()
    queues: list[queue.SimpleQueue] = []
    verdicts: dict[int, Verdict] = {}

    def judge_job(i: int, runs: queue.SimpleQueue) -> None:
        try:
            judged.put((i, _judge(programs[i], pool, limits, runs)))
        except BaseException as e:  # noqa: BLE001 - raised in the calling thread
            judged.put((i, e))

    def run_job(i: int) -> None:
        runs: queue.SimpleQueue = queue.SimpleQueue()
        queues.append(runs)
        try:
            try:  # judged as it runs, in the order programs start
                judges.submit(judge_job, i, runs)
            except BaseException as e:  # noqa: BLE001 - the executor is shutting down: the batch is abandoned
                judged.put((i, e))
                return
            _run(programs[i], pool, limits, grading, isolate_tests, runs, cancel)
        finally:
            ran.put(i)

    def take(block: bool) -> None:
        while len(verdicts) < len(programs):
            try:
                i, result = judged.get(block=block)
            except queue.Empty:
                return
            if isinstance(result, BaseException):
                raise result
            verdicts[i] = result

    try:
        for i in programs:
            runners.submit(run_job, i)
        for _ in programs:
            ran.get()
            take(block=False)  # a judging error surfaces here, at a moment a program's end decides
            if on_ran is not None:
                on_ran()
        take(block=True)
    except BaseException:
        cancel.set()
        raise
    finally:
        runners.shutdown(wait=True, cancel_futures=True)
        judges.shutdown(wait=True, cancel_futures=True)
        for runs in queues:  # what an abandoned batch ran but never judged
            pool.held.drop(runs)
    return verdicts


def _keep_to(cpus: frozenset[int]) -> None:
    """Keep the calling thread to ``cpus`` (none: anywhere)."""
    if cpus:
        os.sched_setaffinity(0, cpus)


class _Cancelled(Exception):
    """The batch was abandoned: the program in a slot is ended after its test in flight."""


def _run(program: _Program, pool: SandboxPool, limits: Limits, grading: GradingConfig, isolate_tests: bool,
         runs: queue.SimpleQueue, cancel: threading.Event | None = None) -> None:
    """Run ``program`` in a slot of ``pool``, putting each ``(index, run)`` into ``runs`` with its output held by the
    pool (:class:`~mars2.sandbox.pool.HeldOutputs`), then ``None`` (or the exception that ended it).
    Never judges and never waits for a judgment: the slot goes to the next program as soon as this one's runs are
    in, so when a program starts does not depend on how its predecessors were judged."""

    def hand_over(index: int, run: TestRun) -> None:
        if cancel is not None and cancel.is_set():
            pool.held.take(run.output)
            raise _Cancelled
        runs.put((index, run))

    def stop_after(run: TestRun) -> bool:  # the raw run only: the judgment must not decide what comes next
        return run.status == "CE" or (grading.stop_at_visible_failure and run.status != "ok")

    program.started = time.monotonic()
    ended: BaseException | None = None
    try:
        slot = pool.acquire()
        try:
            slot.run(code=program.code, mode=program.prepared[0].mode, parity=program.parity,
                     func_name=program.func_name, limits=limits, inputs=[p.payload for p in program.prepared],
                     on_result=hand_over, stop_after=stop_after, isolate_tests=isolate_tests)
        finally:
            pool.release(slot)
    except _Cancelled:
        pass
    except BaseException as e:  # noqa: BLE001 - the judging side turns it into the verdict or raises it
        ended = e
    runs.put(ended)


def _judge(program: _Program, pool: SandboxPool, limits: Limits, runs: queue.SimpleQueue) -> Verdict:
    """Judge the runs :func:`_run` puts into ``runs`` as they come, in a judge process (given the program's tests
    first), and return the program's :class:`Verdict`. A judge that fails (twice, or cannot compare) is that
    program's ``RE`` "sandbox failure", as is a slot that failed twice."""
    total = len(program.tests)
    outcomes: list[TestVerdict] = []
    judge = pool.acquire_judge()
    try:
        judge.load([{"input": t.input, "output": t.output, "mode": p.mode}
                    for t, p in zip(program.tests, program.prepared)], limits.memory_mb)
        while (item := runs.get()) is not None:
            if isinstance(item, SandboxError):
                return Verdict(RE, 0, total, time.monotonic() - program.started, f"sandbox failure: {item}")
            if isinstance(item, BaseException):
                raise item
            index, run = item
            run.output = pool.held.take(run.output)
            if index == 0:  # a retried program starts again from its first test
                outcomes.clear()
            try:
                status, detail = judge.judge(index, run)
            except RuntimeError as e:  # the judge failed (twice, or could not compare): this program's verdict alone
                pool.count_failure()
                status, detail = RE, f"sandbox failure: {e}"
            outcomes.append(TestVerdict(index + 1, status, detail, run.cpu_s, run.wall_s))
            del run, item
    finally:
        pool.release_judge(judge)
    return _verdict(outcomes, total, time.monotonic() - program.started)


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

    ``grading.workers`` sandbox slots (0: one per CPU core the judges do not keep) of the shared pool for
    ``grading.isolation`` (or ``pool``'s) each run one job at a time (its tests sequentially), and as many judge
    processes judge the runs as they come, in the order the programs started; a slot never waits for a judgment
    (until the outputs waiting for one pass ``pool.py: SPOOL_BYTES``). ``progress`` is told ``(done, total)``
    each time a job has run (the caller's display; the verdicts come together once all have run). Every job's tests are validated first: a :class:`TestDataError` naming
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
    pool = pool or shared_pool(grading.workers or None, grading.isolation, grading.judge_cores)
    results: list[Verdict | None] = [None] * len(jobs)
    graded = 0

    def count() -> None:
        nonlocal graded
        graded += 1
        if progress is not None:
            progress(graded, len(jobs))

    programs: dict[int, _Program] = {}
    for i, job in enumerate(jobs):  # no program to run: its verdict at once, no thread or sandbox
        planned = _plan(job.code, job.tests, job.func_name, grading.parity)
        if isinstance(planned, Verdict):
            results[i] = planned
            count()
        else:
            programs[i] = planned
    for i, verdict in _grade(programs, pool, limits, grading, isolate_tests, on_ran=count).items():
        results[i] = verdict
    return [r for r in results if r is not None]
