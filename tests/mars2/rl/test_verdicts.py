"""mars2.rl.verdicts.hidden_test_verdicts on tables read back from Parquet (where a missing program is NaN, not None)."""

from __future__ import annotations

import pandas as pd
import pytest

from mars2.config import GradingConfig
from mars2.data.lcb import load_problems
from mars2.data.toy import toy_benchmark, toy_reference_solutions
from mars2.io import write_parquet
from mars2.rl.verdicts import hidden_test_verdicts


def test_missing_code_read_back_as_nan_is_no_code(tmp_path):
    problems, _ = load_problems(toy_benchmark(2, seed=0), source="toy")
    ref = toy_reference_solutions(2, 0)[problems[0].id]
    rows = pd.DataFrame({"problem_id": [problems[0].id, problems[0].id, problems[1].id], "node_id": [0, 1, 0],
                         "agent": ["a", "a", "b"], "code": [ref, None, "print("]})
    write_parquet(tmp_path / "nodes.parquet", rows)
    back = pd.read_parquet(tmp_path / "nodes.parquet")
    assert isinstance(back["code"].iloc[1], float)  # the case this guards: NaN, not None
    verdicts = hidden_test_verdicts(back, {p.id: p for p in problems}, GradingConfig(workers=1, isolation="process"))
    assert verdicts["status"].tolist() == ["AC", "NO_CODE", "CE"]
    assert verdicts["reward"].tolist() == [1.0, 0.0, 0.0]


HOSTILE_TEXT = [
    "raise ValueError('\\udcff\\ud800 lone surrogates')\n",  # in the exception message the grader reports
    "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe not UTF-8\\n')\n",  # undecodable bytes as its answer
    "print('\\ud83d')\n",  # a surrogate it cannot even print
]


@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_hostile_text_in_verdicts_reaches_parquet_and_the_feedback_prompt(tmp_path, level):
    """A program's output or error text with lone surrogates or undecodable bytes: the grading stage's table still
    writes to Parquet (it raised before) and the refine prompt's T+ feedback still encodes, at both levels."""
    from mars2.sandbox import GradeJob, grade_many, probe_isolation
    from mars2.search.prompts import result_summary

    if level == "bwrap" and not probe_isolation().get("bwrap"):
        pytest.skip("bubblewrap cannot run here")

    problems, _ = load_problems(toy_benchmark(1, seed=0), source="toy")
    pid = problems[0].id
    rows = pd.DataFrame({"problem_id": [pid] * len(HOSTILE_TEXT), "node_id": range(len(HOSTILE_TEXT)),
                         "agent": ["a"] * len(HOSTILE_TEXT), "code": HOSTILE_TEXT})
    grading = GradingConfig(workers=1, isolation=level)
    verdicts = hidden_test_verdicts(rows, {pid: problems[0]}, grading)
    assert set(verdicts["status"]) <= {"RE", "WA"} and "\\udcff" in verdicts["detail"][0]
    write_parquet(tmp_path / "verdicts.parquet", verdicts)
    assert pd.read_parquet(tmp_path / "verdicts.parquet")["detail"].tolist() == verdicts["detail"].tolist()
    for v in grade_many([GradeJob(code, problems[0].public_tests) for code in HOSTILE_TEXT], grading=grading):
        for text in (v.detail, *(t.detail for t in v.tests), result_summary(v.status, v.passed, v.total, v.detail,
                                                                             detailed=True)):
            text.encode("utf-8")
