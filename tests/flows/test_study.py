"""flows/study.py: arms × seeds under one MLflow parent, equal sample budgets, the comparison files."""

from __future__ import annotations

import csv
import sqlite3

import numpy as np
import pytest

from mars2.config import ConfigError


def test_study_config_composes_and_checks_equal_budgets():
    from flows.study import compose_study, programs_per_problem
    from pipeline.config import compose_run

    study = compose_study([])
    assert set(study.arms) == {"grpo", "single", "homogeneous", "heterogeneous"} and len(study.seeds) >= 2
    assert programs_per_problem(compose_run(["search=sampling", "search.n_samples=8", "agents=tiny_cpu_warm"])) == 16
    heldout = compose_study(["study=heldout"])  # the held-out study: controls and claims that name them compose
    assert len(heldout.seeds) >= 3 and "composed" in heldout.controls
    assert {c.worse for c in heldout.claims} >= {"single", "single_llama", "base", "composed", "grpo"}
    assert {"base_two_role", "composed_two_role"} <= set(heldout.controls)  # the two-role tree's controls
    with pytest.raises(ConfigError, match="sample budget"):
        compose_study(["study=smoke",
                       "study.arms.grpo=['agents=tiny_cpu_warm_single','search=sampling','search.n_samples=3']"])
    with pytest.raises(ConfigError, match="at least one arm"):
        compose_study(["study=smoke", "study.seeds=[]"])
    with pytest.raises(ConfigError, match=r"unknown: \['single'\]"):
        compose_study(["study=smoke", "study.claims=[{name: x, metric: pass_at_1, better: single, worse: grpo}]"])
    with pytest.raises(ConfigError, match="weights must map owners"):
        compose_study(["study=smoke", "study.controls.composed.weights={qwen_tiny: single}"])
    with pytest.raises(ConfigError, match="a metric among"):
        compose_study(["study=smoke", "study.claims=[{name: x, metric: pass_at_2, better: base, worse: grpo}]"])
    with pytest.raises(ConfigError, match="gate_arm='single' is not an arm"):
        compose_study(["study=smoke", "study.gate_arm=single"])


def test_a_study_whose_gate_does_not_pass_refuses_to_start_its_arms(tmp_path, run_flow_cli):
    """The random tiny team's refines never pass: the study stops after the gate, says why and how to go on, and
    trains nothing; the gate's run is nested under the study's."""
    arm = ["agents=tiny_cpu", "gate.max_problems=3", "gate.n_fresh=2", "gate.n_pool=2", "gate.n_parents=1", "gate.n_boot=200"]
    r = run_flow_cli("study.py", "study=smoke", "study.gate_arm=heterogeneous",
                     "study.arms.heterogeneous=[" + ",".join(f"'{o}'" for o in arm) + "]")
    assert r.returncode != 0
    assert "the refine gate does not pass for arm 'heterogeneous'" in r.stderr and "study.ignore_gate=true" in r.stderr
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        tags = db.execute("select run_uuid, key, value from tags").fetchall()
    kinds = sorted(v for _, k, v in tags if k == "mars2.kind")
    assert kinds == ["gate", "study"]


def test_a_run_without_the_study_agent_has_no_pass_at_1_of_it(tmp_path):
    """The table's Pass@1 is the study agent's: a run of the other agent alone shows NaN there, not its own."""
    import pandas as pd

    from flows.study import agent_row, final_per_problem

    alone = {"eval": {"llama/pass_at_1": 0.3, "team/pass_at_1": 0.3, "team/pass_at_1_mcts": 0.25,
                      "team/pass_at_n": 0.25}, "stages": [{"stage": "eval", "dir": str(tmp_path)}]}
    row = agent_row(alone, "qwen")
    assert np.isnan(row["pass_at_1"]) and row["pass_at_1_mcts"] == 0.25 and row["pass_at_n"] == 0.25
    assert agent_row({"eval": {**alone["eval"], "qwen/pass_at_1": 0.1}}, "qwen")["pass_at_1"] == 0.1
    pd.DataFrame([{"problem_id": "p1", "who": "llama", "kind": "samples", "tplus": False, "pass_at_1": 0.5,
                   "pass_at_1_mcts": np.nan, "pass_at_n": np.nan}]).to_parquet(tmp_path / "results.parquet")
    scores = final_per_problem(alone, "qwen")
    assert np.isnan(scores.loc[0, "pass_at_1"]) and scores.loc[0, "pass_at_1/llama"] == 0.5
    assert final_per_problem(alone, "llama").loc[0, "pass_at_1"] == 0.5


def db_params(root):
    with sqlite3.connect(root / "mlflow.db") as db:
        return db.execute("select run_uuid, key, value from params").fetchall()


def test_per_problem_scores_and_claims_from_evaluation_results(tmp_path):
    """A run's results table → per-problem Pass@1 of the agent and the team tree's scores; claims tested on the
    problems every seed of both arms scored, paired by problem."""
    import pandas as pd

    from mars2.config import StudyClaim
    from mars2.eval.arms import claim_intervals, claims_markdown, per_problem_scores

    results = pd.DataFrame([
        {"problem_id": "p1", "who": "qwen", "kind": "samples", "tplus": False, "pass_at_1": 0.5},
        {"problem_id": "p2", "who": "qwen", "kind": "samples", "tplus": False, "pass_at_1": 0.0},
        {"problem_id": "p1", "who": "llama", "kind": "samples", "tplus": False, "pass_at_1": 1.0},
        {"problem_id": "p1", "who": "team", "kind": "tree", "tplus": False, "pass_at_1_mcts": 1.0, "pass_at_n": 1.0},
        {"problem_id": "p1", "who": "team", "kind": "tree", "tplus": True, "pass_at_1_mcts": 0.0, "pass_at_n": 0.0},
        {"problem_id": "p2", "who": "team", "kind": "tree", "tplus": False, "pass_at_1_mcts": 0.0, "pass_at_n": 1.0},
    ])
    mine = per_problem_scores(results, agent="qwen").set_index("problem_id")
    assert list(mine.columns) == ["pass_at_1", "pass_at_1_mcts", "pass_at_n", "pass_at_1/llama", "pass_at_1/qwen"]
    assert mine.loc["p1"].tolist() == [0.5, 1.0, 1.0, 1.0, 0.5]
    assert mine.loc["p2"].tolist()[:3] == [0.0, 0.0, 1.0] and np.isnan(mine.loc["p2", "pass_at_1/llama"])
    assert per_problem_scores(results).set_index("problem_id").loc["p1", "pass_at_1"] == 0.75  # mean over agents

    rng = np.random.default_rng(0)
    difficulty = rng.random(80)
    rows = [{"arm": arm, "seed": seed, "problem_id": f"p{i}", "pass_at_1": min(1.0, d + lift),
             "pass_at_1_mcts": float(d > 0.5), "pass_at_n": np.nan}
            for arm, lift in (("a", 0.1), ("b", 0.0)) for seed in (0, 1, 2) for i, d in enumerate(difficulty)]
    rows = [r for r in rows if not (r["arm"] == "b" and r["seed"] == 2 and r["problem_id"] == "p0")]
    claims = claim_intervals(pd.DataFrame(rows), [StudyClaim("lift", "pass_at_1", "a", "b"),
                                                  StudyClaim("reverse", "pass_at_1", "b", "a"),
                                                  StudyClaim("tie", "pass_at_1_mcts", "a", "b")], n_boot=500)
    assert claims["verdict"].tolist() == ["holds", "does not hold", "inconclusive"]
    assert (claims["problems"] == 79).all()  # p0 is missing in one seed of b: left out of every claim on b
    assert 0.05 < claims.loc[0, "delta"] < 0.1 and claims.loc[0, "low"] <= claims.loc[0, "delta"] <= claims.loc[0, "high"]
    assert "**holds**" in claims_markdown(claims)
    # one Holm family of three: the two decided claims keep their verdicts, the tie stays inconclusive
    assert claims["verdict_holm"].tolist() == claims["verdict"].tolist() and (claims["family"] == "pre-registered").all()
    assert (claims["p_holm"] >= claims["p_value"]).all()
    probe = claim_intervals(pd.DataFrame(rows), [StudyClaim("lift", "pass_at_1", "a", "b"),
                                                 StudyClaim("tie", "pass_at_1_mcts", "a", "b", exploratory=True)],
                            n_boot=500)
    assert np.isnan(probe.loc[1, "p_holm"]) and "unadjusted (exploratory)" in claims_markdown(probe)
    by_seed = claim_intervals(pd.DataFrame(rows), [StudyClaim("lift", "pass_at_1", "a", "b")], seeds_as_units=True)
    assert by_seed.loc[0, "seeds_better"] == 3 and by_seed.loc[0, "low"] <= by_seed.loc[0, "delta"]
    with pytest.raises(ValueError, match="no per-problem pass_at_n"):
        claim_intervals(pd.DataFrame(rows), [StudyClaim("n", "pass_at_n", "a", "b")])
    with pytest.raises(ValueError, match="no per-problem pass_at_1/llama"):
        claim_intervals(pd.DataFrame(rows), [StudyClaim("n", "pass_at_1/llama", "a", "b")])
    each = pd.DataFrame(rows).assign(**{"pass_at_1/qwen": lambda f: f["pass_at_1"]})
    named = claim_intervals(each, [StudyClaim("lift of qwen", "pass_at_1/qwen", "a", "b")], n_boot=200)
    assert named.loc[0, "delta"] == claims.loc[0, "delta"] and "Pass@1 of qwen: a − b" in claims_markdown(named)

    from mars2.eval.arms import arm_intervals, plot_arm_intervals, plot_claims

    arms = arm_intervals(pd.DataFrame(rows), ["pass_at_1", "pass_at_1_mcts", "pass_at_n"], n_boot=300)
    assert [tuple(r) for r in arms[["arm", "metric"]].itertuples(index=False)] == [
        ("a", "pass_at_1"), ("a", "pass_at_1_mcts"), ("b", "pass_at_1"), ("b", "pass_at_1_mcts")]  # no pass_at_n
    a1 = arms[(arms["arm"] == "a") & (arms["metric"] == "pass_at_1")].iloc[0]
    assert a1["problems"] == 80 and a1["seeds"] == 3 and a1["low"] < a1["mean"] < a1["high"]
    assert abs(a1["mean"] - pd.DataFrame(rows).query("arm == 'a'")["pass_at_1"].mean()) < 1e-12
    assert arms[arms["arm"] == "b"]["problems"].eq(79).all()  # p0 is not scored in every seed of b
    assert plot_arm_intervals(arms, tmp_path / "arms.png").stat().st_size > 1000
    assert plot_claims(claims, tmp_path / "claims.png").stat().st_size > 1000


@pytest.mark.slow
def test_smoke_study_runs_every_arm_under_one_parent(tmp_path, run_flow_cli):
    r = run_flow_cli("study.py", "study=smoke")
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "study" / "smoke"
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert sorted(row["arm"] for row in runs) == ["base", "composed", "grpo", "heterogeneous"]
    assert all(0.0 <= float(row["pass_at_1"]) <= 1.0 for row in runs)
    text = (out / "study.md").read_text()
    assert "| Base |" in text and "| GRPO |" in text and "| Heterogeneous (MARS²) |" in text
    assert "python flows/study.py study=smoke" in text
    claims = list(csv.DictReader((out / "claims.csv").open()))
    assert [c["claim"] for c in claims] == ["MARS² above GRPO", "training in the team above composing it"]
    assert "## Claims" in text
    for claim in claims:
        assert claim["verdict"] in ("holds", "does not hold", "inconclusive")
        assert float(claim["low"]) <= float(claim["delta"]) <= float(claim["high"])
    per_problem = list(csv.DictReader((out / "per_problem.csv").open()))
    assert {(r["arm"], r["seed"]) for r in per_problem} == {("base", "0"), ("grpo", "0"), ("heterogeneous", "0"),
                                                            ("composed", "0")}
    assert int(claims[0]["problems"]) == len({r["problem_id"] for r in per_problem}) == 8
    assert (out / "comparison.png").stat().st_size > 1000 and (out / "learning_curves.png").stat().st_size > 1000
    curves = list(csv.DictReader((out / "curves.csv").open()))
    assert {(r["arm"], r["seed"]) for r in curves} == {("grpo", "0"), ("heterogeneous", "0")}  # arms, not controls
    for arm in ("grpo", "heterogeneous"):
        cycles = sorted(int(r["cycle"]) for r in curves if r["arm"] == arm)
        assert cycles[0] == 0 and len(cycles) >= 2 and len(set(cycles)) == len(cycles)
    assert (out / "claims.png").stat().st_size > 1000 and (out / "arm_intervals.png").stat().st_size > 1000
    intervals = list(csv.DictReader((out / "arm_intervals.csv").open()))
    assert {r["arm"] for r in intervals} == {"base", "composed", "grpo", "heterogeneous"}
    assert all(float(r["low"]) <= float(r["mean"]) <= float(r["high"]) for r in intervals)
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        tags = db.execute("select run_uuid, key, value from tags").fetchall()
    kind = {u: v for u, k, v in tags if k == "mars2.kind"}
    parent = next(u for u, v in kind.items() if v == "study")
    children = {u for u, k, v in tags if k == "mlflow.parentRunId" and v == parent}
    assert {row["run_id"] for row in runs} == children
    assert {kind[u] for u in children} == {"train", "evaluate"}
    arms = {v for u, k, v in tags if k == "mars2.arm" and u in children}
    assert arms == {"base", "grpo", "heterogeneous", "composed"}
    # the control evaluated the GRPO run's final qwen_tiny weights inside the heterogeneous team
    params = {(u, k): v for u, k, v in db_params(tmp_path)}
    composed = next(u for u, k, v in tags if k == "mars2.arm" and v == "composed")
    grpo = next(u for u, k, v in tags if k == "mars2.arm" and v == "grpo")
    from pipeline import tracking
    from pipeline.config import compose_run

    final = tracking.final_model_dirs(compose_run([f"paths.root={tmp_path}"]), grpo)
    assert params[(composed, "eval.checkpoints.qwen_tiny")] == final["qwen_tiny"]
    assert params[(composed, "agents.paradigm")] == "heterogeneous"


def test_the_evaluation_stage_hashes_every_mars2_eval_module_it_imports_and_not_the_study_statistics():
    """Editing the study's statistics or plots must not re-run evaluations; editing what an evaluation runs must."""
    import subprocess
    import sys

    from tasks.evaluation import DECLARATION

    modules = DECLARATION.modules

    loaded = subprocess.run([sys.executable, "-c", "import sys, tasks.evaluation, mars2.eval.report, mars2.eval.run; "
                             "print(' '.join(m for m in sys.modules if m.startswith('mars2.eval.')))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert loaded and set(loaded) <= set(modules), sorted(set(loaded) - set(modules))
    assert "mars2.eval" not in modules and not {"mars2.eval.stats", "mars2.eval.arms"} & set(modules)
