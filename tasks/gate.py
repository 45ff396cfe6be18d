"""The refine gate stage: does refining a failed program beat a fresh sample, per agent and across agents?

Fresh programs and refine attempts (:func:`mars2.eval.gate.gate_attempts`) scored on public tests as the tree scores
them, then graded once on hidden tests; the gate table compares them problem by problem (docs/eval.md, "The refine
gate").
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.config import AgentConfig, BackendConfig, GateConfig, GradingConfig, SearchConfig
from mars2.data.tables import cycle_subset, problems_from_frame
from mars2.io import atomic_write_json, atomic_write_text, write_parquet
from mars2.journal import Journal
from mars2.search.run import public_grader, search_sampling
from stagekit.engines import release
from stagekit.progress import stage_progress
from stagekit.stage import (StageContext, StageDeclaration, StageRecord, current_parameters, declared, run_declared,
                            stage_task)
from stagekit.runners import GENERATION_FIELDS, agent_runners

DECLARATION = StageDeclaration(
    name="gate", label="gate",
    modules=("mars2.backends", "mars2.search", "mars2.sandbox", "mars2.eval.gate", "mars2.eval.stats",
             "mars2.rl.verdicts", "mars2.data", "mars2.io", "tasks.gate", "stagekit.runners", "mars2.journal"),
    # how the trees sample (the gate samples as they do) and the engines' batch, the agents' generation fields
    reads={"search": ("temperature", "top_p", "max_new_tokens", "detailed_feedback", "seed", "batch_size"),
           "members": GENERATION_FIELDS})


@stage_task(DECLARATION)
def refine_gate(ctx: StageContext, gate: GateConfig, search: SearchConfig, grading: GradingConfig,
                backend: BackendConfig, members: list[AgentConfig], weight_record: StageRecord, agents: StageRecord,
                dataset: StageRecord) -> StageRecord:
    """``attempts.parquet`` (every fresh program and refine attempt with its public score and hidden verdict),
    ``gate.parquet`` (:func:`mars2.eval.gate.gate_table`), ``refine_outcomes.parquet`` and ``gate.md``; metrics
    ``passes``, ``<set>/{refine,fresh,delta,low,high,attempts}`` (logged as ``gate/...``).

    Each generation phase and each chunk of hidden verdicts is kept in the stage's journal as it is done: a killed
    gate run again with the same key redoes only the rest."""

    search, members = declared(search, DECLARATION.reads["search"]), declared(members, DECLARATION.reads["members"])

    def produce(out: Path, journal: Journal) -> dict:
        from mars2.eval.gate import ATTEMPTS, gate_attempts, gate_markdown, gate_metrics, gate_table, refine_outcomes
        from mars2.rl.verdicts import HIDDEN, unique_hidden_test_verdicts

        pool = pd.read_parquet(dataset.path(f"{gate.split}.parquet"))
        ids = cycle_subset(pool["id"].tolist(), 0, gate.max_problems)
        problems = problems_from_frame(pool.set_index("id").loc[ids].reset_index())
        owners = {m.owner for m in members}
        runners = agent_runners(members, {o: weight_record for o in owners}, agents, batch_size=search.batch_size,
                                backend=backend, ctx=ctx)
        sandbox = ctx.grading(grading)
        sampling = search_sampling(search, seed=search.seed)
        kept = len(journal.finished(ATTEMPTS)) + len(journal.finished(HIDDEN))
        note = f"resumed {kept} finished phases and chunks" if kept else None
        with stage_progress("gate", "programs", every_s=ctx.progress_every_s, note=note) as advance:
            attempts = gate_attempts(problems, runners, n_fresh=gate.n_fresh, n_pool=gate.n_pool,
                                     n_parents=gate.n_parents, sampling=sampling, grade=public_grader(sandbox),
                                     detailed_feedback=search.detailed_feedback,
                                     progress=lambda done, total: advance(done, total, phase="generate"),
                                     journal=journal)
            release(runners)
            graded = unique_hidden_test_verdicts(attempts, {p.id: p for p in problems}, sandbox,
                                                 progress=lambda done, total: advance(done, total, "hidden tests"),
                                                 journal=journal)
        table = gate_table(graded, n_boot=gate.n_boot, level=gate.level, seed=search.seed)
        outcomes = refine_outcomes(graded)
        write_parquet(out / "attempts.parquet", graded)
        write_parquet(out / "gate.parquet", table)
        write_parquet(out / "refine_outcomes.parquet", outcomes)
        atomic_write_text(out / "gate.md", gate_markdown(table, outcomes))
        atomic_write_json(out / "summary.json", {"split": gate.split, "n_problems": len(problems),
                                                 "table": table.to_dict(orient="records")})
        return {"metrics": gate_metrics(table), "meta": {"resumed": note} if note else {}}

    return run_declared(DECLARATION, ctx, current_parameters(), produce, journaled=True)
