"""Advantages and losses against hand-computed values on tiny tensors."""

import math

import pytest
import torch

from mars2.rl import group_advantage, grpo_loss, gspo_loss, is_flat, k3_kl, masked_mean, overlong_penalty, truncated_is_weights


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


def test_masked_mean_ignores_padding_and_empty_rows():
    x = torch.tensor([[1.0, 3.0, 100.0], [5.0, 5.0, 5.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert masked_mean(x, m, dim=1).tolist() == [2.0, 0.0]
    assert masked_mean(x, m).item() == 2.0


def test_k3_kl_is_zero_at_equality_and_matches_formula():
    a = torch.tensor([[-1.0, -2.0]])
    assert k3_kl(a, a).abs().max().item() == 0.0
    d = -0.5  # ref − logp
    assert k3_kl(torch.tensor([[-1.0]]), torch.tensor([[-1.5]])).item() == pytest.approx(math.exp(d) - d - 1)


def test_truncated_is_weights_clip_and_veto():
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.1, 0.5], [0.5, 0.5 / 1e-5]]))  # ratio 5 (clipped to 2); ratio 1e-5 → veto
    w = truncated_is_weights(old, rollout, torch.ones(2, 2), threshold=2.0, veto=1e-4)
    assert w[0].tolist() == pytest.approx([2.0, 1.0])
    assert w[1].tolist() == [0.0, 0.0]


def test_veto_ignores_padding_positions():
    old = torch.tensor([[0.0, 0.0]])
    rollout = torch.tensor([[0.0, 50.0]])  # huge ratio gap only on a padded position
    w = truncated_is_weights(old, rollout, torch.tensor([[1.0, 0.0]]))
    assert w[0, 0].item() == 1.0


def test_gspo_loss_hand_computed():
    # one sequence, 2 real tokens + 1 pad; logp − rollout = [0.1, 0.3] → s = exp(0.2)
    logp = torch.tensor([[-1.0, -1.0, -9.0]], requires_grad=True)
    rollout = torch.tensor([[-1.1, -1.3, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0])
    out = gspo_loss(logp, logp.detach(), rollout, None, adv, mask, clip_eps=0.2, kl_coef=0.0)
    s = math.exp(0.2)  # 1.2214 > 1.2 → clipped term 1.2 is the min for A>0
    w = (min(math.exp(0.1), 2) + min(math.exp(0.3), 2)) / 2
    assert out.loss.item() == pytest.approx(-w * 1.2, rel=1e-5)
    assert out.clip_frac == 1.0
    out.loss.backward()
    assert logp.grad.abs().sum().item() == 0.0  # clipped: no gradient through s
    # negative advantage: min picks the unclipped −s·A branch → gradient flows
    logp2 = logp.detach().clone().requires_grad_(True)
    out2 = gspo_loss(logp2, logp2.detach(), rollout, None, -adv, mask, kl_coef=0.0)
    assert out2.loss.item() == pytest.approx(w * s, rel=1e-5)
    out2.loss.backward()
    assert logp2.grad[0, 2].item() == 0.0 and logp2.grad[0, 0].item() > 0


def test_gspo_kl_term_and_veto():
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0], [-1.0, -2.0]])
    rollout = torch.tensor([[-1.0, -2.0], [-1.0, -2.0 + 20.0]])  # second sequence vetoed (ratio e^-20)
    mask = torch.ones(2, 2)
    out = gspo_loss(logp, logp, rollout, ref, torch.tensor([1.0, 1.0]), mask, kl_coef=0.5)
    kl = (math.exp(-0.5) + 0.5 - 1) / 4
    assert out.kl == pytest.approx(kl, rel=1e-5)
    assert out.tis_vetoed == 0.5
    # sequence 0: s=1, w=1, ℓ=−1; sequence 1 vetoed: 0 → pg = −0.5
    assert out.pg_loss == pytest.approx(-0.5, rel=1e-5)
    assert out.loss.item() == pytest.approx(-0.5 + 0.5 * kl, rel=1e-5)


def test_grpo_token_loss_hand_computed():
    logp = torch.tensor([[-1.0, -1.0]])
    old = torch.tensor([[-1.0, -1.5]])  # ratios 1 and e^0.5 (clipped to 1.2 for A>0)
    out = grpo_loss(logp, old, old, None, torch.tensor([2.0]), torch.ones(1, 2), kl_coef=0.0)
    assert out.loss.item() == pytest.approx(-(1 * 2 + 1.2 * 2) / 2, rel=1e-5)
    assert out.clip_frac == 0.5


from mars2.rl import tree_consistent_shaping, tree_group_advantage  # noqa: E402


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


def test_every_loss_train_loss_names_is_registered_with_one_signature():
    import inspect

    from mars2.config import LOSSES as NAMES
    from mars2.rl.losses import LOSSES

    assert sorted(LOSSES) == sorted(NAMES)
    signatures = {name: list(inspect.signature(fn).parameters) for name, fn in LOSSES.items()}
    assert len({tuple(s) for s in signatures.values()}) == 1, signatures


def test_every_advantage_train_advantage_names_is_registered_with_one_signature():
    import inspect

    from mars2.config import ADVANTAGES as NAMES
    from mars2.rl.advantage import ADVANTAGES, tree_rewards

    assert sorted(ADVANTAGES) == sorted(NAMES)
    signatures = {name: list(inspect.signature(fn).parameters) for name, fn in ADVANTAGES.items()}
    assert len({tuple(s) for s in signatures.values()}) == 1, signatures
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        tree_rewards([-1], [1.0], [1], max_len=10, overlong_buffer=0, advantage="ppo")
