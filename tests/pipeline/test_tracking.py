"""pipeline/tracking.py without a flow: the seeded MLflow store and the resume / defer / create rule of open_run."""

import sqlite3

from mlflow.tracking import MlflowClient

from pipeline import tracking
from pipeline.config import compose_run, to_container, to_yaml


def test_a_new_run_folder_gets_a_working_store_from_the_template_and_an_existing_one_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = tmp_path / "run" / "mlflow.db"
    tracking.seed_sqlite_store(db)
    assert (tmp_path / "cache" / "mars2").is_dir() and db.is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (default,) = client.search_experiments()
    assert default.artifact_location == (db.parent / "mlartifacts" / "0").as_uri()  # not the template's folder
    exp = client.create_experiment("mars2")
    client.create_run(exp)
    before = db.read_bytes()
    tracking.seed_sqlite_store(db)
    assert db.read_bytes() == before  # never replaced


def _open(cfg, flow_run_id):
    return tracking.open_run(cfg, to_container(cfg), to_yaml(cfg), flow_run_id=flow_run_id, run_name="t")


def test_open_run_resumes_a_failed_run_defers_after_a_finished_one_and_creates_for_a_new_config(tmp_path, monkeypatch):
    monkeypatch.setenv("MARS2_HOME", str(tmp_path))
    cfg = compose_run([])
    first = _open(cfg, "flow-1")
    assert first.id and not first.resumed
    tracking.end_run(cfg, first.id, "FAILED")

    again = _open(compose_run(["debug.fail_at=rollout"]), "flow-2")  # debug.* is not part of the command
    assert again.id == first.id and again.resumed
    client = tracking.client(cfg)
    assert client.get_run(first.id).info.status == "RUNNING"
    assert client.get_run(first.id).data.tags["prefect.flow_run_id"] == "flow-2"
    tracking.end_run(cfg, first.id, "FINISHED")

    cached = _open(cfg, "flow-3")
    logged = []
    cached.log(logged.append)
    assert cached.deferred and cached.reused == first.id and logged == []  # nothing logged while nothing ran
    new_id = cached.needed()
    assert new_id != first.id and logged == [new_id] and cached.reused is None

    other = _open(compose_run(["train.cycles=3"]), "flow-4")
    assert other.id not in (first.id, new_id) and not other.deferred
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("select count(*) from runs").fetchone()[0] == 3


_SWEEP_POINT = """
import sys, time
from pathlib import Path

from pipeline import tracking
from pipeline.config import compose_run, to_container, to_yaml
from stagekit.stage import StageRecord

point, start_at, data = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
cfg = compose_run([f"train.cycles={point + 1}"])  # another sweep point: another config, the same data
dataset = StageRecord(stage="data", key="k" * 64, dir=data, files={"train.parquet": "x", "eval.parquet": "y"},
                      meta={"train_hash": "a" * 36, "eval_hash": "b" * 36})
run = tracking.open_run(cfg, to_container(cfg), to_yaml(cfg), flow_run_id=f"flow-{point}", run_name=f"p{point}")
time.sleep(max(0.0, start_at - time.time()))  # every point logs the same datasets at the same instant
from mlflow.entities import Dataset, DatasetInput

client = tracking.client(cfg)
for k in range(20):  # more datasets each point shares: each is one more chance for two points to collide
    client.log_inputs(run.id, datasets=[DatasetInput(Dataset(f"shared-{k}", f"{k:036d}", "local", "{}"))])
tracking.log_datasets(cfg, run.id, dataset)
tracking.log_metrics(cfg, run.id, {"engine_starts": point})
tracking.end_run(cfg, run.id, "FINISHED")
print(run.id)
"""


def test_sweep_points_tracking_at_once_into_one_store_all_finish_complete(tmp_path):
    """Several runs of one home (a sweep's points on one worker) create their MLflow runs, then log the same datasets
    at the same instant: every one finishes, and every MLflow run holds both datasets and its metric."""
    import os
    import subprocess
    import sys
    import time

    import pandas as pd

    from pipeline.tracking import EXPERIMENT_KIND

    data = tmp_path / "data"
    data.mkdir()
    frame = pd.DataFrame({"id": ["p1", "p2"], "platform": ["x", "y"], "difficulty": ["easy", "hard"],
                          "contest_date": ["2025-01-01", "2025-02-01"]})
    for split in ("train", "eval"):
        frame.to_parquet(data / f"{split}.parquet")
    env = {**os.environ, "MARS2_HOME": str(tmp_path / "home")}
    points = 8
    start_at = time.time() + 20  # after every process has imported MLflow and composed its config
    procs = [subprocess.Popen([sys.executable, "-c", _SWEEP_POINT, str(i), str(start_at), str(data)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(points)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * points, [err[-1500:] for _, err in outs if err]
    ids = [out.strip().splitlines()[-1] for out, _ in outs]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.tags.get(EXPERIMENT_KIND)]
    assert len(set(ids)) == points
    for point, run_id in enumerate(ids):
        run = client.get_run(run_id)
        assert run.info.experiment_id == experiment.experiment_id and run.info.status == "FINISHED"
        assert sorted(i.dataset.name for i in run.inputs.dataset_inputs) == sorted(
            ["toy-eval", "toy-train", *(f"shared-{k}" for k in range(20))])
        assert run.data.metrics["engine_starts"] == point


_KILLED = """
import os, signal
from pipeline import tracking
from pipeline.config import compose_run, to_container, to_yaml

cfg = compose_run([])
run = tracking.open_run(cfg, to_container(cfg), to_yaml(cfg), flow_run_id="flow-killed", run_name="k")
print(run.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_run_left_running_by_kill_9_is_resumed_and_a_live_one_is_not(tmp_path, monkeypatch):
    """``kill -9`` leaves the MLflow run RUNNING: the same command again resumes it (one run, ``mars2.resumed``),
    instead of a second run with the same params. A RUNNING run whose process lives is another run's: not touched."""
    import os
    import signal
    import subprocess
    import sys

    monkeypatch.setenv("MARS2_HOME", str(tmp_path))
    killed = subprocess.run([sys.executable, "-c", _KILLED], env=dict(os.environ), capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    killed_id = killed.stdout.split()[0]
    cfg = compose_run([])
    client = tracking.client(cfg)
    assert client.get_run(killed_id).info.status == "RUNNING"  # what the kill left
    again = _open(cfg, "flow-again")
    assert again.id == killed_id and again.resumed
    tags = client.get_run(killed_id).data.tags
    assert tags["mars2.resumed"] == "1" and tags["prefect.flow_run_id"] == "flow-again"
    assert tags["mars2.pid"] == str(os.getpid())  # now this process's run: a kill of it is recognised in turn
    beside = _open(cfg, "flow-beside")  # the same command while that run's process (this one) lives
    assert beside.id != killed_id and not beside.resumed
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("select count(*) from runs").fetchone()[0] == 2
