"""Sandboxed grading of candidate programs with LiveCodeBench's verdict semantics.

Programs run in long-lived, isolated worker slots (one per core): a warmed interpreter ("zygote")
inside a bubblewrap sandbox (pid/net/mount namespaces, read-only filesystem, a dedicated
unprivileged uid per slot, seccomp, rlimits, optional cgroups) forks a confined test process per
program (optionally per test), which runs each test from a clean state; the grader's judge processes compare the
raw outputs with the expected ones and it returns a :class:`Verdict`.
Where bubblewrap cannot run, a weaker ``process`` level is used (and reported).

Public API: :func:`grade_program` (one program) and :func:`grade_many` (many, concurrently), both set by a
:class:`~mars2.config.GradingConfig`; :class:`GradeJob`, :class:`Verdict` (with each test's :class:`TestVerdict`);
:func:`probe_isolation` / :func:`isolation_params` to see and log what isolation is in use;
:class:`SandboxPool` to control the worker slots; ``python -m mars2.sandbox`` for the command line.
See ``docs/sandbox.md``.
"""

from mars2.sandbox.grader import (
    PARITIES,
    GradeJob,
    TestDataError,
    grade_many,
    grade_program,
)
from mars2.sandbox.isolation import LEVELS, choose_level, describe, probe_isolation
from mars2.sandbox.pool import (
    Limits,
    SandboxError,
    SandboxPool,
    SandboxStartError,
    TestRun,
    close_shared_pools,
    shared_pool,
)
from mars2.sandbox.verdict import STATUSES, TestVerdict, Verdict


def isolation_params(isolation: str = "auto", workers: int | None = None) -> dict[str, str]:
    """Flat ``sandbox.*`` strings describing the isolation ``isolation`` resolves to on this host
    (e.g. for ``mlflow.log_params``). Raises if ``isolation`` names a level that does not work here."""
    from mars2.sandbox.pool import default_workers

    probe = probe_isolation()
    level = choose_level(isolation, probe)
    return {**describe(level, probe), "sandbox.workers": str(workers or default_workers())}


__all__ = [
    "LEVELS",
    "PARITIES",
    "STATUSES",
    "GradeJob",
    "Limits",
    "SandboxError",
    "SandboxPool",
    "SandboxStartError",
    "TestDataError",
    "TestRun",
    "TestVerdict",
    "Verdict",
    "close_shared_pools",
    "grade_many",
    "grade_program",
    "isolation_params",
    "probe_isolation",
    "shared_pool",
]
