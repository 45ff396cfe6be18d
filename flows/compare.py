"""Put MLflow runs side by side in the paper's layout (Base / GRPO / single / homogeneous / heterogeneous ×
Pass@1 / Pass@1(MCTS) / Pass@N, mean ± std over seeds), print it, and log it as a new MLflow run.

    python flows/compare.py 'compare.runs=[<run id>,<run id>]'
    python flows/compare.py compare.parent=<study run id> compare.agent=qwen_tiny
    python flows/compare.py                                  # every train/evaluate run of the experiment

A run's arm is its ``mars2.arm`` tag (set by flows/study.py), else derived from its config params (GRPO =
``search.strategy=independent``, else ``agents.paradigm``; an evaluation of un-trained agents = base); its
values are its latest ``eval/...`` metrics. No Prefect here: it only reads and writes MLflow.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.runtime import configure_process

configure_process()  # PREFECT_HOME, offline hub flags, quiet warnings: before Prefect/MLflow/transformers load
import hydra
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from mars2.config import CompareConfig, ConfigError, PathsConfig, RunConfig
from mars2.eval.arms import ARM_NAMES, METRIC_NAMES, METRICS, arm_of, comparison_table, plot_comparison, \
    run_row, to_markdown
from mars2.io import atomic_write_text
from pipeline import tracking
from pipeline.config import CONF_DIR, compose_run


def split_config(cfg: DictConfig) -> tuple[RunConfig, CompareConfig]:
    """The run config (default, with this command's ``paths``: where MLflow is) and the compare section."""
    from dataclasses import replace

    from omegaconf.errors import OmegaConfBaseException

    try:
        compare = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(CompareConfig), cfg.compare))
        paths = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PathsConfig), cfg.paths))
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config: {' '.join(str(e).split())}") from None
    return replace(compose_run([]), paths=paths), compare


def collect_runs(cfg: RunConfig, compare: CompareConfig) -> pd.DataFrame:
    """One row per run with eval metrics: run_id, name, arm, seed, and the three headline values."""
    from mlflow.exceptions import MlflowException

    client = tracking.client(cfg)
    if compare.runs:
        try:
            runs = [client.get_run(r) for r in compare.runs]
        except MlflowException as e:
            raise ConfigError(f"compare.runs: {e.message.splitlines()[0]}") from None
    else:
        exp = client.get_experiment_by_name(cfg.paths.experiment)
        if exp is None:
            raise ConfigError(f"no MLflow experiment {cfg.paths.experiment!r} at {tracking.tracking_uri(cfg)}")
        query = f"tags.mlflow.parentRunId = '{compare.parent}'" if compare.parent else ""
        runs = [r for r in client.search_runs([exp.experiment_id], filter_string=query, max_results=5000)
                if r.data.tags.get("mars2.kind", "train") in ("train", "evaluate")]
    rows = []
    for run in runs:
        if not any(k.startswith("eval/") for k in run.data.metrics):
            continue
        rows.append({"run_id": run.info.run_id, "name": run.info.run_name,
                     "arm": arm_of(run.data.params, run.data.tags), "seed": run.data.params.get("seed"),
                     **run_row(run.data.metrics, agent=compare.agent)})
    if not rows:
        raise ConfigError("none of the selected runs has evaluation metrics (eval/...) to compare")
    return pd.DataFrame(rows)


def print_table(table: pd.DataFrame) -> None:
    out = Table(title="comparison (held-out, %; mean ± std over seeds)")
    out.add_column("arm")
    for m in METRICS:
        out.add_column(METRIC_NAMES[m], justify="right")
    out.add_column("seeds", justify="right")
    for _, r in table.iterrows():
        cells = [("-" if r[f"{m}_mean"] != r[f"{m}_mean"] else f"{100 * r[f'{m}_mean']:.1f}")
                 + ("" if r[f"{m}_std"] != r[f"{m}_std"] else f" ± {100 * r[f'{m}_std']:.1f}") for m in METRICS]
        out.add_row(ARM_NAMES.get(r["arm"], r["arm"]), *cells, str(int(r["n_seeds"])))
    Console().print(out)


@hydra.main(config_path=str(CONF_DIR), config_name="compare_config", version_base="1.3")
def main(raw: DictConfig) -> None:
    try:
        cfg, compare = split_config(raw)
        runs = collect_runs(cfg, compare)
    except ConfigError as e:
        sys.exit(f"mars2: compare: {e}")
    table = comparison_table(runs.to_dict(orient="records"))
    print_table(table)
    run_id = tracking.start_run(cfg, {"compare": OmegaConf.to_container(OmegaConf.structured(compare))}, "",
                                flow_run_id="", run_name="compare", kind="compare", parent_run_id=compare.parent)
    out = Path(compare.out_dir or Path(cfg.paths.root) / "compare" / run_id)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "comparison.md", to_markdown(table))
    atomic_write_text(out / "runs.csv", runs.to_csv(index=False))
    plot_comparison(table, out / "comparison.png")
    for f in sorted(out.iterdir()):
        tracking.log_table(cfg, run_id, f, "compare")
    tracking.end_run(cfg, run_id, "FINISHED")
    print(f"logged to MLflow run {run_id} ({tracking.tracking_uri(cfg)}); files in {out}")


if __name__ == "__main__":
    main()
