"""The grader against LiveCodeBench itself: O1-mini's officially graded v5 solutions, and LCB's own harness.

Needs the shared LCB v5 copy (``../shared/data/lcb_v5_public`` or ``$MARS2_SHARED_DATA``); skipped without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mars2.config import GradingConfig
from mars2.data import problem_from_lcb_row, read_jsonl_rows
from mars2.sandbox import GradeJob, SandboxPool, grade_many
from mars2.sandbox import lcb_reference as lcb
from tests.paths import SHARED

# programs whose verdict depends on LiveCodeBench's harness quirks (script mode passes them, LCB fails them)
QUIRK_PROGRAMS = ("abc303_d", "abc315_b", "abc338_d", "abc344_b", "abc349_a", "abc359_b", "abc359_d", "abc365_b",
                  "abc368_f", "abc380_c", "abc382_c")
# official failures that pass the public tests through an LCB-faithful grader
LCB_FAITHFUL_FALSE_PASSES = 86
# official passes near LiveCodeBench's 6 s limit run over it on a slower (or busier) machine: such a program may only
# time out, must pass with this much more CPU time, and only this many may do so
SLOW_MACHINE_TIME_FACTOR = 4
SLOW_MACHINE_TIMEOUTS_ALLOWED = 3


def _data_dir() -> Path | None:
    candidates = []
    if os.environ.get("MARS2_SHARED_DATA"):
        env = Path(os.environ["MARS2_SHARED_DATA"])
        candidates += [env, env / "lcb_v5_public"]
    candidates.append(SHARED / "data/lcb_v5_public")
    for path in candidates:
        if (path / "problems.jsonl").is_file() and (path / "o1mini_solutions.jsonl").is_file():
            return path
    return None


DATA = _data_dir()
pytestmark = [pytest.mark.skipif(DATA is None, reason="shared LCB v5 data (lcb_v5_public) not available"),
              pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def lcb_v5():
    assert DATA is not None
    problems = {}
    for row in read_jsonl_rows(DATA / "problems.jsonl"):
        p = problem_from_lcb_row(row)
        problems[p.id] = p
    solutions = [json.loads(line) for line in (DATA / "o1mini_solutions.jsonl").read_text().splitlines() if line]
    return problems, solutions


def _jobs(problems, solutions):
    return [GradeJob(s["code"], problems[s["question_id"]].public_tests, problems[s["question_id"]].func_name)
            for s in solutions]


@pytest.mark.slow
def test_o1_mini_official_verdicts_on_public_tests(lcb_v5):
    """All 602 official passes pass; of the 277 official failures no more pass than through an LCB-faithful grader.

    The official verdicts were timed on another machine: an official pass close to the 6 s limit may time out here
    (abc328_e did on a busy CI runner), so a timeout is accepted only if the program passes with more CPU time.
    """
    problems, solutions = lcb_v5
    verdicts = grade_many(_jobs(problems, solutions))
    official_pass = [(s, v) for s, v in zip(solutions, verdicts, strict=True) if s["official_pass"]]
    official_fail = [(s, v) for s, v in zip(solutions, verdicts, strict=True) if not s["official_pass"]]
    assert (len(official_pass), len(official_fail)) == (602, 277)
    failures = [(s["question_id"], v.status, v.detail[:300]) for s, v in official_pass
                if not v.all_passed and v.status != "TLE"]
    assert failures == []
    timed_out = [s for s, v in official_pass if v.status == "TLE"]
    assert len(timed_out) <= SLOW_MACHINE_TIMEOUTS_ALLOWED, [s["question_id"] for s in timed_out]
    regraded = grade_many(_jobs(problems, timed_out),
                          grading=GradingConfig(time_limit_s=6.0 * SLOW_MACHINE_TIME_FACTOR))
    assert [(s["question_id"], v.status) for s, v in zip(timed_out, regraded, strict=True) if not v.all_passed] == []
    false_passes = sum(v.all_passed for _, v in official_fail)
    assert false_passes <= LCB_FAITHFUL_FALSE_PASSES


def test_lcb_parity_agrees_with_lcb_own_harness_on_quirky_and_sample_programs(lcb_v5):
    problems, solutions = lcb_v5
    by_id = {s["question_id"]: s for s in solutions}
    chosen = [by_id[q] for q in QUIRK_PROGRAMS] + [s for s in solutions[::40] if s["question_id"] not in QUIRK_PROGRAMS]
    samples = [lcb.lcb_sample(problems[s["question_id"]].public_tests, problems[s["question_id"]].func_name)
               for s in chosen]
    reference = [lcb.passed(res) for res, _ in lcb.evaluate_generations(samples, [s["code"] for s in chosen],
                                                                         num_process_evaluate=2)]
    pool = SandboxPool(2)
    try:
        ours = [g.all_passed
                for g in grade_many(_jobs(problems, chosen), grading=GradingConfig(parity="lcb"), pool=pool)]
        script = [g.all_passed for g in grade_many(_jobs(problems, chosen[:len(QUIRK_PROGRAMS)]), pool=pool)]
    finally:
        pool.close()
    disagree = [(s["question_id"], r, o) for s, r, o in zip(chosen, reference, ours, strict=True) if r != o]
    assert disagree == []
    # the quirky programs are correct (official pass or correct on the public tests): LCB's harness fails them
    assert not any(reference[:len(QUIRK_PROGRAMS)]) and all(script)
