"""Policy-gradient losses on padded tensors (docs/algorithm.md §13, §15).

Shapes: B sequences, T response positions. ``mask[b, t] = 1`` on real response tokens, 0 on padding.
All log-prob tensors are log-probabilities of the *sampled* tokens, shape [B, T].
"""

from __future__ import annotations

from collections.abc import Callable
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


def _token_mean(x: torch.Tensor, mask: torch.Tensor, n_tokens: float | None) -> torch.Tensor:
    """Σ x·mask / n_tokens (the step's response tokens), or the masked mean of this batch when None."""
    return masked_mean(x, mask) if n_tokens is None else (x * mask).sum() / n_tokens


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
              tis_veto: float = 1e-4, kl_coef: float = 1e-3, n_seqs: float | None = None,
              n_tokens: float | None = None) -> LossOutput:
    """GSPO with truncated importance sampling and a k3 KL penalty.

    s_i = exp(mean_t[log π − log π_rollout])                   sequence ratio, [B]
    ℓ_i = −min(s_i Â_i, clip(s_i, 1−ε, 1+ε) Â_i)                [B]
    L_pg = mean_i[ mean_t w_it · ℓ_i ]                           w from :func:`truncated_is_weights`
    L = L_pg + kl_coef · masked_mean(k3(π, π_ref))
    ``advantages``: [B]; the others [B, T].

    ``n_seqs`` / ``n_tokens``: the denominators of the two means when this batch is one micro-batch of a larger
    optimizer step (the step's sequences and response tokens): the sum over micro-batches is then the step's loss,
    whatever the split. None: this batch's own counts.
    """
    mask = mask.to(logp.dtype)
    seq_log_ratio = masked_mean(logp - rollout_logp, mask, dim=1)
    s = torch.exp(seq_log_ratio)
    unclipped = s * advantages
    clipped = s.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    per_seq = -torch.minimum(unclipped, clipped)
    w = truncated_is_weights(old_logp, rollout_logp, mask, tis_threshold, tis_veto)
    pg = (masked_mean(w, mask, dim=1) * per_seq).sum() / (n_seqs or len(per_seq))
    kl = _token_mean(k3_kl(logp, ref_logp), mask, n_tokens) if ref_logp is not None else logp.new_zeros(())
    with torch.no_grad():
        clip_frac = ((s < 1 - clip_eps) | (s > 1 + clip_eps)).float().mean().item()
        vetoed = (w.sum(dim=1) == 0).float().mean().item()
    return LossOutput(pg + kl_coef * kl, pg.item(), kl.item(), clip_frac, vetoed)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, rollout_logp: torch.Tensor, ref_logp: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, *, clip_eps: float = 0.2, tis_threshold: float = 2.0,
              tis_veto: float = 1e-4, kl_coef: float = 1e-3, n_seqs: float | None = None,
              n_tokens: float | None = None) -> LossOutput:
    """Vanilla GRPO token-level clipped surrogate (the baseline).

    r_bt = exp(log π − log π_old); ℓ_bt = −min(r Â_b, clip(r, 1−ε, 1+ε) Â_b); L = masked_mean(ℓ) + β·KL.
    ``n_tokens``: the step's response tokens when this batch is one of its micro-batches (see :func:`gspo_loss`).
    The signature is every loss's (:data:`LOSSES`); the baseline has no truncated IS, so ``rollout_logp``,
    ``tis_threshold``, ``tis_veto`` and ``n_seqs`` are not used.
    """
    mask = mask.to(logp.dtype)
    r = torch.exp(logp - old_logp.detach())
    adv = advantages[:, None]
    per_tok = -torch.minimum(r * adv, r.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    pg = _token_mean(per_tok, mask, n_tokens)
    kl = _token_mean(k3_kl(logp, ref_logp), mask, n_tokens) if ref_logp is not None else logp.new_zeros(())
    with torch.no_grad():
        clip_frac = masked_mean(((r < 1 - clip_eps) | (r > 1 + clip_eps)).to(logp.dtype), mask).item()
    return LossOutput(pg + kl_coef * kl, pg.item(), kl.item(), clip_frac, 0.0)


LossFn = Callable[..., LossOutput]
# train.loss → its loss; every one takes (logp, old_logp, rollout_logp, ref_logp, advantages, mask, *, clip_eps,
# tis_threshold, tis_veto, kl_coef, n_seqs, n_tokens)
LOSSES: dict[str, LossFn] = {"gspo": gspo_loss, "grpo": grpo_loss}
