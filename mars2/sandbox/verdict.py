"""The structured result of grading one program against a list of tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

AC = "AC"
WA = "WA"
TLE = "TLE"
RE = "RE"
CE = "CE"
MLE = "MLE"
NO_CODE = "NO_CODE"
NO_TESTS = "NO_TESTS"
STATUSES: tuple[str, ...] = (AC, WA, TLE, RE, CE, MLE, NO_CODE, NO_TESTS)


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each lone surrogate (an undecodable byte of a program's output, or one a program put
    in an exception message) becomes its backslash escape, so what leaves the grader encodes as UTF-8 everywhere it
    goes (Parquet, JSON, MLflow)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class TestVerdict:
    """The outcome of one test that was run: ``status`` as in :class:`Verdict` (``AC`` = passed)."""

    __test__ = False

    index: int
    status: str
    detail: str = ""
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", valid_text(self.detail))

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.index, "status": self.status, "detail": self.detail, "cpu_s": round(self.cpu_s, 4),
                "wall_s": round(self.wall_s, 4)}


@dataclass(frozen=True)
class Verdict:
    """Result of :func:`mars2.sandbox.grade_program`.

    ``status``: ``"AC"`` when every test passed, otherwise the kind of the first failure:
    ``"WA"`` wrong answer, ``"TLE"`` time limit, ``"RE"`` runtime error (exception, crash, abnormal
    exit, output limit), ``"CE"`` the program does not compile (syntax error), ``"MLE"`` memory
    limit (a ``MemoryError``; a crash caused by memory exhaustion may show as ``"RE"``),
    ``"NO_CODE"`` no program (``None`` or blank), ``"NO_TESTS"`` an empty test list (a failure:
    LiveCodeBench counts it as a pass, which is a bug).
    ``passed``: tests passed (before stopping, when stopping at the first failure).
    ``total``: number of tests given. ``time_s``: wall time spent grading.
    ``detail``: short human-readable account of the first failure, ``""`` on AC; always valid Unicode
    (:func:`valid_text`).
    ``tests``: the outcome of every test that ran, in order (not part of equality or :meth:`to_dict`).
    """

    status: str
    passed: int
    total: int
    time_s: float
    detail: str = ""
    tests: tuple[TestVerdict, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}; expected one of {STATUSES}")
        object.__setattr__(self, "detail", valid_text(self.detail))

    @property
    def all_passed(self) -> bool:
        """The reward criterion: every test passed and there was at least one test."""
        return self.status == AC and self.total > 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the fields but ``tests``."""
        return {"status": self.status, "passed": self.passed, "total": self.total, "time_s": self.time_s,
                "detail": self.detail}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        """Inverse of :meth:`to_dict`."""
        return cls(status=str(data["status"]), passed=int(data["passed"]), total=int(data["total"]),
                   time_s=float(data["time_s"]), detail=str(data.get("detail", "")))
