"""Paradigm presets and per-agent buffers/checkpoints through the real CLI (slow)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from mars2.procs import kill_group, wait_exit
from tests.flowenv import RANDOM_TEAM, flow_env
from tests.paths import ROOT
from tests.pids import engines_under, group_members

SMALL = [*RANDOM_TEAM, "eval.before=false", "data.n_problems=24", "data.max_train_problems=2", "data.max_eval_problems=2", "search.max_nodes=4",
         "search.max_new_tokens=16", "eval.max_new_tokens=16", "grading.time_limit_s=2", "train.overlong_buffer=8"]

pytestmark = pytest.mark.slow


def _env(home, *, embedded: bool = False):
    return flow_env(home, embedded=embedded)


def _manifests(home, stage):
    return [json.loads(p.read_text()) for p in (Path(home) / "artifacts" / stage).glob("*/MANIFEST.json")]


def test_homogeneous_roles_share_one_engine_and_buffer_until_train_batch(tmp_path):
    """Also runs from another directory with the default, relative run folder (./.mars2)."""
    env = _env(tmp_path)
    env.pop("MARS2_HOME")
    out = subprocess.run([sys.executable, str(ROOT / "flows" / "train_cycle.py"), *SMALL,
                          "agents=tiny_cpu_homogeneous", "train.cycles=2", "train.train_batch=12"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    home = tmp_path / ".mars2"
    updates = sorted(_manifests(home, "update"), key=lambda m: m["weights"]["solver"]["buffer"] is None)
    assert {tuple(m["weights"]) for m in updates} == {("solver",)}  # one weight owner for two roles
    skipped, stepped = updates
    assert skipped["metrics"]["buffered"] == 8  # 2 trees × 4 nodes < 12: kept for the next cycle
    assert pd.read_parquet(Path(skipped["dir"]) / "buffer.parquet")["agent"].nunique() == 2  # both roles' nodes
    assert stepped["metrics"]["n_samples"] == 16 and stepped["metrics"]["carried_over"] == 8
    assert stepped["metrics"]["update_step"] == 1


def test_update_killed_mid_save_resumes_from_the_last_complete_checkpoint(tmp_path):
    """The run is stopped (SIGSTOP) once the update's temporary folder holds DeepSpeed state and killed there; the
    rerun resumes from the last complete checkpoint. A save that was complete before the stop landed (a loaded machine
    can hold this process past the whole save) kills nothing mid-save: that try starts again in a fresh run folder."""
    cmd = [sys.executable, "flows/train_cycle.py", *SMALL, "agents=tiny_cpu_single", "train.cycles=1",
           "train.train_batch=1"]
    for attempt in range(3):
        home = tmp_path / f"try-{attempt}"
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.time() + 300
        update_dir = home / "artifacts" / "update"
        while not any((p / "ds").exists() for p in update_dir.glob(".*.tmp")):
            assert proc.poll() is None and time.time() < deadline, "the run ended before the update started saving"
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGSTOP)
        mid_save = not list(update_dir.glob("*/MANIFEST.json"))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if mid_save:
            break
    assert mid_save, "three runs finished saving before they could be stopped"
    assert any((p / "ds").exists() for p in update_dir.glob(".*.tmp"))  # what the killed save left
    rerun = subprocess.run(cmd, cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (done,) = _manifests(home, "update")
    files = done["files"]
    assert "model/model.safetensors" in files and any(f.startswith("ds/ckpt/") for f in files)
    assert done["metrics"]["update_step"] == 1


def test_sigterm_stops_the_run_and_the_temporary_prefect_server_it_started(tmp_path):
    """`kill <pid>` (or a scheduler's SIGTERM) mid-rollout must leave nothing running: not the embedded Prefect
    server, not the generation engines."""
    log = open(tmp_path / "stderr.log", "w")  # noqa: SIM115 - the run's stderr, read after it ended
    proc = subprocess.Popen([sys.executable, "flows/train_cycle.py", *SMALL, "train.cycles=3"], cwd=ROOT,
                            env=_env(tmp_path, embedded=True), stdout=subprocess.DEVNULL, stderr=log,
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        while not engines_under(tmp_path):  # the rollout is generating (the server is up once a stage has run)
            assert proc.poll() is None and time.time() < deadline, "no engine started"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        assert wait_exit(proc, 60) == 128 + signal.SIGTERM  # unreaped: its group id stays the run's
        log.close()
        stderr = (tmp_path / "stderr.log").read_text()
        # one line saying what happened and what to do, not the connection error the unwinding meets in Prefect
        assert ("mars2: the run was interrupted (SIGTERM) during rollout. Run the same command again to resume"
                in stderr), stderr[-3000:]
        assert "ConnectError" not in stderr and "the run failed" not in stderr
        deadline = time.time() + 20
        while group_members(proc.pid) and time.time() < deadline:
            time.sleep(0.5)
        assert not group_members(proc.pid), "processes of the killed run are still alive (the temporary Prefect server?)"
    finally:
        kill_group(proc)

