"""Grading stage: run every sampled program against the hidden tests in the sandbox."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.config import GradingConfig
from mars2.data.tables import problems_from_frame
from mars2.io import write_parquet
from pipeline.progress import stage_progress
from pipeline.stage import StageContext, StageRecord, current_parameters, run_stage, stage_task

STAGE = "grading"
MODULES = ("mars2.sandbox", "mars2.rl.reward", "mars2.data", "mars2.io", "tasks.grading")


@stage_task(STAGE, task_run_name="grading-c{cycle}")
def grade(ctx: StageContext, grading: GradingConfig, samples: StageRecord, dataset: StageRecord,
          cycle: int) -> StageRecord:
    """``verdicts.parquet``: per node, the verdict on the hidden tests and the binary reward (1 iff all pass)."""

    def produce(out: Path) -> dict:
        from mars2.rl.reward import hidden_test_verdicts, verdict_metrics

        columns = ["problem_id", "node_id", "agent", "action", "parent_agent", "code"]
        rows = pd.read_parquet(samples.path("trees.parquet"), columns=columns)
        with stage_progress(f"grading c{cycle}", "programs", every_s=ctx.progress_every_s) as advance:
            verdicts = hidden_test_verdicts(rows, problems_by_id(dataset, "train.parquet"), ctx.grading(grading),
                                            progress=advance)
        times = verdicts.attrs.pop("time_s")
        public_only = verdicts.attrs.pop("public_only")
        write_parquet(out / "verdicts.parquet", verdicts)
        return {"metrics": {**verdict_metrics(verdicts), "program_seconds_mean": times["mean"],
                            "program_seconds_max": times["max"], "graded_on_public_tests": public_only}}

    return run_stage(STAGE, MODULES, ctx, current_parameters(), produce)


def problems_by_id(dataset: StageRecord, split: str) -> dict:
    """The problems of a data-stage split (``train.parquet`` or ``eval.parquet``) by id."""
    return {p.id: p for p in problems_from_frame(pd.read_parquet(dataset.path(split)))}
