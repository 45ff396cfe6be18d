"""Evaluation tables, metric names and comparison (mars2.eval.report, mars2.eval.arms) on hand-built tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from mars2.eval.arms import arm_of, comparison_table, plot_comparison, plot_learning_curves, run_row, to_markdown
from mars2.eval.report import evaluation_metrics, headline, per_problem_results, plot_difficulty

SOLVE = "print(sum(map(int, input().split())))"
LOOP = "t = 0\nfor x in input().split():\n    t += int(x)\nprint(t)"


def _samples():
    # qwen: p1 2/2 correct, p2 0/2; llama: p1 1/2, p2 1/2
    rows = [("p1", "qwen", 1), ("p1", "qwen", 1), ("p2", "qwen", 0), ("p2", "qwen", 0),
            ("p1", "llama", 1), ("p1", "llama", 0), ("p2", "llama", 0), ("p2", "llama", 1)]
    return pd.DataFrame([{"problem_id": p, "agent": a, "reward": float(r), "code": SOLVE,
                          "difficulty": {"p1": "easy", "p2": "hard"}[p], "platform": "toy"} for p, a, r in rows])


def _trees():
    rows = []
    # team tree, T+ off: p1 final = node 2 (tie at 1.0 → latest) fails hidden; node 0 passes → Pass@N 1
    for nid, agent, score, reward, code in [(0, "qwen", 1.0, 1, SOLVE), (1, "llama", 0.5, 0, "x"),
                                            (2, "llama", 1.0, 0, LOOP)]:
        rows.append(("team", False, "p1", nid, agent, score, reward, code))
    for nid, agent, score, reward in [(0, "qwen", 0.0, 0), (1, "qwen", 0.0, 0)]:
        rows.append(("team", False, "p2", nid, agent, score, reward, "y"))
    # team tree, T+ on: p1 final passes, p2 too
    rows += [("team", True, "p1", 0, "qwen", 1.0, 1, SOLVE), ("team", True, "p2", 0, "llama", 1.0, 1, LOOP)]
    frame = pd.DataFrame(rows, columns=["who", "tplus", "problem_id", "node_id", "agent", "score", "reward", "code"])
    frame["reward"] = frame["reward"].astype(float)
    frame["difficulty"] = frame["problem_id"].map({"p1": "easy", "p2": "hard"})
    return frame


def test_metric_names_and_hand_values():
    samples, trees = _samples(), _trees()
    results = per_problem_results(samples, trees, ks=(1, 2))
    assert set(results["kind"]) == {"samples", "tree"}
    m = evaluation_metrics(results, trees, ks=(1, 2), diversity_k=2)
    assert m["qwen/pass_at_1"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert m["llama/pass_at_1"] == pytest.approx(0.5)  # (0.5 + 0.5) / 2
    assert m["qwen/pass_at_2"] == pytest.approx(0.5)  # p1: 1, p2: 0
    assert m["llama/pass_at_2"] == pytest.approx(1.0)  # 1 − C(1,2)/C(2,2) = 1 on both
    assert m["team/pass_at_1"] == pytest.approx(0.5)
    assert m["team/pass_at_1_mcts"] == 0.0  # tie → latest node 2 fails hidden; p2 fails
    assert m["team/pass_at_n"] == pytest.approx(0.5)
    assert m["team/public_pass_accuracy"] == pytest.approx(0.5)  # p1: nodes 0, 2 pass public, one hidden; p2 none
    assert m["team/pass_at_1_mcts_tplus"] == 1.0 and m["team/pass_at_n_tplus"] == 1.0
    assert m["qwen/pass_at_1/easy"] == 1.0 and m["qwen/pass_at_1/hard"] == 0.0
    assert m["team/pass_at_n/easy"] == 1.0 and m["team/pass_at_n/hard"] == 0.0
    assert m["team/n_problems_with_correct"] == 1.0 and m["team/da_at_2"] == pytest.approx(1.0)
    assert m["n_problems"] == 2
    assert all(not math.isnan(v) for v in m.values())
    assert not any("/platform/" in k for k in m)  # one platform: no platform breakdown


def test_platform_breakdown_when_several_platforms():
    samples = _samples()
    samples["platform"] = samples["problem_id"].map({"p1": "atcoder", "p2": "leetcode"})
    trees = _trees().assign(platform=lambda t: t["problem_id"].map({"p1": "atcoder", "p2": "leetcode"}))
    m = evaluation_metrics(per_problem_results(samples, trees), trees)
    assert m["qwen/pass_at_1/platform/atcoder"] == 1.0 and m["qwen/pass_at_1/platform/leetcode"] == 0.0
    assert m["team/pass_at_n/platform/atcoder"] == 1.0
    assert all("@" not in k for k in m)  # MLflow metric names cannot hold '@'


def test_headline_is_the_paper_layout():
    samples, trees = _samples(), _trees()
    m = evaluation_metrics(per_problem_results(samples, trees), trees)
    table = headline(m)
    assert list(table.index) == ["llama", "qwen", "team"]
    assert table.loc["team", "pass_at_1_mcts"] == 0.0 and table.loc["team", "pass_at_n_tplus"] == 1.0
    assert math.isnan(table.loc["qwen", "pass_at_1_mcts"])


def test_plots_are_written(tmp_path):
    samples, trees = _samples(), _trees()
    results = per_problem_results(samples, trees)
    assert plot_difficulty(results, tmp_path / "d.png").stat().st_size > 1000
    curves = pd.DataFrame({"arm": ["single"] * 4, "seed": [0, 0, 1, 1], "cycle": [0, 1, 0, 1],
                           "value": [0.1, 0.2, 0.1, 0.3]})
    assert plot_learning_curves(curves, tmp_path / "c.png").stat().st_size > 1000


def test_nothing_to_score_is_an_error():
    with pytest.raises(ValueError, match="neither samples nor trees"):
        per_problem_results(pd.DataFrame(), pd.DataFrame())


def test_comparison_table_mean_std_and_order(tmp_path):
    rows = [{"arm": "heterogeneous", "seed": 0, "pass_at_1": 0.5, "pass_at_1_mcts": 0.6, "pass_at_n": 0.7},
            {"arm": "heterogeneous", "seed": 1, "pass_at_1": 0.3, "pass_at_1_mcts": 0.4, "pass_at_n": 0.9},
            {"arm": "base", "seed": 0, "pass_at_1": 0.2, "pass_at_1_mcts": 0.25, "pass_at_n": 0.3}]
    table = comparison_table(rows)
    assert list(table["arm"]) == ["base", "heterogeneous"]
    het = table.set_index("arm").loc["heterogeneous"]
    assert het["pass_at_1_mean"] == pytest.approx(0.4) and het["pass_at_1_std"] == pytest.approx(math.sqrt(0.02))
    assert het["n_seeds"] == 2 and math.isnan(table.set_index("arm").loc["base", "pass_at_1_std"])
    md = to_markdown(table)
    assert "| Base | 20.0 | 25.0 | 30.0 | 1 |" in md and "| Heterogeneous (MARS²) | 40.0 ± 14.1 |" in md
    assert plot_comparison(table, tmp_path / "cmp.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no runs"):
        comparison_table([])


def test_arm_and_row_from_mlflow_run_data():
    assert arm_of({}, {"mars2.arm": "grpo"}) == "grpo"
    assert arm_of({"search.strategy": "independent", "agents.paradigm": "single"}, {}) == "grpo"
    assert arm_of({"search.strategy": "ab_mcts", "agents.paradigm": "heterogeneous"}, {}) == "heterogeneous"
    assert arm_of({"eval.checkpoints": "{}"}, {"mars2.kind": "evaluate"}) == "base"
    metrics = {"eval/qwen/pass_at_1": 0.25, "eval/team/pass_at_1": 0.5, "eval/team/pass_at_1_mcts": 0.4,
               "eval/team/pass_at_n": 0.6}
    assert run_row(metrics, agent="qwen") == {"pass_at_1": 0.25, "pass_at_1_mcts": 0.4, "pass_at_n": 0.6}
    assert run_row(metrics, agent="absent")["pass_at_1"] == 0.5


def test_per_cycle_plots_tick_whole_cycles_and_name_the_start():
    from mars2.eval.report import cycle_ticks

    assert cycle_ticks([-1, 0]) == ([-1, 0], ["start", "0"])
    assert cycle_ticks(list(range(40))) == ([], [])


def test_eval_curves_draw_every_metric_with_whole_cycle_ticks(tmp_path, monkeypatch):
    from mars2.eval import report

    seen = {}
    save = report.save_figure

    def keep(fig, path):
        ax = fig.axes[0]
        seen["ticks"] = [t.get_text() for t in ax.get_xticklabels()]
        seen["styles"] = {(line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
        return save(fig, path)

    history = pd.DataFrame([{"metric": m, "cycle": c, "value": 0.5} for m in ("a/pass_at_1", "b/pass_at_1")
                            for c in (-1, 0)])
    monkeypatch.setattr(report, "save_figure", keep)
    path = report.plot_curves(history, tmp_path / "curves.png")
    assert path.stat().st_size > 0
    assert seen["ticks"] == ["start", "0"]
    assert len(seen["styles"]) == 2  # two equal lines, each drawn so it shows
