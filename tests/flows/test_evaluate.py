"""flows/evaluate.py and flows/compare.py through the real CLI: the tests' Prefect server, SQLite MLflow, tiny agents.

One run folder for the module:
  A  toy benchmark, full evaluation (samples + per-agent and team trees, T+ off and on) → metrics, tables, plots;
  B  the same agents' weights given as checkpoints → same greedy Pass@1 on the same problems;
  C  a missing checkpoint, an unknown agent, a run without final weights → one-line errors, exit 1;
  D  HumanEval (and the LCB v5 public copy when ../shared/data has it) run through the same flow;
  E  flows/compare.py puts the runs side by side and logs a compare run.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.flowenv import RANDOM_TEAM, flow_env
from tests.paths import ROOT

SMALL = [*RANDOM_TEAM, "data.n_problems=24", "data.max_eval_problems=3", "eval.max_new_tokens=24", "grading.time_limit_s=2"]
LCB_V5 = ROOT.parent / "shared" / "data" / "lcb_v5_public" / "problems.jsonl"

pytestmark = pytest.mark.slow


def _run(home: Path, script: str, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"flows/{script}", *overrides], cwd=ROOT, env=flow_env(home),
                          capture_output=True,
                          text=True, timeout=600)


def _sql(home: Path, sql: str, *args):
    with sqlite3.connect(home / "mlflow.db") as db:
        return db.execute(sql, args).fetchall()


def _latest_run(home: Path) -> str:
    return _sql(home, "select run_uuid from runs order by start_time desc limit 1")[0][0]


def _metrics(home: Path, run_id: str) -> dict[str, float]:
    return dict(_sql(home, "select key, value from latest_metrics where run_uuid = ?", run_id))


def _eval_dir(home: Path, run_id: str) -> Path:
    table = pd.read_parquet(home / "runs" / f"{run_id}.parquet")
    return Path(table.loc[table["stage"] == "eval", "dir"].iloc[0])


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("evaluate")


@pytest.fixture(scope="module")
def full(home):
    r = _run(home, "evaluate.py", *SMALL, "eval.n_samples=2", "eval.ks=[1,2]", "eval.max_nodes=2")
    assert r.returncode == 0, r.stderr[-3000:]
    return _latest_run(home), r


def test_full_evaluation_logs_stable_metrics_tables_and_plots(home, full):
    run_id, r = full
    m = _metrics(home, run_id)
    for agent in ("qwen_tiny", "llama_tiny", "team"):
        for name in ("pass_at_1", "pass_at_1_mcts", "pass_at_n", "pass_at_1_mcts_tplus", "pass_at_n_tplus"):
            assert f"eval/{agent}/{name}" in m, (agent, name, sorted(m))
    assert "eval/qwen_tiny/pass_at_2" in m and m["eval/n_problems"] == 3
    assert all(0.0 <= v <= 1.0 for k, v in m.items() if "/pass_at_" in k)
    tags = dict(_sql(home, "select key, value from tags where run_uuid = ?", run_id))
    assert tags["mars2.kind"] == "evaluate"
    out = _eval_dir(home, run_id)
    samples = pd.read_parquet(out / "samples.parquet")
    trees = pd.read_parquet(out / "eval_trees.parquet")
    results = pd.read_parquet(out / "results.parquet")
    assert len(samples) == 3 * 2 * 2  # problems × agents × n_samples
    assert set(samples["status"]) <= {"AC", "WA", "TLE", "RE", "CE", "MLE", "NO_CODE"}
    # a team tree and one per agent, each without and with T+, 2 nodes per problem
    assert trees.groupby(["who", "tplus"]).size().to_dict() == {
        (w, t): 6 for w in ("llama_tiny", "qwen_tiny", "team") for t in (False, True)}
    assert set(trees.loc[trees["who"] == "qwen_tiny", "agent"]) == {"qwen_tiny"}
    assert {"problem_id", "who", "kind", "tplus", "pass_at_1", "pass_at_1_mcts", "pass_at_n",
            "difficulty"} <= set(results.columns)
    assert len(results[results["kind"] == "tree"]) == 3 * 6
    assert (out / "by_difficulty.png").stat().st_size > 1000
    artefacts = {str(p.relative_to(home / "mlartifacts")) for p in (home / "mlartifacts").rglob("*") if p.is_file()}
    assert any(a.endswith(f"{run_id}/artifacts/cycle_0/evaluation/results.parquet") for a in artefacts)
    assert any(a.endswith(f"{run_id}/artifacts/cycle_0/evaluation/by_difficulty.png") for a in artefacts)
    assert "Pass@1(MCTS)" in r.stderr + r.stdout
    runs = _sql(home, "select count(*) from runs")[0][0]
    again = _run(home, "evaluate.py", *SMALL, "eval.n_samples=2", "eval.ks=[1,2]", "eval.max_nodes=2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "✓ ran" not in again.stderr and again.stderr.count("↺ cached") == 3  # data, agents, eval
    # everything came from cache: no second MLflow run, and the console says which run this command's is
    assert _sql(home, "select count(*) from runs")[0][0] == runs and _latest_run(home) == run_id
    assert "no new MLflow run" in again.stderr and run_id in again.stderr


def test_checkpoints_evaluate_the_given_weights(home, full):
    run_id, _ = full
    greedy = [*SMALL, "eval=default", "eval.tree=false"]
    r = _run(home, "evaluate.py", *greedy)
    assert r.returncode == 0, r.stderr[-3000:]
    base_run = _latest_run(home)
    agents_dir = Path(pd.read_parquet(home / "runs" / f"{run_id}.parquet").set_index("stage").loc["agents", "dir"])
    r = _run(home, "evaluate.py", *greedy, f"+eval.checkpoints.qwen_tiny={agents_dir / 'qwen_tiny' / 'model'}")
    assert r.returncode == 0, r.stderr[-3000:]
    new = _latest_run(home)
    stages = pd.read_parquet(home / "runs" / f"{new}.parquet").set_index("stage")
    assert stages.loc["checkpoints", "status"] == "ran" and stages.loc["eval", "status"] == "ran"
    # greedy samples of the same weights on the same problems are the same programs
    key = ["problem_id", "agent"]
    a = pd.read_parquet(_eval_dir(home, base_run) / "samples.parquet").sort_values(key)
    b = pd.read_parquet(_eval_dir(home, new) / "samples.parquet").sort_values(key)
    assert len(a) == len(b) == 6
    assert a["code"].tolist() == b["code"].tolist() and a["status"].tolist() == b["status"].tolist()
    params = dict(_sql(home, "select key, value from params where run_uuid = ?", new))
    assert params["eval.checkpoints.qwen_tiny"].endswith("qwen_tiny/model")


def test_bad_checkpoints_are_clear_errors(home, full):
    run_id, _ = full
    r = _run(home, "evaluate.py", *SMALL, "eval=default", "+eval.checkpoints.qwen_tiny=/no/such/folder")
    assert r.returncode == 1 and "checkpoint of 'qwen_tiny' not found: /no/such/folder" in r.stderr
    assert "Traceback" not in r.stderr
    r = _run(home, "evaluate.py", *SMALL, "eval=default", f"+eval.checkpoints.nobody={home}")
    assert r.returncode == 1 and "own no weights in this preset" in r.stderr
    r = _run(home, "evaluate.py", *SMALL, "eval=default", f"eval.from_run={run_id}")
    assert r.returncode == 1 and "final_weights.json" in r.stderr
    r = _run(home, "evaluate.py", *SMALL, "eval=default", "eval.from_run=0123456789abcdef")
    assert r.returncode == 1 and "no such MLflow run" in r.stderr


@pytest.mark.parametrize("data", ["humaneval", "lcb_v5_public"])
def test_other_benchmarks_run_through_the_same_flow(home, data):
    overrides = ["agents=tiny_cpu", f"data={data}", "data.max_eval_problems=2", "eval=default", "eval.max_nodes=2",
                 "eval.max_new_tokens=24", "grading.time_limit_s=2"]
    if data == "lcb_v5_public":
        if not LCB_V5.is_file():
            pytest.skip(f"{LCB_V5} is absent (the offline LCB v5 copy lives in ../shared/data)")
        overrides.append(f"data.path={LCB_V5}")
    r = _run(home, "evaluate.py", *overrides)
    assert r.returncode == 0, r.stderr[-3000:]
    m = _metrics(home, _latest_run(home))
    assert m["eval/n_problems"] == 2 and "eval/team/pass_at_1_mcts" in m
    if data == "lcb_v5_public":
        assert m["eval/graded_on_public_tests"] == 2
        assert "public tests stand in for hidden ones" in " ".join((r.stderr + r.stdout).split())
        summary = (_eval_dir(home, _latest_run(home)) / "summary.json").read_text()
        assert '"hidden_tests": "public tests stand in"' in summary
    else:
        assert m["eval/graded_on_public_tests"] == 0


def test_compare_puts_runs_side_by_side(home, full):
    r = _run(home, "compare.py")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Base" in r.stdout and "Pass@1(MCTS)" in r.stdout
    run_id = _latest_run(home)
    tags = dict(_sql(home, "select key, value from tags where run_uuid = ?", run_id))
    assert tags["mars2.kind"] == "compare"
    out = home / "compare" / run_id
    assert "| Base |" in (out / "comparison.md").read_text() and (out / "comparison.png").stat().st_size > 1000
    bad = _run(home, "compare.py", "compare.runs=[nope]")
    assert bad.returncode == 1 and "nope" in bad.stderr and "Traceback" not in bad.stderr
