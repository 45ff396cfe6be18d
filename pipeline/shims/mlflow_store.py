"""MLflow's SQLite tracking store, written to directly once: a run folder's database is a copy of a template made by
MLflow itself, and the copy's ``Default`` experiment (id 0) is pointed into the run folder by updating the
``experiments`` table of MLflow 3.17's schema (pipeline/tracking.py: seed_sqlite_store)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mars2.shims import check_version

PACKAGE, WRITTEN_FOR = "mlflow", "3.17."


def point_default_experiment(db: Path, artifact_location: str) -> None:
    """Set the artifact location of experiment 0 in the SQLite store ``db``."""
    check_version(PACKAGE, WRITTEN_FOR)
    with sqlite3.connect(db) as con:
        updated = con.execute("update experiments set artifact_location = ? where experiment_id = 0",
                              (artifact_location,)).rowcount
    con.close()
    if updated != 1:
        raise RuntimeError(f"MLflow's store {db} has no Default experiment to point into the run folder "
                           f"(schema of mlflow {WRITTEN_FOR}x expected)")
