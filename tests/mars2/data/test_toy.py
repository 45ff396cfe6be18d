"""The toy benchmark: deterministic, in LCB's row schema, and solved by its reference solutions."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from datetime import datetime

import pytest

from mars2.config import GradingConfig
from mars2.data import problem_from_lcb_row, toy_benchmark, toy_reference_solutions
from mars2.data.toy import N_TEMPLATES, TEMPLATE_NAMES

LCB_FIELDS = {
    "question_title",
    "question_content",
    "platform",
    "question_id",
    "contest_id",
    "contest_date",
    "starter_code",
    "difficulty",
    "public_test_cases",
    "private_test_cases",
    "metadata",
}

N_GRADED = 60  # problems graded end to end through the sandbox (covers every template at least once)


def _dump(rows: list[dict[str, str]]) -> str:
    return json.dumps(rows, sort_keys=True)


def test_same_seed_is_identical_and_different_seeds_differ():
    a, b = toy_benchmark(50, seed=0), toy_benchmark(50, seed=0)
    assert _dump(a) == _dump(b)
    assert toy_reference_solutions(50, seed=0) == toy_reference_solutions(50, seed=0)
    c = toy_benchmark(50, seed=1)
    assert _dump(a) != _dump(c)
    # not only the test inputs: the problem parameters (statements, solutions) change with the seed
    assert sum(x["question_content"] != y["question_content"] for x, y in zip(a, c)) >= 40
    assert toy_reference_solutions(50, seed=0) != toy_reference_solutions(50, seed=1)
    # problem i depends only on (seed, i)
    assert _dump(toy_benchmark(20, seed=0)) == _dump(a[:20])


def test_byte_identical_across_processes_and_hash_seeds():
    code = (
        "import hashlib, json; from mars2.data import toy_benchmark, toy_reference_solutions; "
        "print(hashlib.sha256((json.dumps(toy_benchmark(80, 3)) + json.dumps(toy_reference_solutions(80, 3))).encode()).hexdigest())"
    )
    digests = set()
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
        digests.add(out.stdout.strip())
    local = hashlib.sha256((json.dumps(toy_benchmark(80, 3)) + json.dumps(toy_reference_solutions(80, 3))).encode()).hexdigest()
    assert digests == {local}


def test_rows_follow_the_lcb_schema_and_convert():
    rows = toy_benchmark(200, seed=0)
    sols = toy_reference_solutions(200, seed=0)
    assert len(rows) == 200
    ids = [r["question_id"] for r in rows]
    assert len(set(ids)) == 200 and ids[0] == "toy_0001" and ids[-1] == "toy_0200"
    assert set(sols) == set(ids)
    for r in rows:
        assert set(r) == LCB_FIELDS
        assert all(isinstance(v, str) for v in r.values()), r["question_id"]
        assert r["platform"] == "toy"
        assert r["difficulty"] in {"easy", "medium", "hard"}
        datetime.fromisoformat(r["contest_date"])
        private = json.loads(r["private_test_cases"])  # hidden tests are plain JSON
        public = json.loads(r["public_test_cases"])
        assert 1 <= len(public) <= 2 and len(private) >= 4
        p = problem_from_lcb_row(r)
        assert p.id == r["question_id"] and p.statement == r["question_content"]
        assert len(p.hidden_tests) == len(private) and len(p.public_tests) == len(public)
        if p.testtype == "stdin":
            assert r["starter_code"] == "" and r["metadata"] == "{}" and p.func_name is None
            for t in p.public_tests:  # the public tests are the statement's samples
                assert t.input.strip() in p.statement and t.output.strip() in p.statement
        else:
            assert json.loads(r["metadata"]) == {"func_name": p.func_name}
            assert r["starter_code"].startswith(f"class Solution:\n    def {p.func_name}(self, ")
            assert f"def {p.func_name}(self, " in sols[p.id]
            for t in p.public_tests + p.hidden_tests:
                [json.loads(line) for line in t.input.split("\n")]
                json.loads(t.output)
        inputs = [t.input for t in p.public_tests + p.hidden_tests]
        assert len(set(inputs)) == len(inputs), f"{p.id}: duplicate test inputs"
        assert "Example 1" in p.statement or "Sample Input 1" in p.statement
    problems = [problem_from_lcb_row(r) for r in rows]
    types = Counter(p.testtype for p in problems)
    assert types["stdin"] > types["functional"] >= 40
    assert set(Counter(p.difficulty for p in problems)) == {"easy", "medium", "hard"}
    dates = [p.contest_date for p in problems]
    assert dates == sorted(dates)  # ids follow contest order
    assert len(set(dates)) == 50  # four problems per weekly contest: date splits are possible


def test_every_template_appears_in_the_graded_prefix():
    assert N_TEMPLATES == len(TEMPLATE_NAMES) >= 30
    assert N_GRADED >= N_TEMPLATES
    titles = {r["question_title"] for r in toy_benchmark(N_GRADED, seed=0)}
    assert len(titles) >= N_TEMPLATES - 2  # a few templates share a title across parameters


def _jobs(rows, codes):
    from mars2.sandbox import GradeJob

    jobs = []
    for r in rows:
        p = problem_from_lcb_row(r)
        jobs.append(GradeJob(codes[p.id], p.public_tests + p.hidden_tests, p.func_name))
    return jobs


def test_reference_solutions_pass_all_tests_in_the_sandbox():
    from mars2.sandbox import grade_many

    rows = toy_benchmark(N_GRADED, seed=0)
    sols = toy_reference_solutions(N_GRADED, seed=0)
    verdicts = grade_many(_jobs(rows, sols), grading=GradingConfig(workers=2))
    assert len(verdicts) == len(rows)
    failed = [(r["question_id"], r["question_title"], v) for r, v in zip(rows, verdicts) if not v.all_passed]
    assert failed == []


def test_wrong_solutions_fail_in_the_sandbox():
    from mars2.sandbox import grade_many

    rows = toy_benchmark(N_GRADED, seed=0)
    sols = toy_reference_solutions(N_GRADED, seed=0)
    problems = [problem_from_lcb_row(r) for r in rows]
    wrong: dict[str, str] = {}
    stdin = [p for p in problems if p.testtype == "stdin"]
    # a stdin problem gets the solution of the next stdin problem with a different title
    for k, p in enumerate(stdin):
        other = next(q for q in stdin[k + 1 :] + stdin[:k] if q.title != p.title)
        wrong[p.id] = sols[other.id]
    # a functional problem gets its own reference with the result perturbed
    for p in problems:
        if p.testtype == "functional":
            wrong[p.id] = sols[p.id].replace("class Solution:", "class _Right:", 1) + (
                f"\n\nclass Solution(_Right):\n    def {p.func_name}(self, *args):\n"
                f"        r = super().{p.func_name}(*args)\n"
                "        return [r] if not isinstance(r, list) else r[::-1] + [0]\n"
            )
    verdicts = grade_many(_jobs(rows, wrong), grading=GradingConfig(workers=2))
    passed = [r["question_id"] for r, v in zip(rows, verdicts) if v.all_passed]
    assert passed == []
    # they fail on their outputs or by crashing on a foreign input format, never by not compiling
    assert {v.status for v in verdicts} <= {"WA", "RE"}
    assert all(v.status == "WA" for p, v in zip(problems, verdicts) if p.testtype == "functional")


def test_grader_rejects_empty_program():
    from mars2.sandbox import grade_many

    rows = toy_benchmark(4, seed=5)
    codes = {r["question_id"]: "pass\n" for r in rows}
    assert not any(v.all_passed for v in grade_many(_jobs(rows, codes), grading=GradingConfig(workers=2)))


@pytest.mark.parametrize("n", [0, 1, 7])
def test_small_sizes(n: int):
    rows = toy_benchmark(n, seed=2)
    assert len(rows) == n and len(toy_reference_solutions(n, seed=2)) == n


def test_negative_size_is_an_error():
    with pytest.raises(ValueError):
        toy_benchmark(-1)
