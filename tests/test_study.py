"""flows/study.py: arms × seeds under one MLflow parent, equal sample budgets, the comparison files."""

from __future__ import annotations

import csv
import sqlite3

import pytest

from mars2.config import ConfigError


def test_study_config_composes_and_checks_equal_budgets():
    from flows.study import compose_study, programs_per_problem
    from tasks.config import compose_run

    study = compose_study([])
    assert set(study.arms) == {"grpo", "single", "homogeneous", "heterogeneous"} and len(study.seeds) >= 2
    assert programs_per_problem(compose_run(["search=sampling", "search.n_samples=8", "agents=tiny_cpu_warm"])) == 16
    with pytest.raises(ConfigError, match="sample budget"):
        compose_study(["study=smoke",
                       "study.arms.grpo=['agents=tiny_cpu_warm_single','search=sampling','search.n_samples=3']"])
    with pytest.raises(ConfigError, match="at least one arm"):
        compose_study(["study=smoke", "study.seeds=[]"])


@pytest.mark.slow
def test_smoke_study_runs_every_arm_under_one_parent(tmp_path, run_flow_cli):
    r = run_flow_cli("study.py", "study=smoke")
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "study" / "smoke"
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert sorted(row["arm"] for row in runs) == ["base", "grpo", "heterogeneous"]
    assert all(0.0 <= float(row["pass_at_1"]) <= 1.0 for row in runs)
    text = (out / "study.md").read_text()
    assert "| Base |" in text and "| GRPO |" in text and "| Heterogeneous (MARS²) |" in text
    assert "python flows/study.py study=smoke" in text
    assert (out / "comparison.png").stat().st_size > 1000 and (out / "learning_curves.png").stat().st_size > 1000
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        tags = db.execute("select run_uuid, key, value from tags").fetchall()
    kind = {u: v for u, k, v in tags if k == "mars2.kind"}
    parent = next(u for u, v in kind.items() if v == "study")
    children = {u for u, k, v in tags if k == "mlflow.parentRunId" and v == parent}
    assert {row["run_id"] for row in runs} == children
    assert {kind[u] for u in children} == {"train", "evaluate"}
    arms = {v for u, k, v in tags if k == "mars2.arm" and u in children}
    assert arms == {"base", "grpo", "heterogeneous"}
