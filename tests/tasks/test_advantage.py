"""Rewards → shaping → tree-wide advantage → routing, on a hand-made two-agent tree."""

import pandas as pd
import pytest

from mars2.config import TrainConfig
from mars2.rl.tables import route, tree_advantages


def _tree():
    nodes = pd.DataFrame({
        "problem_id": ["p"] * 4 + ["q"] * 2,
        "node_id": [0, 1, 2, 3, 0, 1],
        "parent": [-1, 0, -1, 1, -1, -1],
        "agent": ["a", "b", "a", "b", "a", "b"],
        "prompt_ids": [[1]] * 6, "response_ids": [[2]] * 6, "logprobs": [[-1.0]] * 6,
        "response_len": [10, 10, 10, 95, 10, 10],
    })
    verdicts = pd.DataFrame({"problem_id": ["p"] * 4 + ["q"] * 2, "node_id": [3, 2, 1, 0, 0, 1],
                             "reward": [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]})
    return nodes, verdicts


def test_rewards_join_by_node_and_advantage_is_tree_wide():
    nodes, verdicts = _tree()
    out = tree_advantages(nodes, verdicts, TrainConfig(advantage="tree", overlong_buffer=0), max_len=100)
    p = out[out["problem_id"] == "p"].set_index("node_id")
    assert p["correct"].tolist() == [0.0, 1.0, 0.0, 1.0]
    # node 0 (root child, sibling 2 with r 0): 0; node 1 (only child of 0, r_p 0): 1.5; node 2: 0; node 3: 1 + .5·(1 − 1)
    assert p["reward"].tolist() == pytest.approx([0.0, 1.5, 0.0, 1.0])
    assert p["advantage"].sum() == pytest.approx(0.0, abs=1e-9)
    assert p.loc[1, "advantage"] > p.loc[3, "advantage"] > p.loc[0, "advantage"]
    q = out[out["problem_id"] == "q"]
    assert q["flat"].all() and (q["advantage"] == 0).all() and not p["flat"].any()


def test_shaping_off_and_overlong_penalty():
    nodes, verdicts = _tree()
    out = tree_advantages(nodes, verdicts, TrainConfig(advantage="group", overlong_buffer=20), max_len=100)
    p = out[out["problem_id"] == "p"].set_index("node_id")
    assert p.loc[3, "reward"] == pytest.approx(1.0 - 15 / 20)  # L = 95 > 100 − 20
    assert p.loc[[0, 1, 2], "reward"].tolist() == p.loc[[0, 1, 2], "correct"].tolist()


def test_missing_verdicts_are_an_error_not_a_silent_drop():
    nodes, verdicts = _tree()
    with pytest.raises(ValueError, match="no verdict"):
        tree_advantages(nodes, verdicts.iloc[1:], TrainConfig(), max_len=100)


def test_penalty_comes_after_shaping_and_flatness_is_judged_on_correctness():
    nodes, verdicts = _tree()
    verdicts["reward"] = 0.0  # nothing passes; node 3 of p overruns (L = 95 > 100 − 20)
    out = tree_advantages(nodes, verdicts, TrainConfig(advantage="tree", overlong_buffer=20), max_len=100)
    p = out[out["problem_id"] == "p"].set_index("node_id")
    assert p["flat"].all()  # all wrong: flat, whatever the penalty
    # shaping sees 0/1 correctness only: node 3's children-free penalty does not leak into anyone's baseline
    assert p["reward"].tolist() == pytest.approx([0.0, 0.0, 0.0, -15 / 20])
    kept = out[~out["flat"]]
    assert kept.empty  # filter_flat_trees drops the whole failed tree


def test_route_sends_each_node_to_the_weights_that_wrote_it():
    nodes, verdicts = _tree()
    out = tree_advantages(nodes, verdicts, TrainConfig(overlong_buffer=0), max_len=100)
    routed = route(out, {"a": "a", "b": "a"})  # homogeneous: b is a role of a's weights
    assert list(routed) == ["a"] and len(routed["a"]) == len(out)
    routed = route(out, {"a": "a", "b": "b"})
    assert set(routed["a"]["agent"]) == {"a"} and set(routed["b"]["agent"]) == {"b"}
    # the advantage was computed over the whole tree before routing: one owner's share does not sum to zero
    assert routed["a"]["advantage"].sum() == pytest.approx(-routed["b"]["advantage"].sum(), abs=1e-9)
