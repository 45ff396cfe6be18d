"""Advantage estimators against hand-computed values: group and tree-consistent shaping, the overlong penalty, and the
registry of estimators."""

import pytest

from mars2.rl import group_advantage, is_flat, overlong_penalty, tree_consistent_shaping, tree_group_advantage


def test_group_advantage_uses_unbiased_std():
    # rewards 1,0,0,0: mean .25, unbiased std sqrt((.5625+3*.0625)/3) = 0.5
    assert group_advantage([1, 0, 0, 0]) == pytest.approx([1.5, -0.5, -0.5, -0.5])


def test_flat_and_singleton_groups_give_zero_advantage():
    assert group_advantage([1, 1, 1]) == [0.0, 0.0, 0.0]
    assert group_advantage([0.3]) == [0.0]
    assert is_flat([0, 0]) and not is_flat([0, 1])


def test_overlong_penalty_dapo():
    assert overlong_penalty(50, 100, 20) == 0.0
    assert overlong_penalty(80, 100, 20) == 0.0  # exactly at L_max − B: no penalty yet
    assert overlong_penalty(90, 100, 20) == pytest.approx(10 / 20)
    assert overlong_penalty(85, 100, 20) == pytest.approx(5 / 20)
    assert overlong_penalty(130, 100, 20) == 1.0


def test_shaping_root_children_use_sibling_mean():
    # three root children with rewards 1, 0, 0: b = mean of the other two
    assert tree_consistent_shaping([-1, -1, -1], [1, 0, 0]) == pytest.approx([1 + 0.5 * (1 - 0), 0 + 0.5 * (0 - 0.5),
                                                                             0 + 0.5 * (0 - 0.5)])


def test_shaping_only_child_of_root_is_unshaped():
    assert tree_consistent_shaping([-1], [1.0]) == [1.0]
    assert tree_consistent_shaping([-1, 0], [0.0, 1.0])[0] == 0.0


def test_shaping_only_child_of_a_node_uses_parent_reward():
    # node 1 (child of 0, no siblings): b = r_0 = 0 → 1 + .5·1
    assert tree_consistent_shaping([-1, 0], [0.0, 1.0])[1] == pytest.approx(1.5)


def test_shaping_parent_and_siblings_mix_with_lambda():
    # nodes 1,2,3 children of 0 (r0 = 1); node 1: b = .5·1 + .5·mean(0, 1) = .75 → 0 + .5·(0 − .75)
    shaped = tree_consistent_shaping([-1, 0, 0, 0], [1.0, 0.0, 0.0, 1.0], gamma=0.5, lam=0.5)
    assert shaped[1] == pytest.approx(-0.375)
    assert shaped[3] == pytest.approx(1 + 0.5 * (1 - (0.5 * 1 + 0.5 * 0.0)))
    assert tree_consistent_shaping([-1, 0, 0], [1.0, 0.0, 1.0], gamma=0.0) == [1.0, 0.0, 1.0]
    lam1 = tree_consistent_shaping([-1, 0, 0], [1.0, 0.0, 1.0], gamma=1.0, lam=1.0)
    assert lam1[1] == pytest.approx(0 + (0 - 1.0))  # λ = 1: siblings only


def test_shaping_rejects_bad_parent_lists():
    with pytest.raises(ValueError):
        tree_consistent_shaping([-1, 5], [0, 1])
    with pytest.raises(ValueError):
        tree_consistent_shaping([-1], [0, 1])


def test_tree_group_advantage_zero_mean_and_flat_tree():
    adv = tree_group_advantage([1.5, -0.25, -0.25, 0.0])
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    assert tree_group_advantage([0.0, 0.0, 0.0]) == [0.0, 0.0, 0.0]


def test_tree_rewards_shapes_then_penalises_then_normalises():
    from mars2.rl import tree_rewards

    # root children 0 and 1; node 2 refines 0. correct = [0, 1, 1]; node 1 overruns by 10 of a 20-token buffer
    parent, correct, lengths = [-1, -1, 0], [0.0, 1.0, 1.0], [10, 90, 10]
    reward, adv, flat = tree_rewards(parent, correct, lengths, max_len=100, overlong_buffer=20)
    # shaped: node 0: 0 + .5(0 − 1) = −.5; node 1: 1 + .5(1 − 0) = 1.5; node 2 (only child, r_p 0): 1 + .5(1 − 0) = 1.5
    # then the penalty: node 1 loses 10/20
    assert reward == pytest.approx([-0.5, 1.0, 1.5])
    mean = sum(reward) / 3
    std = (sum((r - mean) ** 2 for r in reward) / 2) ** 0.5
    assert adv == pytest.approx([(r - mean) / (std + 1e-9) for r in reward])
    assert flat is False
    off, _, _ = tree_rewards(parent, correct, lengths, max_len=100, overlong_buffer=20, advantage="group")
    assert off == pytest.approx([0.0, 0.5, 1.0])


def test_tree_rewards_flat_on_correctness_even_with_penalties():
    from mars2.rl import tree_rewards

    reward, adv, flat = tree_rewards([-1, -1], [0.0, 0.0], [100, 10], max_len=100, overlong_buffer=20)
    assert flat is True and reward == [-1.0, 0.0]
    assert adv[0] < 0 < adv[1]  # still informative about length, but a filter on flat trees drops it
    with pytest.raises(ValueError, match="2 nodes"):
        tree_rewards([-1, -1], [0.0], [1, 1], max_len=10, overlong_buffer=0)


def test_every_advantage_train_advantage_names_is_registered_with_one_signature():
    import inspect

    from mars2.config import ADVANTAGES as NAMES
    from mars2.rl.advantage import ADVANTAGES, tree_rewards

    assert sorted(ADVANTAGES) == sorted(NAMES)
    signatures = {name: list(inspect.signature(fn).parameters) for name, fn in ADVANTAGES.items()}
    assert len({tuple(s) for s in signatures.values()}) == 1, signatures
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        tree_rewards([-1], [1.0], [1], max_len=10, overlong_buffer=0, advantage="ppo")
