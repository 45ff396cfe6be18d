"""The advantage stage on tables: join rollout nodes with their verdicts, score every tree, route samples to owners.

One row per node in, one row per node out; every formula lives in :mod:`mars2.rl.advantage`.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from mars2.config import TrainConfig
from mars2.rl.advantage import tree_rewards

ROUTED_COLUMNS = ["problem_id", "node_id", "agent", "prompt_ids", "response_ids", "logprobs", "correct", "reward",
                  "advantage"]


TRAIN_READS = ("overlong_buffer", "advantage", "shaping_gamma", "shaping_lambda")  # the fields tree_advantages reads


def tree_advantages(nodes: pd.DataFrame, verdicts: pd.DataFrame, train: TrainConfig, max_len: int) -> pd.DataFrame:
    """Adds ``correct`` (0/1 on hidden tests), ``reward`` (training reward), ``advantage`` and ``flat`` to every node.

    ``nodes``: problem_id, node_id, parent (−1 = root), response_len, ...; ``verdicts``: problem_id, node_id,
    reward (0/1). Each tree (= problem) goes through :func:`mars2.rl.advantage.tree_rewards` as one group.
    """
    table = nodes.merge(verdicts.rename(columns={"reward": "correct"}), on=["problem_id", "node_id"], how="inner",
                        validate="one_to_one")
    if len(table) != len(nodes):
        raise ValueError(f"advantage: {len(nodes) - len(table)} nodes have no verdict")
    table = table.sort_values(["problem_id", "node_id"]).reset_index(drop=True)
    reward, adv, flat = [], [], []
    for _, tree in table.groupby("problem_id", sort=False):
        position = {nid: i for i, nid in enumerate(tree["node_id"])}
        parent = [position[p] if p != -1 else -1 for p in tree["parent"]]
        r, a, f = tree_rewards(parent, tree["correct"].tolist(), tree["response_len"].tolist(), max_len=max_len,
                               overlong_buffer=train.overlong_buffer, advantage=train.advantage,
                               gamma=train.shaping_gamma, lam=train.shaping_lambda)
        reward += r
        adv += a
        flat += [f] * len(r)
    table["reward"], table["advantage"], table["flat"] = reward, adv, flat
    return table


def advantage_metrics(scored: pd.DataFrame, kept: pd.DataFrame) -> dict[str, float]:
    """Stage metrics: over every tree (``scored``) the pass rate and flat share; over the trained nodes (``kept``)
    the mean training reward and mean |Â|."""
    n_trees = scored["problem_id"].nunique()
    flat = int(scored.groupby("problem_id")["flat"].first().sum()) if n_trees else 0
    return {"mean_correct": float(scored["correct"].mean()) if len(scored) else 0.0,
            "mean_reward": float(kept["reward"].mean()) if len(kept) else 0.0,
            "flat_tree_share": flat / max(n_trees, 1),
            "advantage_abs_mean": float(kept["advantage"].abs().mean()) if len(kept) else 0.0}


def route(nodes: pd.DataFrame, owner_of: Mapping[str, str]) -> dict[str, pd.DataFrame]:
    """Each weight owner's nodes (``owner_of``: agent → owner), after the tree-wide advantage: a node is trained
    only by the weights that wrote it."""
    owners = nodes["agent"].map(owner_of)
    return {owner: nodes[owners == owner][ROUTED_COLUMNS].reset_index(drop=True)
            for owner in sorted(set(owner_of.values()))}


def routed_metrics(routed: Mapping[str, pd.DataFrame]) -> dict[str, float]:
    """Per owner: how many samples it was routed and their mean advantage (``<owner>/n_samples``, ``advantage_mean``)."""
    out: dict[str, float] = {}
    for owner, part in routed.items():
        out[f"{owner}/n_samples"] = len(part)
        out[f"{owner}/advantage_mean"] = float(part["advantage"].mean()) if len(part) else 0.0
    return out


def buffer_metrics(buffer: pd.DataFrame, n_new: int) -> dict[str, float]:
    """The advantages an update trains on (its buffer: carried-over samples + the ``n_new`` routed this cycle)."""
    adv = buffer["advantage"]
    return {"advantage_mean": float(adv.mean()), "advantage_std": float(adv.std(ddof=0)),
            "advantage_abs_max": float(adv.abs().max()), "carried_over": float(len(buffer) - n_new)}
