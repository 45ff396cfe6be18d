"""LiveCodeBench metrics (mars2/eval/metrics.py) against hand-computed values."""

import math
from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from mars2.eval import (
    final_node,
    mean_pass_at_k,
    pass_at_1_mcts,
    pass_at_k,
    pass_at_n,
    public_pass_accuracy,
    sample_metrics,
    summarise,
    tree_metrics,
)

# ------------------------------------------------------------------------------------------------ pass@k


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 0, 1, 0.0),
    (5, 5, 3, 1.0),
    (5, 2, 1, 0.4),
    (5, 2, 2, 1 - 3 / 10),        # C(3,2)/C(5,2)
    (10, 3, 5, 1 - 21 / 252),     # C(7,5)/C(10,5)
    (5, 4, 2, 1.0),               # n − c < k: every 2-subset holds a correct sample
    (4, 1, 4, 1.0),
    (1, 0, 1, 0.0),
    (1, 1, 1, 1.0),
    (20, 1, 1, 0.05),
])
def test_pass_at_k_closed_form(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_brute_force_over_all_subsets():
    for n in range(1, 8):
        for c in range(n + 1):
            correct = set(range(c))
            for k in range(1, n + 1):
                subsets = list(combinations(range(n), k))
                hit = sum(bool(correct & set(s)) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(hit, abs=1e-12), (n, c, k)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_keeps_its_contract():
    assert mean_pass_at_k([(4, 1), (4, 4)], 1) == pytest.approx((0.25 + 1) / 2)
    assert mean_pass_at_k([], 1) == 0.0


# ------------------------------------------------------------------------------------------------ trees


def test_final_node_takes_best_public_score_and_latest_on_ties():
    assert final_node([0, 1, 2], [0.5, 1.0, 1.0]) == 2
    assert final_node([3, 1, 2], [1.0, 1.0, 0.0]) == 3          # row order does not matter, node_id does
    assert final_node([0, 1, 2], [0.9, 0.2, 0.3]) == 0          # no tie: the best, even if earliest
    assert final_node([7], [0.0]) == 7


@pytest.mark.parametrize(("ids", "scores"), [([], []), ([0, 1], [1.0]), ([0, 1], [0.5, float("nan")]),
                                             ([1, 1], [0.5, 0.5])])
def test_final_node_rejects_bad_trees(ids, scores):
    with pytest.raises(ValueError):
        final_node(ids, scores)


def _nodes() -> pd.DataFrame:
    rows = [
        # A: nodes 1 and 2 tie on public score 1; the later (2) fails hidden → Pass@1(MCTS) = 0
        ("A", 0, "gen", 0.5, 0, "easy"), ("A", 1, "gen", 1.0, 1, "easy"), ("A", 2, "ref", 1.0, 0, "easy"),
        # B: nodes 0 and 1 tie; the later (1) passes hidden → 1
        ("B", 0, "gen", 1.0, 0, "hard"), ("B", 1, "ref", 1.0, 1, "hard"), ("B", 2, "gen", 0.2, 0, "hard"),
        # C: nothing passes the public tests → public_pass_accuracy NaN; the best is node 1 (0.7)
        ("C", 0, "gen", 0.3, 0, "hard"), ("C", 1, "gen", 0.7, 0, "hard"), ("C", 2, "ref", 0.0, 0, "hard"),
    ]
    frame = pd.DataFrame(rows, columns=["problem_id", "node_id", "agent", "score", "reward", "difficulty"])
    return frame.sample(frac=1.0, random_state=0)  # rows shuffled: only node_id orders a tree


def test_tree_metrics_hand_values():
    m = tree_metrics(_nodes()).set_index("problem_id")
    assert m.loc["A", "pass_at_1_mcts"] == 0.0 and m.loc["A", "final_node_id"] == 2
    assert m.loc["A", "final_agent"] == "ref"
    assert m.loc["B", "pass_at_1_mcts"] == 1.0 and m.loc["B", "final_node_id"] == 1
    assert m.loc["C", "pass_at_1_mcts"] == 0.0 and m.loc["C", "final_node_id"] == 1
    assert m["pass_at_n"].to_dict() == {"A": 1.0, "B": 1.0, "C": 0.0}
    assert m.loc["A", "public_pass_accuracy"] == 0.5
    assert m.loc["B", "public_pass_accuracy"] == 0.5
    assert math.isnan(m.loc["C", "public_pass_accuracy"])
    assert m["n_nodes"].tolist() == [3, 3, 3]
    assert m["difficulty"].to_dict() == {"A": "easy", "B": "hard", "C": "hard"}
    assert "platform" not in m.columns


def test_pluggable_scorer_replaces_the_tie_rule():
    earliest_best = lambda t: int(t.sort_values(["score", "node_id"], ascending=[False, True])["node_id"].iloc[0])
    m = tree_metrics(_nodes(), scorer=earliest_best).set_index("problem_id")
    assert m["pass_at_1_mcts"].to_dict() == {"A": 1.0, "B": 0.0, "C": 0.0}   # the tie rule reversed
    with pytest.raises(ValueError, match="not in the tree"):
        tree_metrics(_nodes(), scorer=lambda t: 99)


def test_single_tree_helpers():
    tree = _nodes().query("problem_id == 'B'")
    assert pass_at_1_mcts(tree) == 1.0
    assert pass_at_n([0, 0, 1]) == 1.0 and pass_at_n([0, 0]) == 0.0
    assert public_pass_accuracy([1.0, 1.0, 1.0, 0.5], [1, 0, 1, 1]) == pytest.approx(2 / 3)
    assert math.isnan(public_pass_accuracy([0.5], [1]))


def test_summarise_by_difficulty():
    s = summarise(tree_metrics(_nodes()), by="difficulty")
    assert s.index.tolist() == ["easy", "hard", "all"]
    assert s.index.name == "difficulty"
    assert s.loc["all", "n_problems"] == 3
    assert s.loc["all", "pass_at_1_mcts"] == pytest.approx(1 / 3)
    assert s.loc["all", "pass_at_n"] == pytest.approx(2 / 3)
    assert s.loc["all", "public_pass_accuracy"] == pytest.approx(0.5)       # C (NaN) left out
    assert s.loc["all", "public_pass_accuracy_n_problems"] == 2
    assert s.loc["hard", "n_problems"] == 2
    assert s.loc["hard", "pass_at_1_mcts"] == pytest.approx(0.5)
    assert s.loc["easy", "pass_at_1_mcts"] == 0.0
    assert "final_node_id" not in s.columns and "difficulty" not in s.columns
    overall = summarise(tree_metrics(_nodes()))
    assert overall.index.tolist() == ["all"]
    assert overall.loc["all", "n_nodes"] == 3.0


def test_summarise_difficulty_order_and_platform():
    per = pd.DataFrame({"problem_id": list("abcd"), "pass_at_1": [1.0, 0.0, 0.5, 1.0],
                        "difficulty": ["hard", "medium", "easy", "medium"],
                        "platform": ["leetcode", "atcoder", "atcoder", "codeforces"]})
    by_d = summarise(per, by="difficulty")
    assert by_d.index.tolist() == ["easy", "medium", "hard", "all"]
    assert by_d.loc["medium", "pass_at_1"] == 0.5
    by_p = summarise(per, by="platform")
    assert by_p.index.tolist() == ["atcoder", "codeforces", "leetcode", "all"]
    assert by_p.loc["atcoder", "pass_at_1"] == 0.25 and by_p.loc["atcoder", "n_problems"] == 2


# ------------------------------------------------------------------------------------------------ samples


def _samples() -> pd.DataFrame:
    rows = ([("p", "a", 1), ("p", "a", 0), ("p", "b", 0), ("p", "b", 0)]
            + [("q", "a", 1), ("q", "b", 1)])
    frame = pd.DataFrame(rows, columns=["problem_id", "agent", "reward"])
    frame["platform"] = frame["problem_id"].map({"p": "atcoder", "q": "leetcode"})
    return frame


def test_sample_metrics_hand_values():
    m = sample_metrics(_samples(), ks=(1, 2, 3)).set_index("problem_id")
    assert m.loc["p", ["n", "c"]].tolist() == [4, 1]
    assert m.loc["p", "pass_at_1"] == 0.25
    assert m.loc["p", "pass_at_2"] == pytest.approx(1 - 3 / 6)              # 1 − C(3,2)/C(4,2)
    assert m.loc["p", "pass_at_3"] == pytest.approx(1 - 1 / 4)              # 1 − C(3,3)/C(4,3)
    assert m.loc["q", "pass_at_2"] == 1.0
    assert math.isnan(m.loc["q", "pass_at_3"])                               # k > n = 2
    assert m["platform"].to_dict() == {"p": "atcoder", "q": "leetcode"}
    s = summarise(m.reset_index())
    assert s.loc["all", "pass_at_1"] == pytest.approx((0.25 + 1) / 2)
    assert s.loc["all", "pass_at_3"] == pytest.approx(0.75) and s.loc["all", "pass_at_3_n_problems"] == 1


def test_sample_metrics_per_agent():
    m = sample_metrics(_samples(), per_agent=True).set_index(["problem_id", "agent"])
    assert m["pass_at_1"].to_dict() == {("p", "a"): 0.5, ("p", "b"): 0.0, ("q", "a"): 1.0, ("q", "b"): 1.0}
    by_agent = summarise(m.reset_index(), by="agent")
    assert by_agent.loc["a", "pass_at_1"] == 0.75 and by_agent.loc["b", "pass_at_1"] == 0.5


# ------------------------------------------------------------------------------------------------ bad input


def test_errors_on_bad_tables():
    with pytest.raises(ValueError, match="empty"):
        tree_metrics(_nodes().iloc[:0])
    with pytest.raises(ValueError, match="missing column"):
        tree_metrics(_nodes().drop(columns="score"))
    with pytest.raises(ValueError, match="missing column"):
        sample_metrics(_samples().drop(columns="reward"))
    with pytest.raises(ValueError, match="empty"):
        sample_metrics(_samples().iloc[:0])
    shaped = _nodes().assign(reward=lambda f: f["reward"] * 0.5)
    with pytest.raises(ValueError, match="0/1"):
        tree_metrics(shaped)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tree_metrics(_nodes().assign(score=2.0))
    with pytest.raises(ValueError, match="repeated node_id"):
        tree_metrics(_nodes().assign(node_id=0))
    with pytest.raises(ValueError, match="several difficulty"):
        tree_metrics(_nodes().assign(difficulty=["easy", "hard"] * 4 + ["easy"]))
    with pytest.raises(ValueError, match="k must be"):
        sample_metrics(_samples(), ks=(0,))
    with pytest.raises(ValueError, match="empty"):
        summarise(pd.DataFrame({"pass_at_1": []}))
    with pytest.raises(ValueError, match="no column 'platform'"):
        summarise(tree_metrics(_nodes()), by="platform")
    with pytest.raises(TypeError, match="DataFrame"):
        tree_metrics([{"problem_id": "x"}])


def test_nan_reward_is_rejected():
    with pytest.raises(ValueError, match="NaN"):
        sample_metrics(_samples().assign(reward=[1, np.nan, 0, 0, 1, 1]))
