"""Throughput and verdict agreement: LiveCodeBench's own harness vs ``mars2.sandbox`` on the same programs.

    python bench/grader.py [--data DIR] [--workers 2] [--parity lcb,script] [--limit N] [--time-limit 6]

Programs: O1-mini's 879 LiveCodeBench-v5 solutions on their public tests (``../shared/data/lcb_v5_public``,
or ``--data``, or ``$MARS2_SHARED_DATA``) when present, else the toy benchmark (reference solutions plus
broken variants). Both harnesses get the same programs, tests, time limit and number of worker processes:

(a) LiveCodeBench's harness (``mars2.sandbox.lcb_reference``, a faithful port, run in a lean interpreter of
    its own): a process pool, and per sample a ``multiprocessing.Manager`` plus a ``Process`` running the
    tests sequentially in-process;
(b) ``mars2.sandbox``: one long-lived sandboxed zygote per worker, forking per test (``parity=script``) or
    per program (``parity=lcb``); its start-up is included in the timing.

Prints programs/s for each, the speed-up, and how many programs get the same pass/fail verdict.
``--json PATH`` also writes the figures and the disagreements.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mars2.data import problem_from_lcb_row, read_jsonl_rows, toy_benchmark, toy_reference_solutions  # noqa: E402
from mars2.config import GradingConfig  # noqa: E402
from mars2.sandbox import GradeJob, SandboxPool, grade_many  # noqa: E402
from mars2.sandbox import lcb_reference as lcb  # noqa: E402

LONG_TEST_S = 0.1  # a test this long is the program's own work: it costs the same in any harness
LCB_STATUS = {-1: "global timeout/crash", -2: "WA", -3: "TLE", -4: "RE"}


def find_data(explicit: str | None) -> Path | None:
    candidates = [Path(explicit)] if explicit else []
    if os.environ.get("MARS2_SHARED_DATA"):
        env = Path(os.environ["MARS2_SHARED_DATA"])
        candidates += [env, env / "lcb_v5_public"]
    candidates.append(ROOT.parent / "shared/data/lcb_v5_public")
    for path in candidates:
        if (path / "problems.jsonl").is_file() and (path / "o1mini_solutions.jsonl").is_file():
            return path
    return None


def load_programs(data: Path | None, limit: int | None) -> tuple[str, list[dict[str, Any]]]:
    """``[{"id", "code", "tests", "func_name", "official"}]`` from the LCB v5 copy, else from the toy benchmark."""
    programs = []
    if data is not None:
        problems = {}
        for row in read_jsonl_rows(data / "problems.jsonl"):
            p = problem_from_lcb_row(row)
            problems[p.id] = p
        for line in (data / "o1mini_solutions.jsonl").read_text().splitlines():
            s = json.loads(line)
            p = problems[s["question_id"]]
            programs.append({"id": p.id, "code": s["code"], "tests": p.public_tests, "func_name": p.func_name,
                             "official": s["official_pass"]})
        source = f"LiveCodeBench v5, O1-mini solutions, public tests ({data})"
    else:
        rows = toy_benchmark(200, seed=0)
        solutions = toy_reference_solutions(200, seed=0)
        for i, row in enumerate(rows):
            p = problem_from_lcb_row(row)
            code = solutions[p.id]
            if i % 3 == 1:  # a broken variant: an off-by-one in the first integer literal, or a crash
                code = code.replace("1", "2", 1) if "1" in code else code + "\nraise SystemError('broken')\n"
            programs.append({"id": p.id, "code": code, "tests": p.public_tests + p.hidden_tests,
                             "func_name": p.func_name, "official": None})
        source = "toy benchmark (200 problems; reference solutions, every third one broken), all tests"
    return source, programs[:limit] if limit else programs


def run_lcb(programs, workers: int, time_limit: int) -> tuple[float, list[bool], list[str]]:
    """LiveCodeBench's harness in a lean interpreter of its own (only its imports, as in LCB's process),
    so that its many forks are not slowed down by this process's memory: the conservative comparison."""
    samples = [lcb.lcb_sample(p["tests"], p["func_name"]) for p in programs]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps({"samples": samples, "generations": [p["code"] for p in programs]}))
        subprocess.run([sys.executable, lcb.__file__, str(src), str(dst), str(workers), str(time_limit)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        out = json.loads(dst.read_text())
    elapsed = out["seconds"]
    results = out["results"]
    passed = [lcb.passed(res) for res, _ in results]
    statuses = ["AC" if ok else LCB_STATUS.get(next((r for r in res if r is not True), -4), "WA")
                for ok, (res, _) in zip(passed, results)]
    return elapsed, passed, statuses


def run_ours(programs, workers: int, time_limit: float, parity: str, isolation: str, isolate_tests: bool,
             stats: dict[str, Any] | None = None):
    """Returns (seconds grading, seconds starting the pool, passed, statuses, isolation level); fills ``stats``,
    when given, with ``times`` (each program's grading time) and ``long_cpu`` (the CPU seconds of every test
    that ran at least ``LONG_TEST_S``)."""
    jobs = [GradeJob(p["code"], p["tests"], p["func_name"]) for p in programs]
    start = time.perf_counter()
    pool = SandboxPool(workers, isolation)
    try:
        # start every slot (a long-lived pool pays this once per process, not per batch)
        warm = [GradeJob("print(1)", (programs[0]["tests"][0].__class__("", "1"),))] * workers
        grade_many(warm, grading=GradingConfig(parity=parity), pool=pool)
        started = time.perf_counter()
        graded = grade_many(jobs, grading=GradingConfig(time_limit_s=time_limit, parity=parity), pool=pool,
                            isolate_tests=isolate_tests)
        elapsed = time.perf_counter() - started
        level = pool.level
        if stats is not None:
            stats["times"] = [v.time_s for v in graded]
            stats["long_cpu"] = [t.cpu_s for v in graded for t in v.tests if t.cpu_s >= LONG_TEST_S]
    finally:
        pool.close()
    return elapsed, started - start, [v.all_passed for v in graded], [v.status for v in graded], level


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="folder with problems.jsonl and o1mini_solutions.jsonl")
    ap.add_argument("--workers", type=int, default=2, help="worker processes for both harnesses (default 2)")
    ap.add_argument("--lcb-workers", type=int, default=None, help="LCB harness workers (default: --workers)")
    ap.add_argument("--time-limit", type=int, default=6, help="seconds per test (LCB's default 6)")
    ap.add_argument("--parity", default="lcb,script", help="comma-separated parity modes of ours to run")
    ap.add_argument("--isolation", default="auto")
    ap.add_argument("--limit", type=int, default=None, help="only the first N programs")
    ap.add_argument("--toy", action="store_true", help="use the toy benchmark even when the LCB data is present")
    ap.add_argument("--isolate-tests", action="store_true",
                    help="script mode: a freshly forked process per test instead of one per program")
    ap.add_argument("--json", type=Path, default=None, help="write the figures and disagreements here")
    ap.add_argument("--split-at", type=float, default=None, metavar="SECONDS",
                    help="then time both harnesses again, separately on the programs one of our runs spent at least "
                         "SECONDS on (the heavy tail: time-limit hits, long runs) and on all the others")
    args = ap.parse_args(argv)

    source, programs = load_programs(None if args.toy else find_data(args.data), args.limit)
    n_tests = sum(len(p["tests"]) for p in programs)
    lcb_workers = args.lcb_workers or args.workers
    print(f"programs: {len(programs)} ({n_tests} tests) from {source}")
    print(f"workers: {args.workers} (LCB harness: {lcb_workers}); time limit {args.time_limit} s; "
          f"cpus: {os.cpu_count()}")
    sys.stdout.flush()

    lcb_s, lcb_pass, lcb_status = run_lcb(programs, lcb_workers, args.time_limit)
    report: dict[str, Any] = {"programs": len(programs), "tests": n_tests, "source": source,
                              "workers": args.workers, "lcb": {"seconds": lcb_s, "programs_per_s": len(programs) / lcb_s,
                                                               "passed": sum(lcb_pass)}}
    print(f"{'LiveCodeBench harness (Manager + Process per sample)':<52} {lcb_s:8.1f} s "
          f"{len(programs) / lcb_s:8.1f} programs/s   passed {sum(lcb_pass)}")
    if programs[0]["official"] is not None:
        official = [p["official"] for p in programs]
        print(f"{'  official LCB grades (hidden tests) of these programs':<52} passed {sum(official)}")
    parities = [m.strip() for m in args.parity.split(",") if m.strip()]
    times: list[float] = [0.0] * len(programs)  # the longest any mode of ours spent on each program
    for parity in parities:
        stats: dict[str, Any] = {}
        s, startup, ours_pass, ours_status, level = run_ours(programs, args.workers, args.time_limit, parity,
                                                             args.isolation, args.isolate_tests, stats)
        times = [max(a, b) for a, b in zip(times, stats["times"])]
        agree = sum(a == b for a, b in zip(lcb_pass, ours_pass))
        label = f"mars2.sandbox parity={parity}" + (" isolate-tests" if args.isolate_tests else "") + f" ({level})"
        print(f"{label:<52} {s:8.1f} s {len(programs) / s:8.1f} programs/s   passed {sum(ours_pass)}   "
              f"speed-up {lcb_s / s:5.2f}x   same pass/fail {agree}/{len(programs)}")
        print(f"{'':<52} (+ {startup:.2f} s to start {args.workers} slots once; with it: "
              f"{len(programs) / (s + startup):.1f} programs/s, {lcb_s / (s + startup):.2f}x)")
        long_cpu = sum(stats["long_cpu"])
        bound = lcb_s / (long_cpu / args.workers) if long_cpu else None
        if bound is not None:
            print(f"{'':<52} ({len(stats['long_cpu'])} tests ran {LONG_TEST_S:g} s of CPU or more, {long_cpu:.1f} s "
                  f"together: that alone keeps {args.workers} workers busy {long_cpu / args.workers:.1f} s in any "
                  f"harness, so none can be much more than {bound:.1f}x faster than LiveCodeBench's here)")
        disagreements = [{"id": p["id"], "lcb": ls, "ours": os_} for p, lp, op, ls, os_
                         in zip(programs, lcb_pass, ours_pass, lcb_status, ours_status) if lp != op]
        for d in disagreements[:15]:
            print(f"    differs: {d['id']}: LCB harness {d['lcb']}, ours {d['ours']}")
        report.setdefault("ours", {})[parity] = {
            "seconds": s, "startup_seconds": startup, "programs_per_s": len(programs) / s, "speedup": lcb_s / s,
            "speedup_with_startup": lcb_s / (s + startup), "agreement": agree, "passed": sum(ours_pass),
            "isolation": level, "long_tests": len(stats["long_cpu"]), "long_tests_cpu_seconds": long_cpu,
            "speedup_bound": bound, "disagreements": disagreements}
        sys.stdout.flush()
    if args.split_at is not None and parities:
        heavy = [p for p, t in zip(programs, times) if t >= args.split_at]
        light = [p for p, t in zip(programs, times) if t < args.split_at]
        report["split"] = {"seconds": args.split_at, "heavy": [p["id"] for p in heavy]}
        for name, subset in (("heavy", heavy), ("light", light)):
            if not subset:
                continue
            l_s, l_pass, _ = run_lcb(subset, lcb_workers, args.time_limit)
            print(f"{name} programs ({len(subset)}: ours >= {args.split_at:g} s)" if name == "heavy" else
                  f"{name} programs ({len(subset)}: ours < {args.split_at:g} s)")
            print(f"  {'LiveCodeBench harness':<50} {l_s:8.1f} s {len(subset) / l_s:8.1f} programs/s")
            entry = {"programs": len(subset), "lcb_seconds": l_s}
            for parity in parities:
                o_s, _, o_pass, _, _ = run_ours(subset, args.workers, args.time_limit, parity, args.isolation,
                                                args.isolate_tests)
                agree = sum(a == b for a, b in zip(l_pass, o_pass))
                print(f"  {'mars2.sandbox parity=' + parity:<50} {o_s:8.1f} s {len(subset) / o_s:8.1f} programs/s   "
                      f"speed-up {l_s / o_s:5.2f}x   same pass/fail {agree}/{len(subset)}")
                entry.setdefault("ours", {})[parity] = {"seconds": o_s, "speedup": l_s / o_s, "agreement": agree}
            report["split"][name] = entry
            sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
