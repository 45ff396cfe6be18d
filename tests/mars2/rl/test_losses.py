"""Losses against hand-computed values on tiny tensors: masked means, the k3 KL, truncated importance weights with the
veto, GSPO and GRPO, and the registry of losses."""

import math

import pytest
import torch

from mars2.rl import grpo_loss, gspo_loss, k3_kl, masked_mean, truncated_is_weights


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


def test_every_loss_train_loss_names_is_registered_with_one_signature():
    import inspect

    from mars2.config import LOSSES as NAMES
    from mars2.rl.losses import LOSSES

    assert sorted(LOSSES) == sorted(NAMES)
    signatures = {name: list(inspect.signature(fn).parameters) for name, fn in LOSSES.items()}
    assert len({tuple(s) for s in signatures.values()}) == 1, signatures
