"""REINFORCE leave-one-out (RLOO; Ahmadian et al. 2024, "Back to Basics"), an advantage estimator registered as
``train.advantage=rloo``: the whole of what adding an estimator takes is this file, its line in
:data:`mars2.rl.advantage.ADVANTAGES` and its name in :data:`mars2.config.ADVANTAGES` (docs/algorithm.md §11)."""

from __future__ import annotations

from collections.abc import Sequence


def rloo_estimator(parent: Sequence[int], correct: Sequence[float], penalty: Sequence[float], *, gamma: float = 0.5,
                   lam: float = 0.5) -> tuple[list[float], list[float]]:
    """R_v = r_v − pen(L_v); Â_v = R_v − mean_{u≠v} R_u = n/(n−1)·(R_v − mean R) over the tree's n nodes (each node's
    baseline leaves its own reward out, so it is unbiased; no division by the spread); a tree of one node → 0.
    ``parent``, ``gamma`` and ``lam`` are not used."""
    reward = [float(r) - p for r, p in zip(correct, penalty, strict=True)]
    n = len(reward)
    if n < 2:
        return reward, [0.0] * n
    total = sum(reward)
    return reward, [r - (total - r) / (n - 1) for r in reward]
