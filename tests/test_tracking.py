"""tasks/tracking.py without a flow: the seeded MLflow store and the resume / defer / create rule of open_run."""

import sqlite3

from mlflow.tracking import MlflowClient

from tasks import tracking
from tasks.config import compose_run, to_container, to_yaml


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
