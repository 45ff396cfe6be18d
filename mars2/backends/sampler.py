"""Per-request sampling that does not depend on the batch: counter-based uniforms and inverse-CDF draws.

Row b of a batch draws its t-th token with the uniform ``row_uniforms(seed_b, t)``, a pure function of the
request's seed and t, and its own temperature and top-p; so what a request samples depends on its prompt, its seed
and the weights, never on which requests share its batch or when it joined it (continuous batching).
"""

from __future__ import annotations

import numpy as np


def row_uniforms(seeds, steps):
    """u_b = splitmix64(seed_b + (t_b + 1)·φ) / 2^64 ∈ [0, 1): one uniform per row, a pure function of the row's seed
    and its step t_b (an int for every row, or one per row); seeds [B] uint64 → [B] float64."""
    seeds = np.asarray(seeds, dtype=np.uint64)
    steps = np.asarray(steps, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = seeds + (steps + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def next_tokens(logits, temperature, top_p, uniforms) -> tuple:
    """One decoding step: logits [B, V], temperature and top_p (floats, or [B] tensors: one per row), uniforms [B]
    → (tokens [B], their log-probs [B]).

    A greedy row (T = 0) takes argmax z and reports log softmax(z). A sampling row draws from
    π = top_p(softmax(z / T)) (the smallest prefix of tokens by probability whose mass reaches top_p, renormalised)
    by inverse CDF, token = min{i : Σ_{j≤i} π(j) > u}, so a token of zero probability is never drawn, and reports
    log π of the drawn token (the processed log-probs that truncated importance sampling compares with the
    trainer's). Every operation is row-wise: a row's result does not depend on the other rows' values or settings.
    """
    import torch

    rows = logits.shape[0]
    temperature = torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device).expand(rows)
    top_p = torch.as_tensor(top_p, dtype=logits.dtype, device=logits.device).expand(rows)
    greedy = temperature <= 0
    logp = torch.log_softmax(logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None], dim=-1)
    truncate = (top_p < 1.0) & ~greedy
    if bool(truncate.any()):
        sorted_lp, index = logp.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included, as HF does)
        drop = sorted_lp.exp().cumsum(dim=-1) - sorted_lp.exp() >= top_p[:, None]
        kept = torch.log_softmax(logp.scatter(-1, index, sorted_lp.masked_fill(drop, float("-inf"))), dim=-1)
        logp = torch.where(truncate[:, None], kept, logp)
    cdf = logp.double().exp().cumsum(dim=-1)
    u = torch.as_tensor(uniforms, dtype=torch.float64, device=logits.device)[:, None] * cdf[:, -1:]
    sampled = torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=logits.shape[-1] - 1)
    token = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return token, logp.gather(-1, token[:, None])[:, 0]
