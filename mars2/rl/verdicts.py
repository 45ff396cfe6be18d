"""The node reward: r_v = 1 iff the program passes all hidden tests (docs/algorithm.md §8), on tables of nodes."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from mars2.config import GradingConfig
from mars2.data.schema import Problem
from mars2.journal import Journal, in_chunks


def correctness_reward(all_passed: bool) -> float:
    """r_v ∈ {0, 1}: 1 iff every hidden test passes (partial credit is the search signal, never the reward)."""
    return 1.0 if all_passed else 0.0


def hidden_test_verdicts(rows: pd.DataFrame, problems: Mapping[str, Problem], grading: GradingConfig,
                         *, progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Grade the ``code`` column of ``rows`` (problem_id, code, ...) on each problem's hidden tests in the sandbox;
    returns ``rows`` without ``code`` plus status, passed, total, detail and ``reward``. ``progress``: told
    ``(graded, total)`` after each program.

    A problem without hidden tests (the public-only LCB v5 copy) is graded on its public tests (the stages count
    them: ``graded_on_public_tests``). Wall times stay out of the table (identical verdicts must hash the same, or the
    downstream cache breaks): each program's is in the list ``table.attrs["time_s"]``.
    """
    from mars2.data.checks import gradable
    from mars2.sandbox import GradeJob, grade_many

    # a node without code reads back from Parquet as NaN (pandas' string dtype), not None
    codes = [c if isinstance(c, str) else None for c in rows["code"]]
    jobs = [GradeJob(*gradable(code, problems[pid].hidden_tests or problems[pid].public_tests, problems[pid].func_name))
            for pid, code in zip(rows["problem_id"], codes, strict=True)]
    verdicts = grade_many(jobs, grading=grading, progress=progress)
    table = rows.drop(columns=["code"]).reset_index(drop=True)
    table["status"] = [v.status for v in verdicts]
    table["passed"] = [v.passed for v in verdicts]
    table["total"] = [v.total for v in verdicts]
    table["detail"] = [v.detail for v in verdicts]
    table["reward"] = [correctness_reward(v.all_passed) for v in verdicts]
    table.attrs["time_s"] = [v.time_s for v in verdicts]
    return table


HIDDEN = "hidden"  # the journal's part of a stage's distinct programs' hidden verdicts


def unique_hidden_test_verdicts(rows: pd.DataFrame, problems: Mapping[str, Problem],
                                grading: GradingConfig, *,
                                progress: Callable[[int, int], None] | None = None,
                                journal: Journal | None = None, part: str = HIDDEN) -> pd.DataFrame:
    """:func:`hidden_test_verdicts` where each distinct (problem, program) runs once; ``rows`` keep their columns.
    With ``journal``, the distinct programs are graded in chunks kept under ``part`` (:func:`mars2.journal.in_chunks`):
    a chunk an earlier run of the stage key kept is not graded again."""
    keys = rows[["problem_id", "code"]].drop_duplicates().reset_index(drop=True)

    def grade(chunk: pd.DataFrame, told: Callable[[int, int], None] | None) -> pd.DataFrame:
        chunk = chunk.reset_index(drop=True)
        verdicts = hidden_test_verdicts(chunk.assign(node_id=range(len(chunk)), agent=""), problems, grading,
                                        progress=told)
        return pd.concat([chunk, verdicts[["status", "passed", "total", "reward"]]], axis=1)

    verdicts = in_chunks(journal, part, keys, grade, progress)[0] if journal is not None else grade(keys, progress)
    return rows.merge(verdicts, on=["problem_id", "code"], how="left", validate="many_to_one")


def verdict_metrics(verdicts: pd.DataFrame) -> dict[str, float]:
    """Pass rate (mean reward) overall and per agent; with the nodes' ``action`` (and ``parent_agent``), the pass rate
    of fresh programs (``generate_pass_rate``), of refinements (``refine_pass_rate``) and of refinements of another
    agent's program (``cross_refine_pass_rate``), each only where there are such nodes; the count of each verdict
    status, and ``sandbox_failures``: programs whose slot failed twice (``RE``, "sandbox failure"; a rising count is
    a host problem, or a policy learning to break its sandbox)."""
    metrics = {f"{agent}/pass_rate": float(g["reward"].mean()) for agent, g in verdicts.groupby("agent")}
    metrics["pass_rate"] = float(verdicts["reward"].mean())
    if "action" in verdicts:
        refine = verdicts["action"] == "refine"
        parts = {"generate_pass_rate": ~refine, "refine_pass_rate": refine}
        if "parent_agent" in verdicts:
            parts["cross_refine_pass_rate"] = refine & (verdicts["parent_agent"] != verdicts["agent"])
        metrics |= {name: float(verdicts.loc[rows, "reward"].mean()) for name, rows in parts.items() if rows.any()}
    if "detail" in verdicts:
        metrics["sandbox_failures"] = float(verdicts["detail"].str.startswith("sandbox failure").sum())
    metrics.update({f"status/{s}": float(n) for s, n in verdicts["status"].value_counts().items()})
    return metrics
