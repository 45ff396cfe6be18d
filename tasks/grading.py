"""Grading stage: run every sampled program against the hidden tests in the sandbox."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.config import GradingConfig
from mars2.data.tables import problems_from_frame
from mars2.io import write_parquet
from mars2.journal import CHUNK, Journal, in_chunks
from stagekit.progress import stage_progress
from stagekit.stage import (Column, StageContext, StageDeclaration, StageRecord, current_parameters, percent,
                            run_declared, stage_task)

DECLARATION = StageDeclaration(
    name="grading", label="grading",
    modules=("mars2.sandbox", "mars2.rl.verdicts", "mars2.data", "mars2.io", "tasks.grading", "mars2.journal"),
    columns=(Column("pass", "pass_rate", percent, "rollouts passing the hidden tests"),
             Column("refine", "refine_pass_rate", percent, "refinements passing them")))
VERDICTS = "verdicts"  # the journal's part: one shard per graded chunk


@stage_task(DECLARATION, task_run_name="grading-c{cycle}")
def grade(ctx: StageContext, grading: GradingConfig, samples: StageRecord, dataset: StageRecord,
          cycle: int) -> StageRecord:
    """``verdicts.parquet``: per node, the verdict on the hidden tests and the binary reward (1 iff all pass).

    Programs are graded in chunks (:func:`mars2.journal.in_chunks`), each kept in the stage's journal: a killed
    grading run again with the same key grades only the chunks it had not finished."""

    def produce(out: Path, journal: Journal) -> dict:
        from mars2.rl.verdicts import hidden_test_verdicts, verdict_metrics

        columns = ["problem_id", "node_id", "agent", "action", "parent_agent", "code"]
        rows = pd.read_parquet(samples.path("trees.parquet"), columns=columns)
        problems = problems_by_id(dataset, "train.parquet")
        sandbox = ctx.grading(grading)

        def chunk(part: pd.DataFrame, progress) -> pd.DataFrame:
            verdicts = hidden_test_verdicts(part, problems, sandbox, progress=progress)
            return verdicts.assign(time_s=verdicts.attrs.pop("time_s"))

        resumed = len(journal.finished(VERDICTS))
        note = f"resumed {resumed}/{-(-len(rows) // CHUNK)} chunks of {CHUNK} programs" if resumed else None
        with stage_progress(f"grading c{cycle}", "programs", every_s=ctx.progress_every_s, note=note) as advance:
            verdicts, _ = in_chunks(journal, VERDICTS, rows, chunk, advance)
        times = verdicts.pop("time_s")
        public_only = sum(not problems[pid].hidden_tests for pid in rows["problem_id"])
        write_parquet(out / "verdicts.parquet", verdicts)
        return {"metrics": {**verdict_metrics(verdicts), "program_seconds_mean": float(times.mean()) if len(times) else 0.0,
                            "program_seconds_max": float(times.max()) if len(times) else 0.0,
                            "graded_on_public_tests": public_only},
                "meta": {"resumed": note} if note else {}}

    return run_declared(DECLARATION, ctx, current_parameters(), produce, journaled=True)


def problems_by_id(dataset: StageRecord, split: str) -> dict:
    """The problems of a data-stage split (``train.parquet`` or ``eval.parquet``) by id."""
    return {p.id: p for p in problems_from_frame(pd.read_parquet(dataset.path(split)))}
