"""Evaluation stage: every agent alone and the team on the held-out split, graded on hidden tests.

Two kinds of evidence (docs/eval.md):

* i.i.d. samples: ``eval.n_samples`` per agent per problem (greedy by default) → Pass@1, pass@k;
* evaluation trees: the team's shared AB-MCTS-A tree (and, with ``eval.per_agent_trees``, one per agent alone)
  of ``eval.max_nodes`` nodes, built with and/or without T+ (``eval.tplus``) → Pass@1(MCTS), Pass@N.

The search sees only public tests; every program is then graded once on the hidden tests (identical programs
of one problem share a verdict). A problem without hidden tests is graded on its public tests and counted in
``graded_on_public_tests`` (the offline LCB v5 copy: its numbers are *public-test* numbers, not LCB scores).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.config import AgentConfig, BackendConfig, EvalConfig, GradingConfig, SearchConfig
from mars2.data.tables import cycle_subset, problems_from_frame
from mars2.io import atomic_write_json, write_parquet
from mars2.eval.run import SEARCH_READS
from mars2.journal import Journal
from mars2.search.run import public_grader
from stagekit.progress import stage_progress
from stagekit.stage import (Column, StageContext, StageDeclaration, StageRecord, current_parameters, declared, percent,
                            run_declared, stage_task)
from stagekit.engines import release
from stagekit.runners import GENERATION_FIELDS, agent_runners

DECLARATION = StageDeclaration(
    name="evaluation", label="eval", generates=True,
    # The mars2.eval modules an evaluation runs, not the whole package: the study's statistics and plots
    # (mars2.eval.stats, mars2.eval.arms) do not change what an evaluation produces, so editing them must not re-run it.
    modules=("mars2.backends", "mars2.search", "mars2.sandbox", "mars2.eval.run", "mars2.eval.report",
             "mars2.eval.metrics", "mars2.eval.diversity", "mars2.rl.verdicts", "mars2.data", "mars2.io",
             "tasks.evaluation", "stagekit.runners", "mars2.journal"),
    # the search settings the evaluation trees take (and the engines' batch), the agents' generation fields
    reads={"search": (*SEARCH_READS, "batch_size"), "members": GENERATION_FIELDS},
    columns=(Column("Pass@1", "team/pass_at_1", percent, "the team's, held out"),))


@stage_task(DECLARATION, task_run_name="evaluation-c{cycle}")
def evaluate(ctx: StageContext, evaluation: EvalConfig, search: SearchConfig, grading: GradingConfig,
             backend: BackendConfig, members: list[AgentConfig], weight_records: dict[str, StageRecord],
             agents: StageRecord, dataset: StageRecord, cycle: int, max_problems: int | None) -> StageRecord:
    """``samples.parquet``, ``eval_trees.parquet`` (every program with its public score and hidden verdict),
    ``results.parquet`` (one row per problem × who × kind × T+), ``summary.json``, ``by_difficulty.png``;
    metrics named as in :mod:`mars2.eval.report` (``<agent>/pass_at_1``, ``team/pass_at_1_mcts``, …).

    Each problem's samples and each tree are kept in the stage's journal as they are finished, then the distinct
    programs' hidden verdicts chunk by chunk: a killed evaluation run again with the same key redoes only the rest."""

    search, members = declared(search, DECLARATION.reads["search"]), declared(members, DECLARATION.reads["members"])

    def produce(out: Path, journal: Journal) -> dict:
        from mars2.eval.report import evaluation_metrics, headline, per_problem_results, plot_difficulty
        from mars2.eval.run import evaluation_parts, evaluation_rollouts
        from mars2.rl.verdicts import unique_hidden_test_verdicts

        table = f"{evaluation.split}.parquet"
        pool = pd.read_parquet(dataset.path(table))
        ids = cycle_subset(pool["id"].tolist(), 0, max_problems)
        frame = pool.set_index("id").loc[ids].reset_index()
        problems = problems_from_frame(frame)
        labels = frame[["id", "difficulty", "platform"]].rename(columns={"id": "problem_id"})
        parts = evaluation_parts(evaluation, [m.name for m in members])
        kept = {part: len(journal.finished(part)) for part in parts}
        generated = all(n == len(problems) for n in kept.values())
        note = (f"resumed {sum(kept.values())}/{len(parts) * len(problems)} problems' samples and trees"
                if any(kept.values()) else None)
        # all generated: no engine is loaded (the rollouts read every part back; the names still say which trees)
        runners = dict.fromkeys(m.name for m in members) if generated else \
            agent_runners(members, weight_records, agents, batch_size=search.batch_size, backend=backend, ctx=ctx)
        sandbox = ctx.grading(grading)  # its slots within the run's CPU budget
        with stage_progress(f"eval c{cycle}" if cycle >= 0 else "eval before", "programs",
                            every_s=ctx.progress_every_s, note=note) as advance:
            samples, trees = evaluation_rollouts(problems, evaluation, search, public_grader(sandbox), runners,
                                                 lambda done, total: advance(done, total, phase="generate"), journal)
            if not generated:
                release(runners)
            graded = unique_hidden_test_verdicts(pd.concat([samples.assign(kind="samples"),
                                                            trees.assign(kind="tree")], ignore_index=True),
                                                 {p.id: p for p in problems}, sandbox,
                                                 progress=lambda done, total: advance(done, total, "hidden tests"),
                                                 journal=journal)
        public_only = sum(not p.hidden_tests for p in problems)
        graded = graded.merge(labels, on="problem_id", how="left")
        samples = graded[graded["kind"] == "samples"].drop(columns=["kind", "who", "tplus", "score"], errors="ignore")
        trees = graded[graded["kind"] == "tree"].drop(columns=["kind"])
        results = per_problem_results(samples, trees, evaluation.ks)
        metrics = evaluation_metrics(results, trees, ks=evaluation.ks, diversity_k=evaluation.diversity_k)
        metrics["graded_on_public_tests"] = public_only
        for name, table in (("samples", samples), ("eval_trees", trees), ("results", results)):
            table = table.reset_index(drop=True)
            table.attrs.clear()
            write_parquet(out / f"{name}.parquet", table)
        atomic_write_json(out / "summary.json", {
            "cycle": cycle, "n_problems": len(problems), "graded_on_public_tests": public_only,
            "hidden_tests": "public tests stand in" if public_only else "hidden",
            "headline": headline(metrics).reset_index().to_dict(orient="records"), "metrics": metrics})
        plot_difficulty(results, out / "by_difficulty.png")
        return {"metrics": metrics, "meta": {"resumed": note} if note else {}}

    return run_declared(DECLARATION, ctx, current_parameters(), produce, journaled=True)
