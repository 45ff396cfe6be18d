"""LiveCodeBench ``code_generation_lite`` rows → Problem: conversion, safe private-test decoding, rejects."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from pathlib import Path

import pytest

from mars2.data import Problem, ProblemRowError, load_problems, problem_from_lcb_row, read_jsonl_rows
from mars2.data import TestCase as Case  # aliased so pytest does not try to collect it
from mars2.data.lcb import decode_private_tests
from tests.paths import SHARED

STDIN_TESTS = [
    {"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"},
    {"input": "1\n-5\n", "output": "-5\n", "testtype": "stdin"},
]
FUNC_TESTS = [{"input": '[1, 2, 3]\n2', "output": "[3, 1, 2]", "testtype": "functional"}]


def stdin_row(**overrides: str) -> dict[str, str]:
    row = {
        "question_title": "Sum",
        "question_content": "Print the sum of n integers.",
        "platform": "atcoder",
        "question_id": "abc999_a",
        "contest_id": "abc999",
        "contest_date": "2024-08-03T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps(STDIN_TESTS),
        "private_test_cases": json.dumps([{"input": "2\n5 5\n", "output": "10\n", "testtype": "stdin"}]),
        "metadata": "{}",
    }
    row.update(overrides)
    return row


def func_row(**overrides: str) -> dict[str, str]:
    row = {
        "question_title": "rotate-right",
        "question_content": "Rotate nums to the right k times.",
        "platform": "leetcode",
        "question_id": "9999",
        "contest_id": "weekly-contest-999",
        "contest_date": "2024-09-01T00:00:00",
        "starter_code": "class Solution:\n    def rotate(self, nums: List[int], k: int) -> List[int]:\n        ",
        "difficulty": "medium",
        "public_test_cases": json.dumps(FUNC_TESTS),
        "private_test_cases": "[]",
        "metadata": json.dumps({"func_name": "rotate"}),
    }
    row.update(overrides)
    return row


def encode_private(tests: list[dict]) -> str:
    """LiveCodeBench's encoding: JSON text → pickle → zlib → base64."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode("ascii")


# ---------------------------------------------------------------------------------------------- conversion


def test_stdin_row_converts():
    p = problem_from_lcb_row(stdin_row())
    assert isinstance(p, Problem)
    assert p.id == "abc999_a" and p.title == "Sum" and p.statement == "Print the sum of n integers."
    assert p.testtype == "stdin" and p.func_name is None
    assert p.public_tests == (Case("3\n1 2 3\n", "6\n", "stdin"), Case("1\n-5\n", "-5\n", "stdin"))
    assert p.hidden_tests == (Case("2\n5 5\n", "10\n", "stdin"),)
    assert (p.platform, p.contest_date, p.difficulty, p.starter_code) == ("atcoder", "2024-08-03T00:00:00", "easy", "")
    assert p.meta["contest_id"] == "abc999"
    # survives the Parquet row round trip of the shared schema
    assert Problem.from_row(p.to_row()) == p


def test_functional_row_converts_with_empty_private_tests():
    p = problem_from_lcb_row(func_row())
    assert p.testtype == "functional" and p.func_name == "rotate"
    assert p.public_tests == (Case('[1, 2, 3]\n2', "[3, 1, 2]", "functional"),)
    assert p.hidden_tests == ()
    assert p.starter_code.startswith("class Solution:")


def test_base64_zlib_pickle_private_tests_decode():
    hidden = [
        {"input": "4\n1 1 1 1\n", "output": "4\n", "testtype": "stdin"},
        {"input": "2\n-1 1\n", "output": "0\n", "testtype": "stdin"},
    ]
    encoded = encode_private(hidden)
    assert not encoded.startswith("[")
    p = problem_from_lcb_row(stdin_row(private_test_cases=encoded))
    assert p.hidden_tests == (Case("4\n1 1 1 1\n", "4\n", "stdin"), Case("2\n-1 1\n", "0\n", "stdin"))
    # every pickle protocol LiveCodeBench could have used
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        blob = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(hidden), protocol=proto))).decode()
        assert decode_private_tests(blob) == hidden


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_rejected_without_running(tmp_path: Path):
    marker = tmp_path / "pwned"
    evil = base64.b64encode(zlib.compress(pickle.dumps(_Evil(marker)))).decode()
    # sanity: the payload really would run os.system under plain pickle.loads (not executed here)
    assert b"system" in zlib.decompress(base64.b64decode(evil))
    with pytest.raises(ProblemRowError) as e:
        problem_from_lcb_row(stdin_row(private_test_cases=evil))
    assert "abc999_a" in str(e.value) and "private_test_cases" in str(e.value)
    assert not marker.exists()

    # a payload that builds a non-str object (even without globals) is rejected as well
    not_str = base64.b64encode(zlib.compress(pickle.dumps([{"input": "1", "output": "1", "testtype": "stdin"}]))).decode()
    with pytest.raises(ProblemRowError, match="expected str"):
        problem_from_lcb_row(stdin_row(private_test_cases=not_str))
    # a pickle that refers to a harmless-looking class is rejected too (no class is ever loaded)
    with pytest.raises(ProblemRowError, match="refusing"):
        problem_from_lcb_row(stdin_row(private_test_cases=base64.b64encode(zlib.compress(pickle.dumps(Case("a", "b")))).decode()))
    assert not marker.exists()


def test_zlib_bomb_is_bounded():
    blob = base64.b64encode(zlib.compress(b"\0" * (5 << 20))).decode()
    with pytest.raises(ValueError, match="exceeds"):
        decode_private_tests(blob, max_bytes=1 << 20)


# ---------------------------------------------------------------------------------------------- malformed rows


def _without(row: dict[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in row.items() if k != key}


MALFORMED = {
    "bad public JSON": (stdin_row(public_test_cases="[{oops"), "public_test_cases"),
    "public not a list": (stdin_row(public_test_cases='{"input": "1"}'), "public_test_cases"),
    "missing public field": (_without(stdin_row(), "public_test_cases"), "public_test_cases"),
    "missing private field": (_without(stdin_row(), "private_test_cases"), "private_test_cases"),
    "missing content": (_without(stdin_row(), "question_content"), "question_content"),
    "non-string field": (stdin_row(difficulty=3), "difficulty"),  # type: ignore[arg-type]
    "undecodable private": (stdin_row(private_test_cases="this is not base64 !!"), "private_test_cases"),
    "private base64 not zlib": (stdin_row(private_test_cases=base64.b64encode(b"hello world").decode()), "private_test_cases"),
    "private zlib not pickle": (
        stdin_row(private_test_cases=base64.b64encode(zlib.compress(b"not a pickle")).decode()),
        "private_test_cases",
    ),
    "pickled str not JSON": (
        stdin_row(private_test_cases=base64.b64encode(zlib.compress(pickle.dumps("[{nope"))).decode()),
        "private_test_cases",
    ),
    "no tests at all": (stdin_row(public_test_cases="[]", private_test_cases="[]"), "public_test_cases"),
    "unknown testtype": (
        stdin_row(public_test_cases=json.dumps([{"input": "1", "output": "1", "testtype": "interactive"}])),
        "public_test_cases",
    ),
    "test without output": (stdin_row(public_test_cases=json.dumps([{"input": "1", "testtype": "stdin"}])), "public_test_cases"),
    "mixed testtypes": (stdin_row(private_test_cases=json.dumps(FUNC_TESTS)), "public_test_cases"),
    "functional without func_name": (func_row(metadata="{}"), "metadata"),
    "functional with empty func_name": (func_row(metadata='{"func_name": ""}'), "metadata"),
    "bad metadata JSON": (func_row(metadata="{func_name"), "metadata"),
    "functional input not JSON": (
        func_row(public_test_cases=json.dumps([{"input": "[1, 2", "output": "1", "testtype": "functional"}])),
        "public_test_cases",
    ),
    "bad contest_date": (stdin_row(contest_date="last tuesday"), "contest_date"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_row_raises_naming_id_and_field(case: str):
    row, field = MALFORMED[case]
    with pytest.raises(ProblemRowError) as e:
        problem_from_lcb_row(row)
    msg = str(e.value)
    assert repr(row["question_id"]) in msg, msg
    assert field in msg, msg


def test_hidden_tests_alone_are_enough():
    p = problem_from_lcb_row(stdin_row(public_test_cases="[]"))
    assert p.public_tests == () and len(p.hidden_tests) == 1


def test_missing_question_id_is_an_error():
    with pytest.raises(ProblemRowError, match="question_id"):
        problem_from_lcb_row(_without(stdin_row(), "question_id"))


# ---------------------------------------------------------------------------------------------- load_problems / JSONL


def test_load_problems_keeps_good_rows_and_reports_bad_ones():
    rows = [
        stdin_row(question_id="a1"),
        stdin_row(question_id="a2", public_test_cases="not json"),
        func_row(question_id="f1"),
        func_row(question_id="f2", metadata="{}"),
        stdin_row(question_id="a1"),  # duplicate id
        "not a dict",  # type: ignore[list-item]
    ]
    problems, rejected = load_problems(rows, source="unit")
    assert [p.id for p in problems] == ["a1", "f1"]
    assert [(r["line"], r["question_id"]) for r in rejected] == [(2, "a2"), (4, "f2"), (5, "a1"), (6, None)]
    assert all(r["source"] == "unit" and r["error"] for r in rejected)
    assert "public_test_cases" in rejected[0]["error"] and "metadata" in rejected[1]["error"]
    assert "duplicate" in rejected[2]["error"]
    assert len(problems) + len(rejected) == len(rows)


def test_read_jsonl_rows_survives_bad_lines(tmp_path: Path):
    path = tmp_path / "rows.jsonl"
    lines = [
        json.dumps(stdin_row(question_id="ok1")),
        '{"question_id": "broken", "public_test_cases": ',  # truncated JSON
        "",  # blank line: skipped, but line numbers still count it
        json.dumps([1, 2, 3]),  # JSON, but not an object
        json.dumps(func_row(question_id="ok2")),
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe{\n" + json.dumps(stdin_row(question_id="ok3")).encode() + b"\n")
    rows = list(read_jsonl_rows(path))
    assert len(rows) == 6
    assert "__malformed__" in rows[1] and rows[1]["__malformed__"].startswith('{"question_id": "broken"')
    problems, rejected = load_problems(rows, source=str(path))
    assert [p.id for p in problems] == ["ok1", "ok2", "ok3"]
    assert [r["line"] for r in rejected] == [2, 4, 6]
    assert all(r["source"] == str(path) for r in rejected)
    assert "line 2" in rejected[0]["error"] and "JSON" in rejected[0]["error"]
    assert "UTF-8" in rejected[2]["error"]


# ---------------------------------------------------------------------------------------------- the shared LCB copy


def _shared_problems_file() -> Path | None:
    candidates = []
    if os.environ.get("MARS2_SHARED_DATA"):
        env = Path(os.environ["MARS2_SHARED_DATA"])
        candidates += [env / "lcb_v5_public/problems.jsonl", env / "data/lcb_v5_public/problems.jsonl"]
    candidates.append(SHARED / "data/lcb_v5_public/problems.jsonl")
    return next((c for c in candidates if c.is_file()), None)


def test_shared_lcb_v5_public_loads_completely():
    path = _shared_problems_file()
    if path is None:
        pytest.skip("shared/data/lcb_v5_public/problems.jsonl not found (set MARS2_SHARED_DATA)")
    problems, rejected = load_problems(read_jsonl_rows(path), source=str(path))
    assert rejected == []
    assert len(problems) == 879
    assert len({p.id for p in problems}) == 879
    stdin = [p for p in problems if p.testtype == "stdin"]
    functional = [p for p in problems if p.testtype == "functional"]
    assert (len(stdin), len(functional)) == (498, 381)
    assert sum(len(p.public_tests) for p in stdin) == 1365
    assert sum(len(p.public_tests) for p in functional) == 934
    assert all(p.hidden_tests == () and 1 <= len(p.public_tests) <= 6 for p in problems)
    assert all(p.func_name and f"def {p.func_name}(" in p.starter_code for p in functional)
    assert all(p.func_name is None and p.starter_code == "" for p in stdin)
    plat: dict[str, int] = {}
    for p in problems:
        plat[p.platform] = plat.get(p.platform, 0) + 1
    assert plat == {"atcoder": 489, "leetcode": 381, "codeforces": 9}
    assert min(p.contest_date for p in problems).startswith("2023-05-07")
    assert max(p.contest_date for p in problems).startswith("2025-01-04")
