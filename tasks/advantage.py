"""Advantage stage: rewards, tree-consistent shaping, path-level group advantage, routing to agents."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.config import AgentConfig, SearchConfig, TrainConfig
from mars2.io import write_parquet
from mars2.rl.tables import TRAIN_READS
from stagekit.stage import (Column, StageContext, StageDeclaration, StageRecord, current_parameters, declared, percent,
                            run_declared, stage_task, three_decimals)

DECLARATION = StageDeclaration(
    name="advantage", label="advantage",
    modules=("mars2.rl", "mars2.io", "tasks.advantage"),
    # the shaping and filtering settings, the reward's length limit L_max, and who owns whose weights
    reads={"train": (*TRAIN_READS, "filter_flat_trees"), "search": ("max_new_tokens",),
           "members": ("name", "shares_weights_with")},
    columns=(Column("flat", "flat_tree_share", percent, "trees with equal rewards (nothing trained)"),
             Column("|Â|", "advantage_abs_mean", three_decimals, "mean |advantage|")))


@stage_task(DECLARATION, task_run_name="advantage-c{cycle}")
def compute_advantages(ctx: StageContext, train: TrainConfig, search: SearchConfig, members: list[AgentConfig],
                       trees: StageRecord, verdicts: StageRecord, cycle: int) -> StageRecord:
    """``routed/<owner>.parquet``: each weight owner's nodes with token ids, rollout log-probs and advantage
    (:func:`mars2.rl.tables.tree_advantages`: every tree scored as one group before routing)."""

    train, search = declared(train, DECLARATION.reads["train"]), declared(search, DECLARATION.reads["search"])
    members = declared(members, DECLARATION.reads["members"])

    def produce(out: Path) -> dict:
        from mars2.rl.tables import advantage_metrics, route, routed_metrics, tree_advantages

        scored = tree_advantages(
            pd.read_parquet(trees.path("trees.parquet"),
                            columns=["problem_id", "node_id", "parent", "agent", "prompt_ids", "response_ids",
                                     "logprobs", "response_len"]),
            pd.read_parquet(verdicts.path("verdicts.parquet"), columns=["problem_id", "node_id", "reward"]),
            train, max_len=search.max_new_tokens)
        kept = scored[~scored["flat"]] if train.filter_flat_trees else scored
        metrics = advantage_metrics(scored, kept)
        routed = route(kept, {m.name: m.owner for m in members})
        for owner, part in routed.items():
            write_parquet(out / "routed" / f"{owner}.parquet", part)
        return {"metrics": {**metrics, **routed_metrics(routed)}}

    return run_declared(DECLARATION, ctx, current_parameters(), produce)
