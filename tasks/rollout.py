"""Rollout stage: the agents build one search tree per training problem (or sample independently)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.config import AgentConfig, BackendConfig, GradingConfig, SearchConfig
from mars2.data.tables import cycle_subset, problems_from_frame
from mars2.io import write_parquet
from mars2.journal import Journal
from stagekit.progress import stage_progress
from stagekit.stage import (Column, StageContext, StageDeclaration, StageRecord, count, current_parameters, declared,
                            percent, run_declared, stage_task)
from stagekit.engines import release
from stagekit.runners import GENERATION_FIELDS, agent_runners

DECLARATION = StageDeclaration(
    name="rollout", label="rollout", generates=True,
    modules=("mars2.backends", "mars2.search", "mars2.sandbox", "mars2.data", "mars2.io", "tasks.rollout",
             "stagekit.runners", "mars2.journal"),
    reads={"members": GENERATION_FIELDS},  # every search field; of the agents, how they generate
    columns=(Column("trees", "n_problems", count), Column("nodes", "n_nodes", count),
             Column("x-agent", "cross_agent_refine_share", percent, "refinements of another agent's program")))
TREES = "trees"  # the journal's part: one shard per finished tree


@stage_task(DECLARATION, task_run_name="rollout-c{cycle}")
def rollout(ctx: StageContext, search: SearchConfig, grading: GradingConfig, backend: BackendConfig,
            members: list[AgentConfig], weight_records: dict[str, StageRecord], agents: StageRecord,
            dataset: StageRecord, cycle: int, max_problems: int | None, rotate: bool = True) -> StageRecord:
    """Trees for cycle ``cycle``'s ``max_problems`` training problems (the next window each cycle, or with
    ``rotate=False`` the first window every cycle).

    ``trees.parquet``: one row per node (problem, node id, parent, depth, agent, prompt, response, code,
    token ids, rollout log-probs, public-test verdict and score); ``trees.png``: a few trees.

    Each tree is kept in the stage's journal as it is finished: a killed rollout run again with the same key keeps
    its finished trees and builds only the others (a tree depends only on its problem and the seeds), and the table
    is always assembled from the journal, so a resumed run writes what an uninterrupted one does."""

    members = declared(members, DECLARATION.reads["members"])

    def produce(out: Path, journal: Journal) -> dict:
        from mars2.search.run import public_grader, resumable_search, search_sampling
        from mars2.search.tree_stats import plot_trees, tree_stats

        train = pd.read_parquet(dataset.path("train.parquet"))
        ids = cycle_subset(train["id"].tolist(), cycle, max_problems, rotate)
        problems = problems_from_frame(train.set_index("id").loc[ids].reset_index())
        resumed = len(journal.finished(TREES).keys() & {p.id for p in problems})
        note = f"resumed {resumed}/{len(problems)} trees" if resumed else None
        runners = agent_runners(members, weight_records, agents, batch_size=search.batch_size, backend=backend,
                                ctx=ctx) if resumed < len(problems) else {}
        sampling = search_sampling(search, seed=search.seed + 7919 * cycle)
        with stage_progress(f"rollout c{cycle}", "nodes", every_s=ctx.progress_every_s, note=note) as advance:
            grade = public_grader(ctx.grading(grading))  # its slots within the run's CPU budget
            nodes = resumable_search(problems, runners, search, sampling, grade, journal, TREES, advance)
        release(runners)
        write_parquet(out / "trees.parquet", nodes)
        plot_trees(nodes, out / "trees.png")
        return {"metrics": {**tree_stats(nodes), "n_nodes": len(nodes), "n_problems": len(problems)},
                "meta": {"resumed": note} if note else {}}

    return run_declared(DECLARATION, ctx, current_parameters(), produce, journaled=True)
