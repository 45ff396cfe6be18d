"""``python -m mars2.sandbox``: grade a JSONL file of programs against LCB problems, one output row per sample.

    python -m mars2.sandbox --problems P.jsonl --samples S.jsonl --tests public|private|all --out O.jsonl

``P.jsonl``: LiveCodeBench ``code_generation_lite`` rows. ``S.jsonl``: rows ``{"question_id", "code"}``;
``code`` may be a whole model response: when it contains a fence (```), the last fenced block is taken
the way LiveCodeBench extracts code (the lines between the last two lines containing ```), else it is
used as it is. ``O.jsonl``: one row per sample, in the order of ``S.jsonl``::

    {"question_id", "line", "passed", "status", "passed_tests", "total_tests", "detail", "verdicts": [...]}

where ``verdicts`` holds one ``{"test", "status", "detail", "cpu_s", "wall_s"}`` per test that ran.
A malformed problem row is reported on stderr (its samples get an ``error`` row); a malformed sample
row, an unknown ``question_id`` or unusable test data gives that sample an ``error`` row with
``passed: false``; everything else is still graded and written. Exit status: 0 when every row was
usable, 1 when some rows were not, 2 when an input file cannot be read at all (nothing is written).
``--probe`` prints what isolation this host offers and exits.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from mars2.config import ISOLATIONS, MAX_MEMORY_MB, MAX_TIME_S, MAX_WORKERS, MIN_TIME_S, PARITIES
from mars2.data.lcb import LINE_KEY, MALFORMED_KEY, load_problems, read_jsonl_rows
from mars2.data.schema import Problem
from mars2.sandbox.pool import Limits

EXIT_OK, EXIT_BAD_ROWS, EXIT_BAD_INPUT = 0, 1, 2


def extract_code_lcb(text: str) -> str:
    """LiveCodeBench's ``extract_code`` for chat models: the lines between the last two lines holding
    a triple backtick; ``""`` when there are fewer than two such lines."""
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return ""
    return "\n".join(lines[fences[-2] + 1:fences[-1]])


def sample_code(code: str) -> str:
    """The program in a sample's ``code`` field: LCB extraction when it is fenced, else the text itself."""
    return extract_code_lcb(code) if "```" in code else code


def stderr_counter(done: int, total: int) -> None:
    """``--progress``: one self-overwriting line on stderr, "graded k/n", ended when the last program is graded."""
    print(f"\rgraded {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mars2.sandbox", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", type=Path, help="JSONL of LiveCodeBench code_generation_lite rows")
    p.add_argument("--samples", type=Path, help='JSONL of {"question_id", "code"} rows')
    p.add_argument("--tests", choices=("public", "private", "all"), default="all",
                   help="which tests to run (private = the hidden tests; all = public then private)")
    p.add_argument("--out", type=Path, help="output JSONL, one row per sample")
    p.add_argument("--workers", type=int, default=0, help="sandbox slots (0 = one per CPU core)")
    p.add_argument("--time-limit", type=float, default=6.0, help="CPU seconds per test (LiveCodeBench: 6)")
    p.add_argument("--memory-mb", type=int, default=1024, help="address space per test, MiB")
    p.add_argument("--disk-mb", type=int, default=Limits.disk_mb,
                   help="what a program may keep in its scratch folder, MiB")
    p.add_argument("--parity", choices=PARITIES, default="script",
                   help="script: run programs as real scripts (default); lcb: reproduce LiveCodeBench's harness quirks")
    p.add_argument("--isolation", choices=ISOLATIONS, default="auto")
    p.add_argument("--stop-at-visible-failure", action="store_true",
                   help="stop a program at the first test it visibly failed: a crash, a timeout, a limit, not a wrong "
                        "answer (the reward setting; default: run every test)")
    p.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    p.add_argument("--probe", action="store_true", help="print the isolation this host offers and exit")
    return p


def _tests_for(problem: Problem, which: str) -> tuple:
    if which == "public":
        return problem.public_tests
    if which == "private":
        return problem.hidden_tests
    return problem.public_tests + problem.hidden_tests


def _error_row(qid: Any, line: int, error: str) -> dict[str, Any]:
    return {"question_id": qid, "line": line, "passed": False, "status": "ERROR", "passed_tests": 0,
            "total_tests": 0, "detail": error, "error": error, "verdicts": []}


def _bad_flag(args: argparse.Namespace) -> str | None:
    """What is wrong with the numeric flags, in one line, or None."""
    if not (math.isfinite(args.time_limit) and MIN_TIME_S <= args.time_limit <= MAX_TIME_S):
        return f"--time-limit must be a number of CPU seconds from {MIN_TIME_S} to {MAX_TIME_S:g}, got {args.time_limit}"
    if not 1 <= args.memory_mb <= MAX_MEMORY_MB:
        return f"--memory-mb must be from 1 to {MAX_MEMORY_MB}, got {args.memory_mb}"
    if not 1 <= args.disk_mb <= MAX_MEMORY_MB:
        return f"--disk-mb must be from 1 to {MAX_MEMORY_MB}, got {args.disk_mb}"
    if not 0 <= args.workers <= MAX_WORKERS:
        return f"--workers must be from 0 (one per CPU core) to {MAX_WORKERS}, got {args.workers}"
    return None


def main(argv: list[str] | None = None) -> int:
    from mars2.sandbox import SandboxPool

    args = _parser().parse_args(argv)
    if args.probe:
        from mars2.sandbox import isolation_params, probe_isolation

        print(json.dumps({"probe": probe_isolation(), "params": isolation_params(args.isolation)}, indent=2))
        return EXIT_OK
    error = _usage_error(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        problems, rejected = load_problems(read_jsonl_rows(args.problems), source=str(args.problems))
        sample_rows = list(read_jsonl_rows(args.samples))
    except OSError as e:
        print(f"error: cannot read input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for rej in rejected:
        print(f"error: {args.problems}:{rej['line']}: problem {rej['question_id']!r} rejected: {rej['error']}",
              file=sys.stderr)
    if not problems and not sample_rows:
        print(f"error: {args.problems} and {args.samples} hold no usable rows", file=sys.stderr)
        return EXIT_BAD_INPUT
    rows, jobs = _sample_jobs(sample_rows, problems, rejected, args)
    bad_rows = len(rejected) + sum(1 for r in rows if "error" in r)
    try:
        pool = SandboxPool(args.workers or None, args.isolation) if jobs else None
    except (RuntimeError, ValueError) as e:
        print(f"error: the sandbox cannot start here: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    verdicts = _grade(jobs, pool, args) if pool is not None else []
    for index, v in zip((i for i, r in enumerate(rows) if "error" not in r), verdicts, strict=True):
        rows[index].update(passed=v.all_passed, status=v.status, passed_tests=v.passed, total_tests=v.total,
                           detail=v.detail, verdicts=[t.to_dict() for t in v.tests])
    try:
        _write_rows(args.out, rows)
    except OSError as e:
        print(f"error: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    n_pass = sum(1 for r in rows if r.get("passed"))
    print(f"graded {len(jobs)} of {len(rows)} samples ({n_pass} passed) -> {args.out}"
          + (f"; {bad_rows} unusable row(s), see above / the error fields" if bad_rows else ""), file=sys.stderr)
    return EXIT_BAD_ROWS if bad_rows else EXIT_OK


def _usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line (a missing file, a flag out of range), None if nothing."""
    missing = [f"--{name}" for name in ("problems", "samples", "out") if getattr(args, name) is None]
    if missing:
        return f"{', '.join(missing)} required (see --help)"
    bad_flag = _bad_flag(args)
    if bad_flag:
        return bad_flag
    for path in (args.problems, args.samples):
        if not path.is_file():
            return f"cannot read {path}: no such file"
    return None


def _sample_jobs(sample_rows: list[dict[str, Any]], problems: list[Problem], rejected: list[dict[str, Any]],
                 args: argparse.Namespace) -> tuple[list[dict[str, Any]], list]:
    """One output row per sample, in order, and a grading job per row that has no ``error``: a row whose sample is
    malformed, names no known problem, or whose problem's tests are unusable carries the reason instead."""
    from mars2.sandbox import GradeJob, TestDataError
    from mars2.sandbox.grader import validate_job

    by_id = {p.id: p for p in problems}
    rejected_ids = {r["question_id"]: r["error"] for r in rejected if r.get("question_id")}
    rows: list[dict[str, Any]] = []
    jobs: list[GradeJob] = []
    for pos, row in enumerate(sample_rows, start=1):
        line = int(row.get(LINE_KEY, pos)) if isinstance(row, dict) else pos
        if MALFORMED_KEY in row:
            rows.append(_error_row(None, line, f"malformed sample row: {row.get('__error__', 'not a JSON object')}"))
            continue
        qid, code = row.get("question_id"), row.get("code")
        if not isinstance(qid, str) or not qid:
            rows.append(_error_row(qid, line, "sample row without a string question_id"))
            continue
        if not isinstance(code, str):
            rows.append(_error_row(qid, line, "sample row without a string code field"))
            continue
        problem = by_id.get(qid)
        if problem is None:
            why = f"problem row rejected: {rejected_ids[qid]}" if qid in rejected_ids else "unknown question_id"
            rows.append(_error_row(qid, line, why))
            continue
        job = GradeJob(sample_code(code), _tests_for(problem, args.tests), problem.func_name)
        try:
            validate_job(job, args.parity)
        except TestDataError as e:
            rows.append(_error_row(qid, line, f"unusable test data: {e}"))
            continue
        rows.append({"question_id": qid, "line": line})
        jobs.append(job)
    return rows, jobs


def _grade(jobs: list, pool, args: argparse.Namespace) -> list:
    """The verdicts of ``jobs`` in the command's own ``pool``, closed afterwards."""
    from mars2.config import GradingConfig
    from mars2.sandbox import grade_many

    grading = GradingConfig(parity=args.parity, stop_at_visible_failure=args.stop_at_visible_failure)
    limits = Limits(time_s=args.time_limit, memory_mb=args.memory_mb, disk_mb=args.disk_mb)
    try:
        return grade_many(jobs, grading=grading, pool=pool, limits=limits,
                          progress=stderr_counter if args.progress else None)
    finally:
        pool.close()


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as JSON lines at ``path``, atomically (temporary file, then rename)."""
    from mars2.io import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
