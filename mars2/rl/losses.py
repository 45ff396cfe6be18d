"""Policy-gradient losses on padded tensors (docs/algorithm.md §13, §15).

Shapes: B sequences, T response positions. ``mask[b, t] = 1`` on real response tokens, 0 on padding.
All log-prob tensors are log-probabilities of the *sampled* tokens, shape [B, T].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    pg_loss: float
    kl: float
    clip_frac: float  # share of sequences whose ratio was clipped
    tis_vetoed: float  # share of sequences vetoed by truncated IS


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·mask / Σ mask over ``dim`` (all positions when None); an all-zero mask gives 0, not NaN."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π‖π_ref) per token: exp(ref − logp) − (ref − logp) − 1, shape [B, T], ≥ 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def truncated_is_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                         threshold: float = 2.0, veto: float = 1e-4) -> torch.Tensor:
    """w_bt = min(π_old/π_rollout, threshold), detached; a sequence with any token ratio < veto gets weight 0.

    Returns [B, T]. Corrects the mismatch between the rollout engine and the trainer's numerics.
    """
    ratio = torch.exp((old_logp - rollout_logp).detach())
    vetoed = ((ratio < veto) & mask.bool()).any(dim=1, keepdim=True)
    return torch.where(vetoed, torch.zeros_like(ratio), ratio.clamp(max=threshold))


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, rollout_logp: torch.Tensor, ref_logp: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, *, clip_eps: float = 0.2, tis_threshold: float = 2.0,
              tis_veto: float = 1e-4, kl_coef: float = 1e-3) -> LossOutput:
    """GSPO with truncated importance sampling and a k3 KL penalty.

    s_i = exp(mean_t[log π − log π_rollout])                   sequence ratio, [B]
    ℓ_i = −min(s_i Â_i, clip(s_i, 1−ε, 1+ε) Â_i)                [B]
    L_pg = mean_i[ mean_t w_it · ℓ_i ]                           w from :func:`truncated_is_weights`
    L = L_pg + kl_coef · masked_mean(k3(π, π_ref))
    ``advantages``: [B]; the others [B, T].
    """
    mask = mask.to(logp.dtype)
    seq_log_ratio = masked_mean(logp - rollout_logp, mask, dim=1)
    s = torch.exp(seq_log_ratio)
    unclipped = s * advantages
    clipped = s.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    per_seq = -torch.minimum(unclipped, clipped)
    w = truncated_is_weights(old_logp, rollout_logp, mask, tis_threshold, tis_veto)
    pg = (masked_mean(w, mask, dim=1) * per_seq).mean()
    kl = masked_mean(k3_kl(logp, ref_logp), mask) if ref_logp is not None else torch.zeros((), dtype=logp.dtype)
    with torch.no_grad():
        clip_frac = ((s < 1 - clip_eps) | (s > 1 + clip_eps)).float().mean().item()
        vetoed = (w.sum(dim=1) == 0).float().mean().item()
    return LossOutput(pg + kl_coef * kl, pg.item(), kl.item(), clip_frac, vetoed)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_eps: float = 0.2, kl_coef: float = 1e-3) -> LossOutput:
    """Vanilla GRPO token-level clipped surrogate (the baseline).

    r_bt = exp(log π − log π_old); ℓ_bt = −min(r Â_b, clip(r, 1−ε, 1+ε) Â_b); L = masked_mean(ℓ) + β·KL.
    """
    mask = mask.to(logp.dtype)
    r = torch.exp(logp - old_logp.detach())
    adv = advantages[:, None]
    per_tok = -torch.minimum(r * adv, r.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    pg = masked_mean(per_tok, mask)
    kl = masked_mean(k3_kl(logp, ref_logp), mask) if ref_logp is not None else torch.zeros((), dtype=logp.dtype)
    with torch.no_grad():
        clip_frac = masked_mean(((r < 1 - clip_eps) | (r > 1 + clip_eps)).to(logp.dtype), mask).item()
    return LossOutput(pg + kl_coef * kl, pg.item(), kl.item(), clip_frac, 0.0)
