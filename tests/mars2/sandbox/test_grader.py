"""Behaviour of the sandboxed grader (mars2.sandbox): verdicts, comparison, parity modes, pool, CLI.

Attacks are in tests/mars2/sandbox/test_isolation_attacks.py; the LiveCodeBench v5 / O1-mini check in
tests/mars2/sandbox/test_lcb_reference.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mars2.config import GradingConfig
from mars2.data.schema import TestCase as Case
from mars2.sandbox import (
    GradeJob,
    Limits,
    SandboxPool,
    TestDataError,
    TestRun,
    Verdict,
    grade_many,
    grade_program,
    isolation_params,
    probe_isolation,
)
from mars2.sandbox.matching import Opaque, decode_value, stdout_matches
from tests.paths import ROOT

pytestmark = pytest.mark.timeout(120)

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
ADD_TESTS = [Case("1 2\n", "3"), Case("10 -4\n", "6"), Case("0 0", "0\n")]


def stdin_case(output: str, inp: str = "") -> Case:
    return Case(inp, output, "stdin")


def fn_case(inp: str, output: str) -> Case:
    return Case(inp, output, "functional")


def both(code, tests, func_name=None, **settings) -> tuple[Verdict, Verdict]:
    """The verdicts in both parity modes; ``settings``: GradingConfig fields."""
    return tuple(grade_program(code, tests, func_name=func_name, grading=GradingConfig(parity=parity, **settings))
                 for parity in ("script", "lcb"))


# --- stdin programs: verdicts and comparison ------------------------------------------------------


def test_correct_stdin_program_is_accepted_in_both_modes():
    for v in both(ADD, ADD_TESTS):
        assert (v.status, v.passed, v.total, v.detail) == ("AC", 3, 3, "")
        assert v.all_passed and v.time_s > 0


def test_wrong_answer_reports_the_first_failure_with_detail_and_runs_on():
    v = grade_program("a, b = map(int, input().split())\nprint(a * b)\n", ADD_TESTS)
    assert v.status == "WA" and not v.all_passed
    assert (v.passed, v.total) == (1, 3) and [t.status for t in v.tests] == ["WA", "WA", "AC"]
    assert "test 1/3" in v.detail and "line 1 differs" in v.detail
    assert "input: '1 2\\n'" in v.detail and "expected: '3'" in v.detail and "got: '2\\n'" in v.detail


def test_wrong_answer_detail_is_truncated():
    v = grade_program("print('x' * 5000)", [stdin_case("y")])
    assert v.status == "WA" and "(truncated)" in v.detail and len(v.detail) < 800


def test_later_failure_counts_earlier_passes_and_stop_option():
    tests = [Case("1 1", "2"), Case("2 2", "4"), Case("3 3", "7"), Case("4 4", "8")]
    v = grade_program(ADD, tests)  # the reward setting: a wrong answer does not stop the program
    assert (v.status, v.passed, v.total) == ("WA", 3, 4) and "test 3/4" in v.detail
    assert [t.status for t in v.tests] == ["AC", "AC", "WA", "AC"]
    g = grade_program(ADD, [Case("1 1", "2"), Case("3 3", "7"), Case("4 4", "9"), Case("5 5", "10")],
                      grading=GradingConfig(stop_at_visible_failure=False))
    assert (g.status, g.passed) == ("WA", 2) and "test 2/4" in g.detail
    assert [t.status for t in g.tests] == ["AC", "WA", "WA", "AC"]


@pytest.mark.parametrize(
    "printed, expected, ok",
    [
        ("1.0", "1.00", True),
        ("1.0 2", "1.00 2.000", True),
        ("1e2", "100", True),
        ("1", "2", False),
        ("0.1", "0.1000000001", False),
        ("1 2", "1 2 3", False),
        ("abc", "abc ", True),
        ("abc", "abd", False),
    ],
)
def test_line_comparison_is_decimal_aware(printed, expected, ok):
    assert stdout_matches(printed + "\n", expected)[0] is ok


def test_line_count_and_blank_lines():
    assert grade_program("print(1)\nprint(2)", [stdin_case("1\n2\n3")]).detail.count("2 lines, expected 3") == 1
    code = "print()\nprint('1 2   ')\nprint('  3\\t')\nprint()\nprint()"
    assert grade_program(code, [stdin_case("1 2\n3")]).all_passed


def test_main_guard_exit_calls_and_buffer_reads_work_as_a_script():
    code = textwrap.dedent(
        """
        import sys
        def solve():
            first = sys.stdin.buffer.readline()
            second = sys.stdin.buffer.readline()
            rest = sys.stdin.buffer.read().split()
            print(int(first) + int(second) + sum(map(int, rest)))
            sys.exit(0)
            print("unreachable")

        if __name__ == "__main__":
            solve()
        """
    )
    v = grade_program(code, [stdin_case("15", "5\n1\n2 3 4\n")])
    assert v.all_passed, v


@pytest.mark.parametrize("ending", ["sys.exit()", "sys.exit(3)", "exit()", "quit()", "raise SystemExit"])
def test_exit_calls_end_the_program_normally(ending):
    code = f"import sys\nprint(int(input()) + 1)\n{ending}\nprint('unreachable')\n"
    assert grade_program(code, [stdin_case("6", "5")]).all_passed


def test_preamble_names_and_big_ints_available_as_in_lcb():
    code = "print(gcd(12, 18), math.comb(4, 2), sorted(Counter('aab').values()), len(str(10 ** 20000)))"
    for v in both(code, [stdin_case("6 6 [1, 2] 20001")]):
        assert v.all_passed, v


def test_big_stack_thread_and_atexit_idioms():
    code = textwrap.dedent(
        """
        import atexit, io, sys, threading
        buf = io.StringIO()
        atexit.register(lambda: sys.__stdout__.write(buf.getvalue()))

        def main():
            def depth(n):
                return 0 if n == 0 else 1 + depth(n - 1)
            buf.write(str(depth(20000)) + "\\n")

        threading.stack_size(1 << 26)
        threading.Thread(target=main).start()
        """
    )
    assert grade_program(code, [stdin_case("20000")]).all_passed


# --- parity: script mode vs LiveCodeBench's quirks -------------------------------------------------


QUIRKS = {
    # LiveCodeBench wraps a stdin program in a function: a top-level variable used with `global` is not global
    "global": ("count = 0\ndef bump():\n    global count\n    count += 1\nbump()\nprint(count)\n", "1"),
    # its mocked sys.stdin.buffer.readline() always returns the first line
    "buffer_readline": ("import sys\na = sys.stdin.buffer.readline()\nb = sys.stdin.buffer.readline()\n"
                        "print(int(a) + int(b))\n", "3"),
    # its mocked sys.stdin.read() returns the whole input even after readline()
    "readline_then_read": ("import sys\nn = int(sys.stdin.readline())\nprint(sum(map(int, sys.stdin.read().split())))\n",
                           "2"),
    # its mocked stdin is not iterable
    "iterate_stdin": ("import sys\nprint(sum(int(x) for x in sys.stdin))\n", "3"),
    # quit is None under its reliability_guard
    "quit": ("print(3)\nquit()\n", "3"),
    # sys.stdout is a StringIO without .buffer
    "stdout_buffer": ("import sys\nsys.stdout.buffer.write(b'3\\n')\n", "3"),
    # the __main__ guard is honoured only as the last statement
    "main_guard_not_last": ("def f():\n    print(3)\nif __name__ == '__main__':\n    f()\nx = 1\n", "3"),
}


@pytest.mark.parametrize("name", sorted(QUIRKS))
def test_script_mode_runs_real_scripts_where_lcb_mode_reproduces_the_quirk(name):
    code, expected = QUIRKS[name]
    script, lcb = both(code, [stdin_case(expected, "1\n2\n")])
    assert script.all_passed, script
    assert not lcb.all_passed, lcb


def test_lcb_mode_shares_one_solution_instance_across_tests():
    code = textwrap.dedent(
        """
        class Solution:
            def __init__(self):
                self.calls = 0
            def f(self, x):
                self.calls += 1
                return x * self.calls
        """
    )
    tests = [fn_case("1", "1"), fn_case("1", "1")]
    script, lcb = both(code, tests, func_name="f")
    assert script.all_passed  # every test in a fresh process
    assert (lcb.status, lcb.passed) == ("WA", 1)  # LiveCodeBench's process keeps the instance


def test_lcb_mode_fails_on_a_blank_functional_line_script_mode_skips_it():
    tests = [fn_case("1\n\n2", "3")]
    script, lcb = both("def f(a, b):\n    return a + b\n", tests, func_name="f")
    assert script.all_passed and lcb.status == "RE" and "blank line" in lcb.detail



OPEN_READERS = {
    "read": "print(open(0).read().split())",
    "readline_twice": "f = open(0)\nprint(f.readline(), f.readline())",
    "readlines": "print(open(0).readlines())",
    "iterate": "print([line for line in open(0)])",
    "with_and_next": "with open(0) as f:\n    print(next(f), f.read())",
    "open_twice": "print(open(0).readline(), open(0).readline(), open.call_count)",
    "calls_seen": "open('x', 'r').read()\nprint(open.call_args, open().read.call_count)",
}


def test_grader_and_zygote_frames_round_trip():
    """pool.py buffers frames (take_frame) that the zygote writes (write_frame), and the reverse: one definition."""
    import os

    from mars2.sandbox.runner.wire import FRAME, MAX_HEADER, encode_frame, read_frame, take_frame, write_frame

    r, w = os.pipe()
    try:
        write_frame(w, {"op": "result", "status": "ok"}, b"3\n")
        write_frame(w, {"op": "pong"})
        data = bytearray(os.read(r, 1 << 16))
        first = len(encode_frame({"op": "result", "status": "ok"}, b"3\n"))
        assert take_frame(bytearray(data[:first - 1])) is None  # a partial frame waits for more
        assert take_frame(data) == ({"op": "result", "status": "ok"}, b"3\n")
        assert take_frame(data) == ({"op": "pong"}, b"") and data == bytearray()
        os.write(w, encode_frame({"op": "test", "index": 1}, "é".encode()))
        assert read_frame(r) == ({"op": "test", "index": 1}, "é".encode())
        os.write(w, FRAME.pack(MAX_HEADER + 1, 0))
        with pytest.raises(ValueError, match="oversized"):
            read_frame(r)
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("name", sorted(OPEN_READERS))
def test_premade_open_mock_acts_as_a_fresh_mock_open(name):
    """parity=lcb serves LiveCodeBench's per-test mock_open() from ones made ahead in the zygote: a
    program reading through ``open`` must see exactly what LiveCodeBench's fresh one gives it (trusted
    code, run in-process on purpose: this checks the mock, not the sandbox)."""
    from unittest.mock import mock_open

    from mars2.sandbox import lcb_reference as lcb
    from mars2.sandbox.runner.lcb_parity import premade_open_mock

    code = compile(OPEN_READERS[name], name, "exec")
    inputs = "3 4\nfive six\n\nseven"
    premade = mock_open()
    mock_open()  # another one made in between must not share its state
    seen = []
    for open_mock in (None, premade_open_mock(premade, inputs)):
        with lcb.Capturing() as out:
            lcb.call_method(lambda: exec(code, {}), inputs, open_mock)
        seen.append(out[0])
    assert seen[0] == seen[1] and seen[0].strip()



def test_lcb_mode_fails_where_livecodebench_does_when_a_program_breaks_what_its_mock_open_needs():
    """The premade mock_open() is turned into the test's one inside the test process; when the program broke
    what that needs (here io.StringIO, in its first test), the next test must fail as in LiveCodeBench (where
    mock_open() raises inside the test), not be retried in a fresh process and pass."""
    from mars2.sandbox import lcb_reference as lcb

    code = "import io\nx = input()\nprint(x)\nio.StringIO = None\n"
    tests = [stdin_case("1", "1\n"), stdin_case("2", "2\n"), stdin_case("3", "3\n")]
    [(reference, _)] = lcb.evaluate_generations([lcb.lcb_sample(tests, None)], [code], num_process_evaluate=1)
    ours = grade_program(code, tests, grading=GradingConfig(parity="lcb"))
    assert reference == [True, -4]
    assert (ours.status, ours.passed) == ("RE", 1), ours


@pytest.mark.parametrize("memory_mb", [124, 128, 132, 160])
def test_lcb_mode_gives_a_verdict_when_the_input_fills_memory_before_the_program_starts(memory_mb):
    """A 20 MB input near the memory cap: making the test's mock_open() may itself run out of memory. That is the
    test's failure (as in LiveCodeBench, where it happens inside the test), never a sandbox fault."""
    tests = [stdin_case("20000000", "1 " * 10_000_000 + "\n")]
    verdict = grade_program("print(len(input()))\n", tests, grading=GradingConfig(parity="lcb", memory_mb=memory_mb))
    assert verdict.status in ("AC", "MLE", "RE"), verdict

def test_lcb_mode_serves_more_tests_than_premade_open_mocks():
    from mars2.sandbox.runner.lcb_parity import PREMADE_OPEN_MOCKS

    tests = [stdin_case(f"{i} {i}", f"{i}\n") for i in range(PREMADE_OPEN_MOCKS + 4)]
    # LiveCodeBench patches builtins.open (its preamble binds the program's own `open` to the real one)
    verdict = grade_program("import builtins\nx = builtins.open(0).read().strip()\nprint(x, x)\n", tests,
                            grading=GradingConfig(parity="lcb", stop_at_visible_failure=False))
    assert (verdict.status, verdict.passed) == ("AC", len(tests)), verdict

# --- failures other than wrong answers -------------------------------------------------------------


def test_runtime_error_reports_the_traceback_tail():
    code = "def f(x):\n    return 1 // x\n\nprint(f(int(input())))\n"
    v = grade_program(code, [Case("1", "1"), Case("0", "0")])
    assert (v.status, v.passed) == ("RE", 1)
    assert "ZeroDivisionError" in v.detail and 'File "solution.py", line 2' in v.detail
    assert "mars2" not in v.detail and "_entry" not in v.detail


def test_exception_in_a_thread_does_not_fail_a_correct_output():
    # as for a real script (exit status 0) and for LiveCodeBench (it never sees thread exceptions)
    code = "import threading\nt = threading.Thread(target=lambda: 1 / 0)\nt.start(); t.join()\nprint(1)"
    assert grade_program(code, [stdin_case("1")]).all_passed


def test_syntax_error_is_a_compile_error_and_stops_grading():
    for v in both("print(1 +", ADD_TESTS, stop_at_visible_failure=False):
        assert (v.status, v.passed, v.total) == ("CE", 0, 3)
        assert "SyntaxError" in v.detail


@pytest.mark.parametrize("code", [None, "", "   \n\t"])
def test_missing_code(code):
    v = grade_program(code, ADD_TESTS)
    assert (v.status, v.passed, v.total, v.all_passed) == ("NO_CODE", 0, 3, False)


def test_no_tests_is_never_a_pass():
    for v in both(ADD, []):
        assert (v.status, v.passed, v.total, v.all_passed) == ("NO_TESTS", 0, 0, False)
    assert not Verdict("AC", 0, 0, 0.0).all_passed


def test_time_limit_is_cpu_time_and_wall_clock_catches_sleepers():
    v = grade_program("while True:\n    pass\n", ADD_TESTS, grading=GradingConfig(time_limit_s=0.5))
    assert (v.status, v.passed) == ("TLE", 0) and "CPU time limit" in v.detail
    v = grade_program("import time\ntime.sleep(30)\n", ADD_TESTS, grading=GradingConfig(time_limit_s=0.5))
    assert v.status == "TLE" and "wall-clock" in v.detail and v.time_s < 5


def test_rlimits_are_applied_in_the_child():
    code = textwrap.dedent(
        """
        import resource as r
        print(r.getrlimit(r.RLIMIT_CPU)[0], r.getrlimit(r.RLIMIT_FSIZE)[0], r.getrlimit(r.RLIMIT_CORE)[0],
              r.getrlimit(r.RLIMIT_NOFILE)[0], r.getrlimit(r.RLIMIT_AS)[0] >= 300 << 20,
              r.getrlimit(r.RLIMIT_AS)[0] < (300 + 256) << 20)
        """
    )  # the address-space cap is the allowance plus what the zygote maps (numpy's too, once it served parity=lcb)
    v = grade_program(code, [stdin_case(f"3 {16 << 20} 0 256 True True")],
                      grading=GradingConfig(time_limit_s=2.5, memory_mb=300))
    assert v.all_passed, v


def test_memory_hog_is_stopped_and_the_grader_survives():
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(10 ** 7))\n"
    v = grade_program(code, [stdin_case("")], grading=GradingConfig(memory_mb=256))
    assert v.status in ("MLE", "RE")
    if v.status == "MLE":
        assert "256 MiB" in v.detail
    assert grade_program(ADD, ADD_TESTS).all_passed


def test_huge_output_is_capped():
    code = "import sys\nline = 'x' * 1023 + '\\n'\nwhile True:\n    sys.stdout.write(line)\n"
    v = grade_program(code, [stdin_case("x")], grading=GradingConfig(time_limit_s=5))
    assert v.status == "RE" and "output limit" in v.detail


# --- functional (LeetCode-style) programs -----------------------------------------------------------


TWO_SUM = textwrap.dedent(
    """
    class Solution:
        def twoSum(self, nums: List[int], target: int) -> Tuple[int, int]:
            seen = {}
            for i, x in enumerate(nums):
                if target - x in seen:
                    return (seen[target - x], i)
                seen[x] = i
            return ()

    if __name__ == "__main__":
        print(input())
    """
)


def test_functional_solution_with_tuple_return_is_compared_as_list():
    tests = [fn_case("[2, 7, 11, 15]\n9", "[0, 1]"), fn_case("[3, 2, 4]\n6", "[1, 2]")]
    for v in both(TWO_SUM, tests, func_name="twoSum"):
        assert v.all_passed and v.passed == 2


@pytest.mark.parametrize(
    "ret, expected, ok",
    [
        ("[(i, i) for i in range(2)]", "[[0, 0], [1, 1]]", False),  # nested tuples stay tuples, as in LCB
        ("[[i, i] for i in range(2)]", "[[0, 0], [1, 1]]", True),
        ("True", "1", True),  # Python's == , as in LCB
        ("2.0", "2", True),
        ("{'a': 1}", '{"a": 1}', True),
        ("{1: 2}", '{"1": 2}', False),
        ("{1, 2}", "[1, 2]", False),
        ("10 ** 30", "1000000000000000000000000000000", True),
        ("__import__('decimal').Decimal('1.5')", "1.5", True),
        ("__import__('fractions').Fraction(1, 2)", "0.5", True),
        ("float('nan')", "0", False),
    ],
)
def test_functional_equality_follows_python_eq_like_lcb(ret, expected, ok):
    code = f"class Solution:\n    def f(self, x):\n        return {ret}\n"
    for v in both(code, [fn_case("1", expected)], func_name="f"):
        assert v.all_passed is ok, v


def test_functional_values_faking_equality_are_wrong():
    code = textwrap.dedent(
        """
        class Eq:
            def __eq__(self, other):
                return True
        class MyList(list):
            def __eq__(self, other):
                return True
        class Solution:
            def f(self, x):
                return [Eq(), MyList([9])][x]
        """
    )
    for v in both(code, [fn_case("0", "[1, 2]"), fn_case("1", "[1, 2]")], func_name="f", stop_at_visible_failure=False):
        assert (v.status, v.passed) == ("WA", 0), v


def test_functional_top_level_function_and_json_types():
    code = "def merge(a, b):\n    return {'sum': a['x'] + b, 'ok': True, 'f': 0.5, 'none': None}\n"
    v = grade_program(code, [fn_case('{"x": 1}\n2', '{"sum": 3, "ok": true, "f": 0.5, "none": null}')],
                      func_name="merge")
    assert v.all_passed


def test_functional_missing_method_and_exceptions():
    v = grade_program("class Solution:\n    def g(self, x):\n        return x\n", [fn_case("1", "1")], func_name="f")
    assert v.status == "RE" and "no method 'f'" in v.detail
    v = grade_program("class Solution:\n    def f(self, x):\n        return [][x]\n", [fn_case("1", "1")],
                      func_name="f")
    assert v.status == "RE" and "IndexError" in v.detail


def test_functional_test_data_errors_are_raised():
    with pytest.raises(TestDataError):
        grade_program("def f(x):\n    return x\n", [fn_case("not json", "1")], func_name="f")
    with pytest.raises(TestDataError):
        grade_program("def f(x):\n    return x\n", [fn_case("1", "1")])
    with pytest.raises(TestDataError):
        grade_many([GradeJob(ADD, tuple(ADD_TESTS)), GradeJob("x", (fn_case("{", "1"),), "f")])


def test_decode_value_rejects_junk_from_a_program():
    assert decode_value(b'{"$tuple": [1, {"$int": "0x10"}]}') == (1, 16)
    assert isinstance(decode_value(b'{"$other": "set"}'), Opaque)
    assert isinstance(decode_value(b'{"$dict": [[[1], 2]]}'), Opaque)  # keys that are not text equal nothing
    for junk in (b"{", b'{"a": 1, "b": 2}', b'{"$dict": [["a"]]}', b'{"$nope": 1}', b"9" * 5000):
        with pytest.raises(ValueError):
            decode_value(junk)


# --- grade_many, pool, Verdict ----------------------------------------------------------------------


def test_grade_many_refuses_bad_limits_before_grading_anything():
    """A limit out of range is refused once, up front, even for a batch with no program to run."""
    with pytest.raises(ValueError, match="time"):
        grade_many([GradeJob(None, (stdin_case("1", "1"),))], grading=GradingConfig(time_limit_s=0))


def test_grade_many_preserves_order_across_verdicts():
    jobs = [
        GradeJob("while True:\n    pass\n", (stdin_case("1"),)),
        GradeJob(ADD, tuple(ADD_TESTS)),
        GradeJob("print(0)", tuple(ADD_TESTS)),
        GradeJob("1 / 0", (stdin_case("1"),)),
        GradeJob(None, (stdin_case("1"),)),
        GradeJob("def (", (stdin_case("1"),)),
        GradeJob(TWO_SUM, (fn_case("[1, 2]\n3", "[0, 1]"),), func_name="twoSum"),
        GradeJob(ADD, ()),
    ]
    verdicts = grade_many(jobs, grading=GradingConfig(workers=2, time_limit_s=0.5))
    assert [v.status for v in verdicts] == ["TLE", "AC", "WA", "RE", "NO_CODE", "CE", "AC", "NO_TESTS"]
    assert [v.total for v in verdicts] == [1, 3, 3, 1, 1, 1, 1, 0]
    told = []
    detailed = grade_many(jobs[:3], grading=GradingConfig(workers=2, time_limit_s=0.5, stop_at_visible_failure=False),
                          progress=lambda done, total: told.append((done, total)))
    assert [len(g.tests) for g in detailed] == [1, 3, 3]
    assert told == [(1, 3), (2, 3), (3, 3)]  # a caller's display is told after each program
    told.clear()  # responses with no program are answered at once, and counted like the rest
    mixed = grade_many(jobs[3:6], grading=GradingConfig(workers=2, time_limit_s=0.5), progress=lambda d,
                       t: told.append((d, t)))
    assert [g.status for g in mixed] == ["RE", "NO_CODE", "CE"] and told == [(1, 3), (2, 3), (3, 3)]
    assert [v.status for v in grade_many([GradeJob("  ", (stdin_case("1"),)), GradeJob(None, ())])] == ["NO_CODE",
                                         "NO_TESTS"]


def test_verdict_dict_round_trip():
    v = grade_program(ADD, ADD_TESTS[:1])
    d = v.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d) == {"status", "passed", "total", "time_s", "detail"}
    assert Verdict.from_dict(d) == v
    with pytest.raises(ValueError):
        Verdict("OK", 0, 0, 0.0)


def test_limits_validation_and_wall_default():
    assert Limits(time_s=2).wall == 5
    for bad in ({"time_s": 0}, {"memory_mb": 0}, {"output_bytes": 0}, {"wall_s": -1}):
        with pytest.raises(ValueError):
            Limits(**bad)


def test_probe_reports_the_chosen_level_and_params():
    probe = probe_isolation()
    assert probe["level"] in ("bwrap", "process")
    assert {"root", "bwrap", "seccomp", "landlock_abi", "cgroup", "level"} <= set(probe)
    params = isolation_params()
    assert params["sandbox.isolation"] == probe["level"]
    assert all(k.startswith("sandbox.") and isinstance(v, str) for k, v in params.items())
    with pytest.raises(ValueError):
        isolation_params("chroot")


def test_process_level_works_and_confines(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("EXPECTED")
    secret.chmod(0o644)
    pool = SandboxPool(1, "process")
    try:
        assert pool.level == "process"
        assert grade_program(ADD, ADD_TESTS, pool=pool).all_passed
        assert grade_program(ADD, ADD_TESTS, grading=GradingConfig(parity="lcb"), pool=pool).all_passed
        leak = f"print(open({str(secret)!r}).read())"
        if probe_isolation()["landlock_abi"]:
            assert grade_program(leak, [stdin_case("EXPECTED")], pool=pool).status == "RE"
        if probe_isolation()["seccomp"]:
            code = "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)\nprint('net')"
            assert grade_program(code, [stdin_case("net")], pool=pool).status == "RE"
    finally:
        pool.close()



def test_the_zygote_loads_livecodebench_harness_only_when_a_parity_lcb_program_comes():
    """A zygote serving script programs stays lean (fewer pages to copy per fork); the first parity=lcb
    program loads LiveCodeBench's harness, unittest.mock and numpy, as LiveCodeBench's process has them."""
    show = "import sys\nprint('unittest.mock' in sys.modules, 'numpy' in sys.modules)\n"
    pool = SandboxPool(1)
    try:
        script_before = grade_program(show, [stdin_case("False False")], pool=pool)
        lcb = grade_program(show, [stdin_case("True True")], grading=GradingConfig(parity="lcb"), pool=pool)
        script_after = grade_program(show, [stdin_case("True True")], pool=pool)
    finally:
        pool.close()
    assert script_before.all_passed, script_before
    assert lcb.all_passed, lcb
    assert script_after.all_passed, script_after

def test_pool_restarts_a_dead_slot():
    pool = SandboxPool(1)
    try:
        assert grade_program(ADD, ADD_TESTS, pool=pool).all_passed
        slot = pool.slots[0]
        slot.proc.kill()
        slot.proc.wait()
        assert grade_program(ADD, ADD_TESTS, pool=pool).all_passed
        assert slot.starts == 2
    finally:
        pool.close()
    assert slot.proc is None


# --- command line -----------------------------------------------------------------------------------


def _problem_row(qid: str, tests: list[Case], func_name: str | None = None) -> dict[str, str]:
    return {"question_id": qid, "question_title": qid, "question_content": f"problem {qid}", "platform": "atcoder",
            "contest_id": "c", "contest_date": "2024-01-01T00:00:00", "starter_code": "", "difficulty": "easy",
            "public_test_cases": json.dumps([{"input": t.input, "output": t.output, "testtype": t.testtype}
                                             for t in tests]),
            "private_test_cases": json.dumps([{"input": "5 5\n", "output": "10\n", "testtype": "stdin"}]),
            "metadata": json.dumps({"func_name": func_name} if func_name else {})}


def test_cli_grades_rows_and_reports_bad_ones(tmp_path):
    problems = tmp_path / "p.jsonl"
    samples = tmp_path / "s.jsonl"
    out = tmp_path / "o.jsonl"
    problems.write_text(json.dumps(_problem_row("add", ADD_TESTS)) + "\n{not json\n")
    response = f"Sure:\n```python\nprint('draft')\n```\nFinal:\n```python\n{ADD}```\n"
    samples.write_text("\n".join([
        json.dumps({"question_id": "add", "code": response}),
        json.dumps({"question_id": "add", "code": "print(0)"}),
        "[1, 2",
        json.dumps({"question_id": "missing", "code": ADD}),
        json.dumps({"question_id": "add"}),
    ]) + "\n")
    cmd = [sys.executable, "-m", "mars2.sandbox", "--problems", str(problems), "--samples", str(samples),
           "--tests", "all", "--out", str(out), "--workers", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "rejected" in proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question_id"] for r in rows] == ["add", "add", None, "missing", "add"]
    assert [r["passed"] for r in rows] == [True, False, False, False, False]
    assert rows[0]["total_tests"] == 4 and len(rows[0]["verdicts"]) == 4
    assert rows[1]["status"] == "WA" and len(rows[1]["verdicts"]) == 4  # diagnostics: every test runs
    assert all("error" in r for r in rows[2:])

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question_id": "add", "code": ADD}) + "\n")
    cmd = cmd[:cmd.index("--samples") + 1] + [str(good)] + cmd[cmd.index("--samples") + 2:]
    problems.write_text(json.dumps(_problem_row("add", ADD_TESTS)) + "\n")
    proc = subprocess.run(cmd + ["--tests", "private", "--parity", "lcb"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["total_tests"] == 1

    proc = subprocess.run(cmd[:4] + [str(tmp_path / "nope.jsonl")] + cmd[5:], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "nope.jsonl" in proc.stderr


def test_lcb_code_extraction():
    from mars2.sandbox.cli import extract_code_lcb, sample_code

    assert extract_code_lcb("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```\n") == "y = 2"
    assert extract_code_lcb("```python\nunclosed") == ""
    assert sample_code("print(1)") == "print(1)"


def test_grading_config_fields_are_validated():
    from mars2.config import ConfigError, GradingConfig, RunConfig, validate

    g = GradingConfig()
    assert (g.isolation, g.parity, g.stop_at_visible_failure) == ("auto", "script", True)
    for field, bad in (("isolation", "docker"), ("parity", "apps"), ("workers", -1)):
        cfg = RunConfig()
        setattr(cfg.grading, field, bad)
        with pytest.raises(ConfigError):
            validate(cfg, cuda_available=False)


def test_tests_of_one_program_are_independent():
    """One process serves a program's tests (script mode), but each test starts from a clean state."""
    code = textwrap.dedent(
        """
        import builtins, os, random, sys, signal, decimal
        seen = [hasattr(builtins, "leak"), os.path.exists("note.txt"), os.environ.get("LEAK"),
                sys.getrecursionlimit(), decimal.getcontext().prec, random.random() < 2, len(os.listdir("."))]
        print(*seen)
        builtins.leak = 1
        open("note.txt", "w").write("x")
        os.environ["LEAK"] = "1"
        sys.setrecursionlimit(123456)
        decimal.getcontext().prec = 5
        sys.stdout.flush()
        os.close(0)
        os.close(2)
        signal.signal(signal.SIGALRM, lambda *a: None)
        """
    )
    expected = "False False None 50000 28 True 0"
    for isolate in (False, True):
        g = grade_program(code, [stdin_case(expected)] * 4, isolate_tests=isolate)
        assert g.all_passed and g.passed == 4, g


def test_a_crash_or_a_leftover_thread_gives_the_next_test_a_fresh_process():
    code = textwrap.dedent(
        """
        import os, threading, time, sys
        n = int(input())
        if n == 1:
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        if n == 2:
            os._exit(0)
        if n == 3:
            sys.setrecursionlimit(10 ** 6)
            def f(k):
                return f(k + 1)
            f(0)
        print(n, threading.active_count())
        """
    )
    tests = [stdin_case("1 2", "1"), stdin_case("0 1", "0"), stdin_case("2", "2"), stdin_case("0 1", "0"),
             stdin_case("3", "3"), stdin_case("0 1", "0")]
    g = grade_program(code, tests, grading=GradingConfig(stop_at_visible_failure=False))
    assert [t.status for t in g.tests] == ["AC", "AC", "RE", "AC", "RE", "AC"], g.tests


def test_many_large_fractions_in_one_value_cannot_make_the_grader_spend_minutes():
    """800 fractions of ~20,000 hex digits each, every one under the per-fraction cap: normalising them all took the
    grader ~3 s of CPU per test (13x the program's own). The digits of one value share one budget: past it a
    fraction is opaque (equal to nothing), and decoding stays fast."""
    import json
    import time as _time
    from fractions import Fraction

    from mars2.sandbox.matching import MAX_FRACTION_HEX_DIGITS, Opaque, decode_value

    big = ["%x" % (int.from_bytes(bytes([7] * 4999), "big") | 1), "%x" % (int.from_bytes(bytes([5] * 4999), "big") | 1)]
    assert len(big[0]) + len(big[1]) < MAX_FRACTION_HEX_DIGITS
    encoded = json.dumps([{"$fraction": big}] * 800).encode()
    started = _time.process_time()
    value = decode_value(encoded)
    assert _time.process_time() - started < 1.0
    assert isinstance(value[0], Fraction) and isinstance(value[-1], Opaque)
    small = decode_value(json.dumps([{"$fraction": ["1", "2"]}] * 1000).encode())  # small ones all decode
    assert small == [Fraction(1, 2)] * 1000


@pytest.mark.parametrize("reaped", [False, True])
def test_a_judge_process_that_died_is_started_again_with_the_programs_tests(reaped):
    """Judging happens in a judge process (mars2.sandbox.judging); one killed mid-program is started again, given the
    program's tests again, and the next judgment is right."""
    import signal

    from mars2.sandbox.pool import Judge

    judge = Judge()
    try:
        judge.load([{"input": "1 2\n", "output": "3", "mode": "stdin"}], 256)
        assert judge.judge(0, TestRun("ok", b"3\n")) == ("AC", "")
        os.kill(judge.proc.pid, signal.SIGKILL)
        if reaped:
            judge.proc.wait()
        status, detail = judge.judge(0, TestRun("ok", b"4\n"))
        assert status == "WA" and "expected: '3'" in detail, detail
    finally:
        judge.close()


def test_outputs_waiting_for_judgment_are_bounded_in_memory_and_on_disk(monkeypatch):
    """A slot never waits for the judges until the outputs waiting for them fill the memory budget and then the
    disk budget: the disk budget makes the next output wait until a judgment takes one back, and what an abandoned
    batch never judged is given back in full (the pool's budgets outlive one call)."""
    import queue
    import threading

    from mars2.sandbox import pool as pool_module

    monkeypatch.setattr(pool_module, "HELD_BYTES", 10)
    monkeypatch.setattr(pool_module, "SPOOL_BYTES", 20)
    held = pool_module.HeldOutputs()
    in_memory, on_disk = held.put(b"m" * 8), held.put(b"d" * 15)
    assert isinstance(in_memory, bytes) and not isinstance(on_disk, bytes)
    waiting: list = []
    third = threading.Thread(target=lambda: waiting.append(held.put(b"w" * 10)), daemon=True)
    third.start()
    third.join(0.3)
    assert third.is_alive()  # 15 + 10 bytes would pass the disk budget of 20
    assert held.take(on_disk) == b"d" * 15
    third.join(5)
    assert not third.is_alive() and held.on_disk == 10
    abandoned: queue.SimpleQueue = queue.SimpleQueue()
    abandoned.put((0, pool_module.TestRun("ok", waiting[0])))
    abandoned.put((1, pool_module.TestRun("ok", in_memory)))
    abandoned.put(None)
    held.drop(abandoned)
    assert (held.in_memory, held.on_disk) == (0, 0)
