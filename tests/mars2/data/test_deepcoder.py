"""Training-set records (MARTI / AReaL / verl / DeepCoder shapes) → Problem, with rejects and grading."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from mars2.config import GradingConfig
from mars2.data import ProblemRowError, load_deepcoder, problem_from_deepcoder_record, read_rows
from mars2.data.deepcoder import record_id
from tests.paths import FIXTURES

DEEPCODER = FIXTURES / "deepcoder"


@pytest.fixture(scope="module")
def loaded():
    return load_deepcoder(read_rows(DEEPCODER / "train.jsonl"), source="train.jsonl")


def test_every_record_shape_converts(loaded):
    problems, _ = loaded
    by_statement = {p.statement: p for p in problems}
    assert len(problems) == 6
    add = by_statement["Read two integers a and b and print a + b."]
    assert add.testtype == "stdin" and add.func_name is None and add.platform == "deepcoder"
    assert [(t.input, t.output) for t in add.hidden_tests] == [("1 2\n", "3\n"), ("5 7\n", "12\n")]
    assert add.public_tests == add.hidden_tests  # one label: the search and the reward use the same tests (MARTI)

    max_sum = by_statement["Return the sum of nums (method maxSum)."]
    assert max_sum.testtype == "functional" and max_sum.func_name == "maxSum"
    assert [(t.input, t.output) for t in max_sum.hidden_tests] == [("[1, 2, 3]", "6"), ("[-1]", "-1")]

    mul = by_statement["Return a * b (function mul)."]  # chat prompt: last user message; argument lists
    assert mul.func_name == "mul" and mul.difficulty == "easy"
    assert [(t.input, t.output) for t in mul.hidden_tests] == [("2\n3", "6"), ("0\n9", "0")]

    pub = by_statement["Print n squared."]
    assert pub.id == "pubpriv-1" and len(pub.public_tests) == 1 and len(pub.hidden_tests) == 2

    verl = by_statement["Print n times 3."]
    assert (verl.id, verl.platform, verl.difficulty) == ("taco-7", "taco", "medium")

    preview = by_statement["Print twice n."]
    assert [(t.input, t.output) for t in preview.hidden_tests] == [("2\n", "4\n"), ("5\n", "10\n")]
    assert preview.meta["tests_field"] == "tests"


def test_bad_records_are_reported_with_line_and_reason(loaded):
    _, rejected = loaded
    assert [r["line"] for r in rejected] == [7, 8, 9, 10, 11]
    assert all(r["source"] == "train.jsonl" for r in rejected)
    reasons = [r["error"] for r in rejected]
    assert "missing field" in reasons[0] and "label" in reasons[0]
    assert "1 inputs but 0 outputs" in reasons[1]
    assert "not one JSON value per line" in reasons[2]
    assert "not valid JSON" in reasons[3]
    assert "duplicate" in reasons[4]
    assert rejected[4]["question_id"] == record_id({"prompt": "Read two integers a and b and print a + b."})


def test_reference_programs_pass_the_converted_tests(loaded):
    from mars2.sandbox import GradeJob, grade_many

    problems, _ = loaded
    solutions = json.loads((DEEPCODER / "solutions.json").read_text())
    jobs = [GradeJob(solutions[p.statement], p.public_tests + p.hidden_tests, p.func_name) for p in problems]
    verdicts = grade_many(jobs, grading=GradingConfig(workers=2))
    assert [v.status for v in verdicts] == ["AC"] * len(problems)
    # and a wrong program fails them
    wrong = [GradeJob("print(0)\n" if p.testtype == "stdin" else f"def {p.func_name}(*a):\n    return None\n",
                      p.hidden_tests, p.func_name) for p in problems]
    assert not any(v.all_passed for v in grade_many(wrong, grading=GradingConfig(workers=2)))


@pytest.mark.parametrize("row, needle", [
    ({"prompt": 3, "label": {"inputs": ["1"], "outputs": ["1"]}}, "expected a string or a chat list"),
    ({"prompt": "  ", "label": {"inputs": ["1"], "outputs": ["1"]}}, "empty statement"),
    ({"prompt": [{"role": "system", "content": "x"}], "label": {"inputs": ["1"], "outputs": ["1"]}}, "without a user"),
    ({"prompt": "p", "label": "{bad"}, "not valid JSON"),
    ({"prompt": "p", "label": {"inputs": [], "outputs": []}}, "no tests"),
    ({"prompt": "p", "label": {"inputs": "1", "outputs": ["1"]}}, "must be lists"),
    ({"prompt": "p", "label": {"inputs": ["1"], "outputs": ["x"], "fn_name": "f"}}, "not JSON"),
    ({"prompt": "p", "label": {"inputs": ["1"], "outputs": ["1"], "fn_name": "not a name"}}, "identifier"),
    ({"prompt": "p", "label": {"inputs": [1], "outputs": ["1"]}}, "expected text"),
    ({"prompt": "p", "label": {"inputs": [{"a": 1}], "outputs": ["1"], "fn_name": "f"}}, "argument list"),
    ({"prompt": "p", "label": [{"input": "1", "output": "1", "testtype": "functional"}]}, "fn_name"),
    ({"prompt": "p", "label": {"public_tests": [{"input": "1", "output": "1", "testtype": "stdin"}],
                               "private_tests": {"inputs": ["[1]"], "outputs": ["1"], "fn_name": "f"}}}, "mixed"),
])
def test_malformed_records_raise_naming_the_field(row, needle):
    with pytest.raises(ProblemRowError, match=needle):
        problem_from_deepcoder_record(row)


def test_stdin_line_lists_are_joined_and_ids_are_stable():
    p = problem_from_deepcoder_record({"prompt": "p", "label": {"inputs": [["1", "2"]], "outputs": [["3"]]}})
    assert (p.hidden_tests[0].input, p.hidden_tests[0].output) == ("1\n2", "3")
    assert p.id == record_id({"prompt": "p"}) == problem_from_deepcoder_record(
        {"prompt": "p", "label": {"inputs": ["x"], "outputs": ["y"]}}).id
    q = problem_from_deepcoder_record({"question_id": 17, "prompt": "p", "label": {"inputs": ["1"], "outputs": ["1"]},
                                       "metadata": json.dumps({"contest_date": "2024-01-02T00:00:00",
                                                               "starter_code": "def f():"})})
    assert (q.id, q.contest_date, q.starter_code) == ("17", "2024-01-02T00:00:00", "def f():")


def test_json_array_and_parquet_files_read_the_same(tmp_path: Path):
    rows = [{k: v for k, v in r.items() if not k.startswith("__")} for r in read_rows(DEEPCODER / "train.jsonl")]
    good = [r for r in rows if "label" in r and isinstance(r["label"], str)]
    (tmp_path / "train.json").write_text(json.dumps(good))
    problems, rejected = load_deepcoder(read_rows(tmp_path / "train.json"), source="a")
    assert len(problems) == len(good) and rejected == []
    pd.DataFrame(good).to_parquet(tmp_path / "train.parquet")
    again, _ = load_deepcoder(read_rows(tmp_path / "train.parquet"), source="b")
    assert [p.to_row() for p in again] == [p.to_row() for p in problems]
    (tmp_path / "bad.json").write_text('[{"prompt": "p"}, 3')
    _, bad = load_deepcoder(read_rows(tmp_path / "bad.json"), source="c")
    assert len(bad) == 1 and "not a valid JSON array" in bad[0]["error"]
