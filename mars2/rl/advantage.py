"""Rewards and group-normalised advantages (docs/algorithm.md §9–§11)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from mars2.rl.rloo import rloo_estimator


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO soft overlong penalty: min(L − (L_max − B), B) / B when L > L_max − B, else 0 (subtract from r)."""
    if buffer <= 0 or length <= max_length - buffer:
        return 0.0
    return min(length - (max_length - buffer), buffer) / buffer


def group_advantage(rewards: Sequence[float], eps: float = 1e-9) -> list[float]:
    """Â_i = (r_i − mean(r)) / (std(r) + eps), std unbiased (n−1); a group of one or a flat group → zeros.

    In MARS² the group is every node of one tree; in the GRPO baseline, all samples of one problem.
    """
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [(r - mean) / (std + eps) for r in rewards]


def is_flat(rewards: Sequence[float]) -> bool:
    """True when every reward of the group is equal (its advantages are all zero)."""
    return len(set(rewards)) <= 1


def tree_consistent_shaping(parent: Sequence[int], reward: Sequence[float], gamma: float = 0.5,
                            lam: float = 0.5) -> list[float]:
    """r̂_v = r_v + γ·(r_v − b(v)) with a baseline from the tree around v (raw rewards on the right-hand side).

    ``parent[i]`` is the index of node i's parent in the same list, or −1 for a child of the root;
    S = siblings of v (same parent, v excluded):
      b(v) = (1−λ)·r_p + λ·mean(r_S)   parent not root, S non-empty
      b(v) = r_p                        parent not root, S empty
      b(v) = mean(r_S)                  parent is root, S non-empty
      r̂_v = r_v                        parent is root and v is its only child (unshaped)
    """
    n = len(reward)
    if len(parent) != n:
        raise ValueError(f"parent has {len(parent)} entries but reward has {n}")
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        if p != -1 and not 0 <= p < n:
            raise ValueError(f"node {i}: parent index {p} is outside the tree")
        if p == i:
            raise ValueError(f"node {i} is its own parent")
        children.setdefault(p, []).append(i)
    shaped = []
    for i, p in enumerate(parent):
        sib = [reward[j] for j in children[p] if j != i]
        if p == -1:
            if not sib:
                shaped.append(float(reward[i]))
                continue
            base = sum(sib) / len(sib)
        elif sib:
            base = (1 - lam) * reward[p] + lam * sum(sib) / len(sib)
        else:
            base = reward[p]
        shaped.append(reward[i] + gamma * (reward[i] - base))
    return shaped


def tree_group_advantage(shaped: Sequence[float], eps: float = 1e-9) -> list[float]:
    """Path-level group advantage over all nodes of one tree (every agent, every depth):
    Â_v = (r̂_v − mean_T r̂) / (std_T r̂ + eps), std unbiased; computed before routing nodes to their agents."""
    return group_advantage(shaped, eps)


def tree_estimator(parent: Sequence[int], correct: Sequence[float], penalty: Sequence[float], *, gamma: float = 0.5,
                   lam: float = 0.5) -> tuple[list[float], list[float]]:
    """MARS² (``train.advantage=tree``): R_v = r̂_v − pen(L_v), r̂ the tree-consistent shaping of the 0/1
    correctness (:func:`tree_consistent_shaping`; the penalty after it, so a truncated parent's penalty never enters
    its children's baseline), Â = :func:`tree_group_advantage` (R) over the whole tree."""
    shaped = tree_consistent_shaping(parent, correct, gamma, lam)
    reward = [s - p for s, p in zip(shaped, penalty, strict=True)]
    return reward, tree_group_advantage(reward)


def group_estimator(parent: Sequence[int], correct: Sequence[float], penalty: Sequence[float], *, gamma: float = 0.5,
                    lam: float = 0.5) -> tuple[list[float], list[float]]:
    """No shaping (``train.advantage=group``: the ablation, and GRPO, whose "tree" is one problem's samples):
    R_v = r_v − pen(L_v), Â = :func:`group_advantage` (R); ``parent``, ``gamma`` and ``lam`` are not used."""
    reward = [float(r) - p for r, p in zip(correct, penalty, strict=True)]
    return reward, group_advantage(reward)


def tree_rewards(parent: Sequence[int], correct: Sequence[float], response_len: Sequence[int], *, max_len: int,
                 overlong_buffer: int, advantage: str = "tree", gamma: float = 0.5,
                 lam: float = 0.5) -> tuple[list[float], list[float], bool]:
    """Training rewards, advantages and flatness of one tree, in MARTI's order.

    ``correct[i]`` ∈ {0, 1} (all hidden tests pass), ``parent[i]`` as in :func:`tree_consistent_shaping`:
      pen_v = DAPO overlong penalty of L_v (:func:`overlong_penalty`)
      (R, Â) = ADVANTAGES[advantage](parent, correct, pen, gamma=γ, lam=λ)
      flat = all r_v equal            judged on correctness alone: penalties do not make a failed tree informative
    Returns ``(R, Â, flat)``.
    """
    if not len(correct) == len(response_len) == len(parent):
        raise ValueError(f"tree of {len(parent)} nodes has {len(correct)} rewards and {len(response_len)} lengths")
    if advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {advantage!r}; one of {sorted(ADVANTAGES)}")
    penalty = [overlong_penalty(n, max_len, overlong_buffer) for n in response_len]
    reward, adv = ADVANTAGES[advantage](parent, correct, penalty, gamma=gamma, lam=lam)
    return reward, adv, is_flat(correct)

AdvantageFn = Callable[..., tuple[list[float], list[float]]]
# train.advantage → its estimator; every one takes (parent, correct, penalty, *, gamma, lam) for one tree and
# returns (R, Â), one entry per node
ADVANTAGES: dict[str, AdvantageFn] = {"tree": tree_estimator, "group": group_estimator, "rloo": rloo_estimator}
