"""Stage 4 — advantage: rewards, tree-consistent shaping, path-level group advantage, routing to agents."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task

from mars2.config import AgentConfig, SearchConfig, TrainConfig
from mars2.io import write_parquet
from tasks.weights import owner_of
from tasks.stage import StageContext, StageRecord, cache_key_fn, current_parameters, run_stage

STAGE = "advantage"
MODULES = ("mars2.rl", "mars2.io", "tasks.advantage", "tasks.weights")
ROUTED_COLUMNS = ["problem_id", "node_id", "agent", "prompt_ids", "response_ids", "logprobs", "reward", "shaped",
                  "advantage"]


@task(name=STAGE, cache_key_fn=cache_key_fn(STAGE, MODULES), persist_result=True, task_run_name="advantage-c{cycle}")
def compute_advantages(ctx: StageContext, train: TrainConfig, search: SearchConfig, members: list[AgentConfig],
                       trees: StageRecord, verdicts: StageRecord, cycle: int) -> StageRecord:
    """``routed/<owner>.parquet``: each weight owner's nodes with token ids, rollout log-probs and advantage.

    Per tree: r = 1 iff all hidden tests pass, minus the DAPO overlong penalty; r̂ = tree-consistent shaping
    of r (``train.shaping``); Â = group normalisation over the whole tree — all before routing.
    """

    def produce(out: Path) -> dict:
        nodes = tree_advantages(
            pd.read_parquet(trees.path("trees.parquet"),
                            columns=["problem_id", "node_id", "parent", "agent", "prompt_ids", "response_ids",
                                     "logprobs", "response_len"]),
            pd.read_parquet(verdicts.path("verdicts.parquet"), columns=["problem_id", "node_id", "reward"]),
            train, max_len=search.max_new_tokens)
        n_trees = nodes["problem_id"].nunique()
        flat = int(nodes.groupby("problem_id")["flat"].first().sum())
        if train.filter_flat_trees:
            nodes = nodes[~nodes["flat"]]
        owners = {m.name: owner_of(m) for m in members}
        metrics = {"mean_reward": float(nodes["reward"].mean()) if len(nodes) else 0.0,
                   "mean_shaped": float(nodes["shaped"].mean()) if len(nodes) else 0.0,
                   "flat_tree_share": flat / max(n_trees, 1),
                   "advantage_abs_mean": float(nodes["advantage"].abs().mean()) if len(nodes) else 0.0}
        for owner in sorted(set(owners.values())):
            part = nodes[nodes["agent"].map(owners) == owner]
            write_parquet(out / "routed" / f"{owner}.parquet", part[ROUTED_COLUMNS])
            metrics[f"{owner}/n_samples"] = len(part)
            metrics[f"{owner}/advantage_mean"] = float(part["advantage"].mean()) if len(part) else 0.0
        return {"metrics": metrics}

    return run_stage(STAGE, MODULES, ctx, current_parameters(), produce)


def tree_advantages(nodes: pd.DataFrame, verdicts: pd.DataFrame, train: TrainConfig, max_len: int) -> pd.DataFrame:
    """Adds ``reward``, ``shaped``, ``advantage`` and ``flat`` (all rewards of the tree equal) to every node."""
    from mars2.rl import is_flat, overlong_penalty, tree_consistent_shaping, tree_group_advantage

    table = nodes.merge(verdicts, on=["problem_id", "node_id"], how="inner", validate="one_to_one")
    if len(table) != len(nodes):
        raise ValueError(f"advantage: {len(nodes) - len(table)} nodes have no verdict")
    table = table.sort_values(["problem_id", "node_id"]).reset_index(drop=True)
    if train.overlong_buffer > 0:
        table["reward"] = [r - overlong_penalty(n, max_len, train.overlong_buffer)
                           for r, n in zip(table["reward"], table["response_len"], strict=True)]
    shaped, adv, flat = [], [], []
    for _, tree in table.groupby("problem_id", sort=False):
        position = {nid: i for i, nid in enumerate(tree["node_id"])}
        parent = [position[p] if p != -1 else -1 for p in tree["parent"]]
        rewards = tree["reward"].tolist()
        s = (tree_consistent_shaping(parent, rewards, train.shaping_gamma, train.shaping_lambda)
             if train.shaping else rewards)
        shaped += s
        adv += tree_group_advantage(s)
        flat += [is_flat(rewards)] * len(rewards)
    table["shaped"], table["advantage"], table["flat"] = shaped, adv, flat
    return table
