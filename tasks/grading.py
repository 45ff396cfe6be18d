"""Stage 3 — grading: run every sampled program against the hidden tests in the sandbox."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task

from mars2.config import GradingConfig
from mars2.data.tables import problems_from_frame
from mars2.io import write_parquet
from tasks.stage import StageContext, StageRecord, cache_key_fn, current_parameters, run_stage

STAGE = "grading"
MODULES = ("mars2.sandbox", "mars2.data", "mars2.io", "tasks.grading")


@task(name=STAGE, cache_key_fn=cache_key_fn(STAGE, MODULES), persist_result=True, task_run_name="grading-c{cycle}")
def grade(ctx: StageContext, grading: GradingConfig, samples: StageRecord, dataset: StageRecord,
          cycle: int) -> StageRecord:
    """``verdicts.parquet``: per node, the verdict on the hidden tests and the binary reward (1 iff all pass)."""

    def produce(out: Path) -> dict:
        rows = pd.read_parquet(samples.path("trees.parquet"), columns=["problem_id", "node_id", "agent", "code"])
        verdicts = grade_rows(rows, dataset, "train.parquet", grading)
        times = verdicts.attrs.pop("time_s")
        public_only = verdicts.attrs.pop("public_only")
        write_parquet(out / "verdicts.parquet", verdicts)
        return {"metrics": {**verdict_metrics(verdicts), "program_seconds_mean": times["mean"],
                            "program_seconds_max": times["max"], "graded_on_public_tests": public_only}}

    return run_stage(STAGE, MODULES, ctx, current_parameters(), produce)


def grade_rows(rows: pd.DataFrame, dataset: StageRecord, split: str, grading: GradingConfig) -> pd.DataFrame:
    """Grade the ``code`` column of ``rows`` on each problem's hidden tests; adds verdict columns and ``reward``.

    A problem without hidden tests (e.g. the public-only LCB v5 copy) is graded on its public tests; their
    number is reported as ``graded_on_public_tests``.

    Wall times stay out of the table (they would make identical verdicts hash differently and defeat the
    downstream cache); their summary goes to ``table.attrs["time_s"]`` for metrics.
    """
    from mars2.data import gradable
    from mars2.sandbox import GradeJob, grade_many

    problems = {p.id: p for p in problems_from_frame(pd.read_parquet(dataset.path(split)))}
    # a node without code reads back from Parquet as NaN (pandas' string dtype), not None
    codes = [c if isinstance(c, str) else None for c in rows["code"]]
    jobs = [
        GradeJob(*gradable(code, problems[pid].hidden_tests or problems[pid].public_tests, problems[pid].func_name))
        for pid, code in zip(rows["problem_id"], codes, strict=True)
    ]
    verdicts = grade_many(jobs, workers=grading.workers or None, time_limit_s=grading.time_limit_s,
                          memory_mb=grading.memory_mb, progress=True, isolation=grading.isolation,
                          parity=grading.parity, stop_at_first_failure=grading.stop_at_first_failure)
    table = rows.drop(columns=["code"]).reset_index(drop=True)
    table["status"] = [v.status for v in verdicts]
    table["passed"] = [v.passed for v in verdicts]
    table["total"] = [v.total for v in verdicts]
    table["detail"] = [v.detail for v in verdicts]
    table["reward"] = [1.0 if v.all_passed else 0.0 for v in verdicts]
    table.attrs["public_only"] = sum(not problems[pid].hidden_tests for pid in rows["problem_id"])
    times = [v.time_s for v in verdicts] or [0.0]
    table.attrs["time_s"] = {"mean": sum(times) / len(times), "max": max(times)}
    return table


def verdict_metrics(verdicts: pd.DataFrame) -> dict[str, float]:
    metrics = {f"{agent}/pass_rate": float(g["reward"].mean()) for agent, g in verdicts.groupby("agent")}
    metrics["pass_rate"] = float(verdicts["reward"].mean())
    metrics.update({f"status/{s}": float(n) for s, n in verdicts["status"].value_counts().items()})
    return metrics
