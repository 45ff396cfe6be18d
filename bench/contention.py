"""Runs that share a machine: the same small run alone, then several copies at once, and each copy's slowdown.

    python bench/contention.py                      # 2 copies of the default team's small run (bootstrap included)
    python bench/contention.py --copies 3 --steps 20
    python bench/contention.py --extra cpus=2       # every copy told it has 2 cores (its budget, docs/cpu.md)

Each run is the real CLI (``python flows/train_cycle.py``: embedded Prefect, SQLite MLflow, its own ``MARS2_HOME``)
with the default warm-started tiny team, ``--steps`` bootstrap steps per agent and a small search/train/eval. Every
stage's time comes from the run's stage table (``runs/<run id>.parquet``). Prints, per stage and for the whole run:
the time alone, each copy's time, and copy / alone. A stage that keeps every core busy alone (the warm-start's
training) shares fairly at N× for N copies; the target for 2 copies is ≤ 2.3× per copy (docs/cpu.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT

SMALL = ["data.n_problems=24", "data.max_train_problems=6", "data.max_eval_problems=6", "search.max_nodes=4",
         "search.max_new_tokens=32", "eval.max_new_tokens=32", "train.train_batch=2", "train.cycles=1",
         "grading.time_limit_s=2"]


def overrides(steps: int, extra: list[str]) -> list[str]:
    bootstrap = [f"agents.members.{i}.bootstrap.steps={steps}" for i in (0, 1)]
    return [*SMALL, *bootstrap, *extra]


def start(home: Path, args: list[str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["MARS2_HOME"] = str(home)
    home.mkdir(parents=True)
    log = (home / "run.log").open("w")
    return subprocess.Popen([sys.executable, "flows/train_cycle.py", *args], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def stage_seconds(home: Path) -> dict[str, float]:
    """Seconds per stage (cycle-qualified where a stage runs more than once) from the run's stage table."""
    import pandas as pd

    tables = sorted((home / "runs").glob("*.parquet"), key=lambda p: p.stat().st_mtime)
    if not tables:
        raise SystemExit(f"no stage table in {home}/runs: see {home}/run.log")
    df = pd.read_parquet(tables[-1])
    return {f"{r.stage}@{r.cycle}" if r.stage == "eval" else r.stage: float(r.seconds) for r in df.itertuples()}


def run_together(root: Path, label: str, copies: int, args: list[str]) -> list[tuple[float, dict[str, float]]]:
    """Start ``copies`` runs at once; each one's (wall s, seconds per stage)."""
    t0 = time.perf_counter()
    procs = [start(root / f"{label}{i}", args) for i in range(copies)]
    walls: dict[int, float] = {}
    while len(walls) < copies:
        for i, p in enumerate(procs):
            if i not in walls and p.poll() is not None:
                walls[i] = time.perf_counter() - t0
                if p.returncode != 0:
                    log = (root / f"{label}{i}" / "run.log").read_text()[-3000:]
                    raise SystemExit(f"{label} copy {i} failed (exit {p.returncode}):\n{log}")
        time.sleep(0.2)
    return [(walls[i], stage_seconds(root / f"{label}{i}")) for i in range(copies)]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40, help="bootstrap steps per agent (the default run's: 240)")
    ap.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides for every run")
    a = ap.parse_args()
    args = overrides(a.steps, a.extra)
    load = os.getloadavg()[0]
    cores = usable_cores()
    print(f"{cores} usable cores, load average {load:.2f} at the start; {a.copies} copies; overrides: {' '.join(args)}",
          flush=True)
    if load > 0.5 * cores:
        print("warning: the machine is busy; the run alone is not alone", flush=True)
    with tempfile.TemporaryDirectory(prefix="mars2-contention-") as tmp:
        root = Path(tmp)
        (wall1, alone), = run_together(root, "alone", 1, args)
        print(f"alone: {wall1:.1f} s wall", flush=True)
        together = run_together(root, "copy", a.copies, args)
        print(f"{a.copies} at once: " + ", ".join(f"{w:.1f}" for w, _ in together) + " s wall", flush=True)
    heavy = [s for s, sec in alone.items() if sec >= 1.0]
    head = f"{'stage':<18}{'alone s':>9}" + "".join(f"{f'copy {i + 1} s':>10}" for i in range(a.copies)) + \
        f"{'copy/alone':>12}"
    print(head)
    for s in heavy:
        copies = [t[1].get(s, float("nan")) for t in together]
        print(f"{s:<18}{alone[s]:>9.1f}" + "".join(f"{c:>10.1f}" for c in copies) +
              f"{sum(copies) / len(copies) / alone[s]:>11.2f}x")
    walls = [w for w, _ in together]
    print(f"{'run (wall)':<18}{wall1:>9.1f}" + "".join(f"{w:>10.1f}" for w in walls) +
          f"{sum(walls) / len(walls) / wall1:>11.2f}x")
    print(f"fair share: {a.copies:.1f}x per copy for a stage that keeps all {cores} cores busy alone, less for one "
          f"that waits (engines' latency, the sandbox); stages under 1 s alone are left out")


if __name__ == "__main__":
    main()
