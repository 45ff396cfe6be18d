"""Dataset prep stage: load and validate problems, select, split train/eval, write Parquet + a summary."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.config import DataConfig
from mars2.data.sources import REJECT_COLUMNS, build_dataset, input_files, summary_metrics
from mars2.data.tables import problems_to_frame
from mars2.io import atomic_write_json, sha256_file, sha256_json, write_parquet
from stagekit.stage import StageContext, StageDeclaration, StageRecord, current_parameters, run_declared, stage_task

DECLARATION = StageDeclaration(name="data", label="data", facts=True,
                               modules=("mars2.data", "mars2.io", "tasks.data"))


@stage_task(DECLARATION)
def prepare_dataset(ctx: StageContext, data: DataConfig, input_hash: str) -> StageRecord:
    """Problems → ``train.parquet``, ``eval.parquet``, ``rejected.parquet`` (every bad row: file, line, reason),
    ``summary.json`` (counts by platform/difficulty/test type, date range, content hashes, input files) and,
    for the toy set and HumanEval, ``reference_solutions.json``; for the known-answer set, ``wrong_readings.json`` too.

    ``input_hash`` is the digest of the input files (see :func:`source_hash`), so edited data re-runs the stage.
    With ``data.reject_fatal`` any rejected row fails the stage with a message listing the rejects.
    """

    def produce(out: Path) -> dict:
        ds = build_dataset(data)
        if ds.reference_solutions is not None:
            atomic_write_json(out / "reference_solutions.json", ds.reference_solutions)
        if ds.wrong_readings is not None:
            atomic_write_json(out / "wrong_readings.json", ds.wrong_readings)
        write_parquet(out / "train.parquet", problems_to_frame(ds.train))
        write_parquet(out / "eval.parquet", problems_to_frame(ds.eval))
        write_parquet(out / "rejected.parquet", pd.DataFrame(ds.rejected, columns=REJECT_COLUMNS))
        atomic_write_json(out / "summary.json", ds.summary)
        return {"metrics": summary_metrics(ds.summary),
                "meta": {"content_hash": ds.summary["content_hash"], "train_hash": ds.summary["train"]["content_hash"],
                         "eval_hash": ds.summary["eval"]["content_hash"],
                         "contest_dates": [ds.summary["contest_date"]["min"], ds.summary["contest_date"]["max"]]}}

    return run_declared(DECLARATION, ctx, current_parameters(), produce)


def source_hash(data: DataConfig) -> str:
    """Digest of the contents of the files a data config reads ("" for the generated toy set).

    Only the files the config selects count (a release's ``test*.jsonl``, the eval id list, ...): touching or
    adding an unrelated file leaves it unchanged; editing a selected file changes it.
    """
    files = input_files(data)
    return sha256_json([[f.name, sha256_file(f)] for f in files]) if files else ""
