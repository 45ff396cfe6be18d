"""LiveCodeBench's own grading harness, ported faithfully — the yardstick, **not** a sandbox.

This is a close port of ``lcb_runner/evaluation/testing_util.py`` and
``lcb_runner/evaluation/compute_code_generation_metrics.py`` from LiveCodeBench/LiveCodeBench
(commit 28fef95e, MIT licence, Copyright (c) 2024 LiveCodeBench), kept so that

* ``bench/grader.py`` can measure our grader's throughput against the official harness's
  (one ``multiprocessing.Process`` + one ``multiprocessing.Manager`` per sample, tests run
  sequentially in-process, a pool of such workers), and
* the verdicts of :mod:`mars2.sandbox` can be checked against the official ones, program by program.

Called directly, it runs the programs **in the caller's user account, in-process, with only LiveCodeBench's
``reliability_guard`` monkeypatches** (no memory limit, no namespaces): do so only on trusted programs
(benchmarks, fixtures). The pipeline calls it only from inside the sandbox: with ``grading.parity=lcb`` the
sandbox's runner (``runner/lcb_parity.py``) imports it to execute a program as LiveCodeBench would, within the
sandbox's isolation and limits.

Differences from the original, none of which changes a verdict: the ``debug`` printing is gone,
``sys.set_int_max_str_digits(50000)`` (a module-level side effect of the original
``compute_code_generation_metrics``) is applied in the pool's worker initialiser, results come
back as plain lists, and :func:`call_method` takes an optional ``open_mock``: a ``mock_open()``
already configured with the test's input (the sandbox builds them ahead, see
``runner.lcb_parity.premade_open_mock``; by default one is made here, as in the original).
"""

from __future__ import annotations

import ast
import faulthandler
import json
import multiprocessing
import platform
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from decimal import Decimal
from enum import Enum
from io import StringIO
from types import ModuleType
from typing import Any
from unittest.mock import mock_open, patch

import_string = "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\nimport io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"  # noqa: E501

PASS = True
GLOBAL_TIMEOUT = -1
WRONG_ANSWER = -2
TIME_LIMIT = -3
RUNTIME_ERROR = -4


def truncatefn(s, length=300):
    if not isinstance(s, str):
        s = str(s)
    if len(s) <= length:
        return s
    return s[: length // 2] + "...(truncated) ..." + s[-length // 2:]


class CODE_TYPE(Enum):  # noqa: N801 - LiveCodeBench's name
    call_based = 0
    standard_input = 1


class TimeoutException(Exception):
    pass


def timeout_handler(signum, frame):
    print("timeout occured: alarm went off")
    raise TimeoutException


class Capturing(list):
    def __enter__(self):
        self._stdout = sys.stdout
        sys.stdout = self._stringio = StringIO()
        self._stringio.close = lambda x: 1
        return self

    def __exit__(self, *args):
        self.append(self._stringio.getvalue())
        del self._stringio
        sys.stdout = self._stdout


class MockStdinWithBuffer:
    def __init__(self, inputs: str):
        self.inputs = inputs
        self._stringio = StringIO(inputs)
        self.buffer = MockBuffer(inputs)

    def read(self, *args):
        return self.inputs

    def readline(self, *args):
        return self._stringio.readline(*args)

    def readlines(self, *args):
        return self.inputs.split("\n")

    def __getattr__(self, name):
        return getattr(self._stringio, name)


class MockBuffer:
    def __init__(self, inputs: str):
        self.inputs = inputs.encode("utf-8")

    def read(self, *args):
        return self.inputs

    def readline(self, *args):
        return self.inputs.split(b"\n")[0] + b"\n"


def clean_if_name(code: str) -> str:
    try:
        astree = ast.parse(code)
        last_block = astree.body[-1]
        if isinstance(last_block, ast.If):
            condition = last_block.test
            if ast.unparse(condition).strip() == "__name__ == '__main__'":
                code = ast.unparse(astree.body[:-1]) + "\n" + ast.unparse(last_block.body)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - as the original (a bare except)
        pass
    return code


def make_function(code: str) -> str:
    try:
        import_stmts = []
        all_other_stmts = []
        astree = ast.parse(code)
        for stmt in astree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                import_stmts.append(stmt)
            else:
                all_other_stmts.append(stmt)
        function_ast = ast.FunctionDef(
            name="wrapped_function",
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=all_other_stmts,
            decorator_list=[],
            lineno=-1,
        )
        return import_string + "\n" + ast.unparse(import_stmts) + "\n" + ast.unparse(function_ast)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001
        return code


def call_method(method, inputs, open_mock=None):
    if isinstance(inputs, list):
        inputs = "\n".join(inputs)
    inputs_line_iterator = iter(inputs.split("\n"))
    mock_stdin = MockStdinWithBuffer(inputs)

    @patch("builtins.open", mock_open(read_data=inputs) if open_mock is None else open_mock)
    @patch("sys.stdin", mock_stdin)
    @patch("sys.stdin.readline", lambda *args: next(inputs_line_iterator))
    @patch("sys.stdin.readlines", lambda *args: inputs.split("\n"))
    @patch("sys.stdin.read", lambda *args: inputs)
    def _inner_call_method(_method):
        try:
            return _method()
        except SystemExit:
            pass
        finally:
            pass

    return _inner_call_method(method)


def get_function(compiled_sol, fn_name: str):
    try:
        assert hasattr(compiled_sol, fn_name)
        return getattr(compiled_sol, fn_name)
    except Exception:  # noqa: BLE001
        return


def compile_code(code: str, timeout: int):
    signal.alarm(timeout)
    try:
        tmp_sol = ModuleType("tmp_sol", "")
        exec(code, tmp_sol.__dict__)
        if "class Solution" in code:
            compiled_sol = tmp_sol.Solution()
        else:
            compiled_sol = tmp_sol
        assert compiled_sol is not None
    finally:
        signal.alarm(0)
    return compiled_sol


def convert_line_to_decimals(line: str) -> tuple[bool, list[Decimal]]:
    try:
        decimal_line = [Decimal(elem) for elem in line.split()]
    except Exception:  # noqa: BLE001
        return False, []
    return True, decimal_line


def get_stripped_lines(val: str):
    val = val.strip()
    return [val_line.strip() for val_line in val.split("\n")]


def grade_call_based(code: str, all_inputs: list, all_outputs: list, fn_name: str, timeout: int):
    code = import_string + "\n\n" + code
    compiled_sol = compile_code(code, timeout)
    if compiled_sol is None:
        return
    method = get_function(compiled_sol, fn_name)
    if method is None:
        return
    all_inputs = [[json.loads(line) for line in inputs.split("\n")] for inputs in all_inputs]
    all_outputs = [json.loads(output) for output in all_outputs]
    total_execution = 0
    all_results: list[Any] = []
    for gt_inp, gt_out in zip(all_inputs, all_outputs):
        signal.alarm(timeout)
        faulthandler.enable()
        try:
            start = time.time()
            prediction = method(*gt_inp)
            total_execution += time.time() - start
            signal.alarm(0)
            if isinstance(prediction, tuple):
                prediction = list(prediction)
            tmp_result = prediction == gt_out
            all_results.append(tmp_result)
            if not tmp_result:
                return all_results, {"output": truncatefn(prediction), "inputs": truncatefn(gt_inp),
                                     "expected": truncatefn(gt_out), "error_code": -2, "error_message": "Wrong Answer"}
        except Exception as e:  # noqa: BLE001
            signal.alarm(0)
            if "timeoutexception" in repr(e).lower():
                all_results.append(-3)
                return all_results, {"error": repr(e), "error_code": -3, "error_message": "Time Limit Exceeded",
                                     "inputs": truncatefn(gt_inp), "expected": truncatefn(gt_out)}
            all_results.append(-4)
            return all_results, {"error": repr(e), "error_code": -4, "error_message": "Runtime Error",
                                 "inputs": truncatefn(gt_inp), "expected": truncatefn(gt_out)}
        finally:
            signal.alarm(0)
            faulthandler.disable()
    return all_results, {"execution time": total_execution}


def grade_stdio(code: str, all_inputs: list, all_outputs: list, timeout: int):
    code = clean_if_name(code)
    code = make_function(code)
    compiled_sol = compile_code(code, timeout)
    if compiled_sol is None:
        return
    method = get_function(compiled_sol, "wrapped_function")
    if method is None:
        return
    all_results: list[Any] = []
    total_execution_time = 0
    for gt_inp, gt_out in zip(all_inputs, all_outputs):
        signal.alarm(timeout)
        faulthandler.enable()
        signal.alarm(timeout)
        with Capturing() as captured_output:
            try:
                start = time.time()
                call_method(method, gt_inp)
                total_execution_time += time.time() - start
                signal.alarm(0)
            except Exception as e:  # noqa: BLE001
                signal.alarm(0)
                if "timeoutexception" in repr(e).lower():
                    all_results.append(-3)
                    return all_results, {"error": repr(e), "error_code": -3, "error_message": "Time Limit Exceeded",
                                         "inputs": truncatefn(gt_inp), "expected": truncatefn(gt_out)}
                all_results.append(-4)
                return all_results, {"error": repr(e), "error_code": -4, "error_message": "Runtime Error",
                                     "inputs": truncatefn(gt_inp), "expected": truncatefn(gt_out)}
            finally:
                signal.alarm(0)
                faulthandler.disable()
        prediction = captured_output[0]
        stripped_prediction_lines = get_stripped_lines(prediction)
        stripped_gt_out_lines = get_stripped_lines(gt_out)
        wa_send_args = {"output": truncatefn(prediction), "inputs": truncatefn(gt_inp),
                        "expected": truncatefn(gt_out), "error_code": -2}
        if len(stripped_prediction_lines) != len(stripped_gt_out_lines):
            all_results.append(-2)
            wa_send_args["error_message"] = "Wrong answer: mismatched output length"
            return all_results, wa_send_args
        for output_line_idx, (pred_line, gt_line) in enumerate(zip(stripped_prediction_lines, stripped_gt_out_lines)):
            wa_send_args["error_message"] = (
                f"Wrong answer at {output_line_idx=}: {truncatefn(pred_line)} != {truncatefn(gt_line)}")
            if pred_line == gt_line:
                continue
            success, decimal_prediction_line = convert_line_to_decimals(pred_line)
            if not success:
                all_results.append(-2)
                return all_results, wa_send_args
            success, decimal_gtout_line = convert_line_to_decimals(gt_line)
            if not success:
                all_results.append(-2)
                return all_results, wa_send_args
            if decimal_prediction_line == decimal_gtout_line:
                continue
            all_results.append(-2)
            return all_results, wa_send_args
        all_results.append(True)
    return all_results, {"execution time": total_execution_time}


def run_test(sample, test=None, debug=False, timeout=6):
    signal.signal(signal.SIGALRM, timeout_handler)
    reliability_guard()
    in_outs = json.loads(sample["input_output"])
    if in_outs.get("fn_name") is None:
        which_type = CODE_TYPE.standard_input
        method_name = None
    else:
        which_type = CODE_TYPE.call_based
        method_name = in_outs["fn_name"]
    assert test is not None, "should not happen: test code is none"
    if which_type == CODE_TYPE.call_based:
        signal.alarm(timeout)
        try:
            results, metadata = grade_call_based(code=test, all_inputs=in_outs["inputs"],
                                                 all_outputs=in_outs["outputs"], fn_name=method_name, timeout=timeout)
            return results, metadata
        except Exception as e:  # noqa: BLE001
            return [-4], {"error_code": -4, "error_message": f"Error during testing: {e}"}
        finally:
            signal.alarm(0)
    signal.alarm(timeout)
    try:
        results, metadata = grade_stdio(code=test, all_inputs=in_outs["inputs"], all_outputs=in_outs["outputs"],
                                        timeout=timeout)
        return results, metadata
    except Exception as e:  # noqa: BLE001
        return [-4], {"error_code": -4, "error_message": f"Error during testing: {e}"}
    finally:
        signal.alarm(0)


def reliability_guard(maximum_memory_bytes=None):
    """LiveCodeBench's guard, verbatim: in-process monkeypatches, *not* a sandbox."""
    if maximum_memory_bytes is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (maximum_memory_bytes, maximum_memory_bytes))
        resource.setrlimit(resource.RLIMIT_DATA, (maximum_memory_bytes, maximum_memory_bytes))
        if not platform.uname().system == "Darwin":
            resource.setrlimit(resource.RLIMIT_STACK, (maximum_memory_bytes, maximum_memory_bytes))
    faulthandler.disable()
    import builtins

    builtins.quit = None  # type: ignore[assignment]
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
                 "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
                 "chroot", "fchdir", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    import shutil

    shutil.rmtree = None  # type: ignore[assignment]
    shutil.move = None  # type: ignore[assignment]
    shutil.chown = None  # type: ignore[assignment]
    import subprocess

    subprocess.Popen = None  # type: ignore[assignment,misc]
    builtins.help = None  # type: ignore[assignment]  # the original: __builtins__["help"] = None
    sys.modules["ipdb"] = None  # type: ignore[assignment]
    sys.modules["joblib"] = None  # type: ignore[assignment]
    sys.modules["resource"] = None  # type: ignore[assignment]
    sys.modules["psutil"] = None  # type: ignore[assignment]
    sys.modules["tkinter"] = None  # type: ignore[assignment]


# --- compute_code_generation_metrics.py ---------------------------------------------------------------


def _temp_run(sample, generation, debug, result, metadata_list, timeout):
    res, metadata = run_test(sample, test=generation, debug=debug, timeout=timeout)
    result.append(res)
    metadata_list.append(metadata)


def check_correctness(sample, generation, timeout, debug=False):
    """One sample: a fresh Manager and a fresh Process, joined with LiveCodeBench's global timeout."""
    manager = multiprocessing.Manager()
    result = manager.list()
    metadata_list = manager.list()
    p = multiprocessing.Process(target=_temp_run, args=(sample, generation, debug, result, metadata_list, timeout))
    p.start()
    p.join(timeout=(timeout + 1) * len(json.loads(sample["input_output"])["inputs"]) + 5)
    if p.is_alive():
        p.kill()
    if not result:
        in_outs = json.loads(sample["input_output"])
        result = [[-1 for _ in range(len(in_outs["inputs"]))]]
    return list(result[0]), (dict(metadata_list[0]) if metadata_list else {})


def evaluate_generations_by_problem(args):
    problem_generations, sample, debug, timeout = args
    res = []
    metadata = []
    for o in problem_generations:
        curr_res: Any = [-2]
        try:
            curr_res, curr_metadata = check_correctness(sample, o, timeout=timeout, debug=debug)
            import numpy as np

            fixed = []
            for e in curr_res:
                if isinstance(e, np.ndarray):
                    e = e.item(0)
                if isinstance(e, np.bool_):
                    e = bool(e)
                fixed.append(e)
            curr_res = fixed
        except Exception as e:  # noqa: BLE001
            curr_metadata = {"error": repr(e), "error_code": -5, "error_message": "TestRunnerError"}
        res.append(curr_res)
        metadata.append(curr_metadata)
    return res, metadata


def _init_worker() -> None:
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(50000)


def lcb_sample(tests: Sequence[Any], func_name: str | None) -> dict[str, str]:
    """LiveCodeBench's ``get_evaluation_sample()`` for a list of :class:`~mars2.data.schema.TestCase`."""
    return {"input_output": json.dumps({"inputs": [t.input for t in tests], "outputs": [t.output for t in tests],
                                        "fn_name": func_name})}


def evaluate_generations(samples: Sequence[dict[str, str]], generations: Sequence[str], *, num_process_evaluate: int = 12,
                         timeout: int = 6) -> list[tuple[list[Any], dict[str, Any]]]:
    """Grade ``generations[i]`` against ``samples[i]`` (an :func:`lcb_sample`) the way LiveCodeBench does.

    A :class:`~concurrent.futures.ProcessPoolExecutor` of ``num_process_evaluate`` workers; each
    sample gets its own Manager + Process; returns ``(results, metadata)`` per sample, where
    ``results`` holds ``True`` per passing test and stops at the first failure (``-2`` wrong answer,
    ``-3`` time limit, ``-4`` runtime/compile error, ``-1`` for every test on a global timeout).
    An empty test list comes back as ``[]``, which LiveCodeBench counts as a pass.
    """
    import numpy  # noqa: F401 - the original module imports it, so forked children have it loaded

    out: list[Any] = [None] * len(samples)
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=num_process_evaluate, mp_context=ctx, initializer=_init_worker) as pool:
        futures = {pool.submit(evaluate_generations_by_problem, ([gen], sample, False, timeout)): i
                   for i, (sample, gen) in enumerate(zip(samples, generations, strict=True))}
        for future in as_completed(futures):
            res, meta = future.result()
            out[futures[future]] = (res[0], meta[0])
    return out


def passed(results: Sequence[Any]) -> bool:
    """LiveCodeBench's criterion for one sample, ``np.all(np.array(results) > 0)``: every entry is
    ``True`` (a failure code is <= 0; note that ``[]``, an empty test list, passes)."""
    try:
        return all(bool(r > 0) for r in results)
    except Exception:  # noqa: BLE001 - an exotic entry the original would choke on
        return False


def _main(argv: list[str]) -> int:
    """``python lcb_reference.py IN.json OUT.json [WORKERS] [TIMEOUT]``: run the harness in a lean process.

    ``IN.json``: ``{"samples": [...], "generations": [...]}``; ``OUT.json`` gets ``{"seconds", "results"}``.
    Used by ``bench/grader.py`` so that the harness's forks copy only what LiveCodeBench's own process holds.
    """
    with open(argv[1]) as f:
        data = json.load(f)
    workers = int(argv[3]) if len(argv) > 3 else 12
    timeout = int(argv[4]) if len(argv) > 4 else 6
    start = time.perf_counter()
    results = evaluate_generations(data["samples"], data["generations"], num_process_evaluate=workers, timeout=timeout)
    seconds = time.perf_counter() - start

    def plain(x: Any) -> Any:
        return x if isinstance(x, (bool, int, float, str)) or x is None else repr(x)

    with open(argv[2], "w") as f:
        json.dump({"seconds": seconds, "results": [[[plain(r) for r in res], {k: plain(v) for k, v in meta.items()}]
                                                   for res, meta in results]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
