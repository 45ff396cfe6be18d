"""A run's CPU budget (mars2/cpu.py): how many cores a process may use, and the split among a run's processes."""

import os
import subprocess
import sys

import pytest

from mars2.cpu import cgroup_cpu_limit, cpu_budget, split_cpus, thread_environment, usable_cpus
from stagekit.stage import StageContext
from tests.paths import ROOT



def test_the_budget_is_split_among_the_processes_that_run_at_once():
    s = split_cpus(8, engines=2, update_ranks=4)
    assert (s.budget, s.flow, s.engine, s.update_rank, s.sandbox) == (8, 8, 4, 2, 8)
    one = split_cpus(1, engines=2, update_ranks=2)  # a share is never 0 threads
    assert (one.flow, one.engine, one.update_rank, one.sandbox) == (1, 1, 1, 1)
    assert split_cpus(5, engines=0).engine == 5  # no CPU engine: nothing to divide by
    with pytest.raises(ValueError, match="at least 1"):
        split_cpus(0)


def test_a_budget_of_zero_is_the_cores_this_process_may_use():
    assert cpu_budget(3) == 3 and cpu_budget(0) == usable_cpus() >= 1
    with pytest.raises(ValueError, match=">= 0"):
        cpu_budget(-1)
    assert StageContext(root="", cpus=3).cpu_shares(engines=2).engine == 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_usable_cpus_follows_the_process_affinity_not_the_machines_core_count():
    one = min(os.sched_getaffinity(0))  # a CPU this process may use (a cpuset need not hold CPU 0)
    out = subprocess.run([sys.executable, "-c",
                          "import os; from mars2.cpu import usable_cpus; print(usable_cpus(), os.cpu_count())"],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, {one}))
    usable, machine = map(int, out.stdout.split())
    assert usable == 1 and machine >= 1


def _cgroup(tmp_path, lines: str, files: dict[str, str]) -> tuple[str, str]:
    (tmp_path / "cgroup").write_text(lines)
    for rel, text in files.items():
        (tmp_path / "fs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / rel).write_text(text)
    (tmp_path / "fs").mkdir(exist_ok=True)
    return str(tmp_path / "cgroup"), str(tmp_path / "fs")


def test_a_cgroup_v2_quota_on_the_group_or_an_ancestor_caps_the_cores(tmp_path):
    proc, root = _cgroup(tmp_path, "0::/jobs/run1\n", {"jobs/run1/cpu.max": "max 100000\n",
                                                        "jobs/cpu.max": "150000 100000\n"})
    assert cgroup_cpu_limit(proc, root) == 1.5
    proc, root = _cgroup(tmp_path, "0::/jobs/run1\n", {"jobs/cpu.max": "max 100000\n"})
    (tmp_path / "fs" / "jobs" / "run1" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(proc, root) is None


def test_a_cgroup_v1_quota_caps_the_cores(tmp_path):
    proc, root = _cgroup(tmp_path, "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n",
                         {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000\n",
                          "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(proc, root) == 2.0
    (tmp_path / "fs" / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert cgroup_cpu_limit(proc, root) is None
    assert cgroup_cpu_limit(str(tmp_path / "missing"), root) is None


def test_the_thread_environment_sizes_every_pool_and_waits_passively():
    env = thread_environment(2)
    assert {env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MAX_JOBS")} == {"2"}
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and thread_environment(0)["OMP_NUM_THREADS"] == "1"


def test_a_negative_budget_is_refused_at_the_flows_entry():
    from mars2.config import ConfigError
    from pipeline.config import load_cfg, resolve

    with pytest.raises(ConfigError, match="cpus=-1 must be >= 0"):
        resolve(load_cfg(["cpus=-1"]), cuda_available=False)


def test_a_sweep_runs_as_many_points_at_once_as_the_workers_cores_hold_budgets():
    from flows.deploy import run_concurrency

    assert run_concurrency(8, 0) == 1  # each run takes every core
    assert run_concurrency(8, 2) == 4 and run_concurrency(2, 4) == 1
