"""A run's CPU budget and its split among the processes the run starts (docs/cpu.md).

A run's budget is ``cpus`` cores (config; 0: :func:`usable_cpus` of the machine a stage runs on). Every process the
run starts gets an explicit share of it (:func:`split_cpus`), as torch threads and as the thread variables of its
environment (:func:`thread_environment`), so that several runs on one machine share its cores instead of each sizing
its thread pools to the whole machine.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS")


def cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The CPU quota of this process's cgroup in cores (quota / period), the smallest along its ancestors (cgroup v2
    ``cpu.max``; v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None when there is none or it cannot be read."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy; a limit may sit on any ancestor
            here = Path(root) / path.lstrip("/")
            for folder in [here, *here.parents]:
                limits.append(_v2_limit(folder / "cpu.max"))
                if folder == Path(root):
                    break
        elif "cpu" in controllers.split(","):
            base = Path(root) / controllers
            for folder in (base / path.lstrip("/"), base):
                limits.append(_v1_limit(folder))
    found = [x for x in limits if x is not None]
    return min(found) if found else None


def _v2_limit(cpu_max: Path) -> float | None:
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def usable_cpus() -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's CPU quota (rounded up), at least 1 —
    not ``os.cpu_count()``, which counts the machine's cores whatever the container or ``taskset`` allows."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def cpu_budget(cpus: int) -> int:
    """A run's budget in cores: ``cpus``, or :func:`usable_cpus` when ``cpus`` is 0."""
    if cpus < 0:
        raise ValueError(f"cpus={cpus} must be >= 0 (0: the cores this process may use)")
    return cpus or usable_cpus()


@dataclass(frozen=True)
class CpuShares:
    """Threads per process of one run with ``budget`` cores.

    - ``flow``: the run's own process (warm-start, one-process updates, in-process engines): the whole budget;
    - ``engine``: each CPU engine process; the engines of the owners generate side by side, so
      ⌊budget / engines⌋ each;
    - ``update_rank``: each rank of a multi-process update (the ranks run at once): ⌊budget / ranks⌋;
    - ``sandbox``: sandbox slots when ``grading.workers`` is 0 (each graded program is single-threaded): the budget.

    Every share is at least 1, so a budget smaller than the processes oversubscribes it by that much."""

    budget: int
    flow: int
    engine: int
    update_rank: int
    sandbox: int


def split_cpus(budget: int, *, engines: int = 1, update_ranks: int = 1) -> CpuShares:
    """The :class:`CpuShares` of a run with ``budget`` cores, ``engines`` CPU engines at once and ``update_ranks``
    ranks per update."""
    if budget < 1:
        raise ValueError(f"a CPU budget of {budget} cores: it must be at least 1")
    return CpuShares(budget=budget, flow=budget, engine=max(1, budget // max(1, engines)),
                     update_rank=max(1, budget // max(1, update_ranks)), sandbox=budget)


def thread_environment(threads: int) -> dict[str, str]:
    """The environment variables that size a child's thread pools to ``threads``: OpenMP, MKL, OpenBLAS, numexpr and
    Accelerate threads, ``MAX_JOBS`` (parallel compile jobs of torch/DeepSpeed extension builds), and passive OpenMP
    waiting (``OMP_WAIT_POLICY=PASSIVE``: an idle OpenMP thread sleeps instead of spinning, which on a shared machine
    takes cores from the other runs' threads)."""
    n = str(max(1, int(threads)))
    return {**dict.fromkeys(THREAD_VARIABLES, n), "MAX_JOBS": n, "OMP_WAIT_POLICY": "PASSIVE"}


__all__ = ["CpuShares", "THREAD_VARIABLES", "cgroup_cpu_limit", "cpu_budget", "split_cpus", "thread_environment",
           "usable_cpus"]
