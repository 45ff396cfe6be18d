"""Evaluate agents on a held-out set: Pass@1, Pass@1(MCTS), Pass@N per agent and for the team, with and without T+.

    python flows/evaluate.py                                     # base tiny agents on the toy benchmark
    python flows/evaluate.py data=humaneval                      # ... on HumanEval
    python flows/evaluate.py data=lcb_v5_public                  # LCB v5 public tests (stand in for hidden ones)
    python flows/evaluate.py eval.from_run=<mlflow run id>       # the final weights of a train-cycle run
    python flows/evaluate.py +eval.checkpoints.qwen_tiny=/path/to/model  # any model folder, per weight owner
    python flows/evaluate.py agents=tiny_cpu_warm data=toy_warm  # warm-started agents (bootstrap stage)

Composes ``conf/evaluate.yaml`` (the train config with ``eval=full``) with the same overrides the train flow
takes; the evaluation stage is the one a train cycle ends with (docs/eval.md), cached like every stage.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tasks.runtime import configure_process, use_cpu_budget

configure_process(temporary_server=__name__ == "__main__")  # before Prefect/MLflow/transformers load (tasks/runtime.py)
import hydra
from omegaconf import DictConfig
from prefect import flow
from prefect.runtime import flow_run

from tasks import tracking
from tasks.weights import owner_of
from tasks.stage import StageContext, StageRecord
from tasks.bootstrap import needs_bootstrap
from tasks.checkpoints import checkpoint_hashes
from tasks.cli import check_command_line, run_flow_from_cli
from tasks.config import CONF_DIR, compose_run, to_container, to_yaml
from tasks.data import source_hash
from tasks.engines import engine_pool
from tasks.report import RunReport
from tasks.stages import bound

CONFIG_NAME = "evaluate"


def compose_eval(overrides: list[str]):
    return compose_run(overrides, config_name=CONFIG_NAME, check_fit=False)  # no update to fit


def checkpoints_of(cfg) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """``{owner: folder}`` from ``eval.from_run`` and ``eval.checkpoints`` (the latter wins) and their file hashes."""
    owners = [owner_of(m) for m in cfg.agents.members if m.shares_weights_with is None]
    checkpoints = dict(cfg.eval.checkpoints)
    if cfg.eval.from_run:
        checkpoints = tracking.final_weights(cfg, cfg.eval.from_run) | checkpoints
    return checkpoints, checkpoint_hashes(checkpoints, owners)


@flow(name="evaluate")
def evaluate_agents(overrides: list[str] | None = None) -> dict:
    """Evaluate the agents of ``overrides`` (Hydra overrides of ``conf/evaluate.yaml``); returns the run summary."""
    cfg = compose_eval(overrides or [])
    ctx = StageContext(root=str(Path(cfg.paths.root).resolve()), flow_run_id=str(flow_run.id),
                       progress_every_s=cfg.progress_every_s, cpus=cfg.cpus)
    use_cpu_budget(ctx.cpus)
    run = tracking.open_run(cfg, to_container(cfg), to_yaml(cfg), flow_run_id=ctx.flow_run_id,
                            run_name=f"eval-{cfg.agents.preset}-{flow_run.name}", kind="evaluate")
    report = RunReport(cfg, ctx, run, title="mars2 evaluation")
    stage = bound(cfg.paths.root)
    members = cfg.agents.members
    owners = [owner_of(m) for m in members if m.shares_weights_with is None]
    metrics: dict[str, float] = {}
    # one generation engine per weight owner
    with engine_pool(cfg.backend.persistent, ctx, cfg.backend.start_timeout_s) as engines:
        try:
            dataset, agents, weights = team_weights(cfg, ctx, stage, report)
            result = report.done(stage.evaluate(ctx, cfg.eval, cfg.search, cfg.grading, cfg.backend, members,
                                                {o: weights for o in owners}, agents, dataset, 0,
                                                cfg.data.max_eval_problems), cycle=0, label="eval")
            metrics = result.metrics
        except BaseException:
            report.finish("FAILED", metrics, {"engine_starts": engines.starts}, stage.failed)
            raise
        return report.finish("FINISHED", metrics, {"engine_starts": engines.starts})


def team_weights(cfg, ctx: StageContext, stage, report: RunReport) -> tuple[StageRecord, StageRecord, StageRecord]:
    """The data (logged to the run as its datasets), the agents (warm-started where the preset says so, unless every
    owner has a checkpoint) and the weights to evaluate: the agents', or the checkpoints of ``eval.from_run`` /
    ``eval.checkpoints`` imported over them."""
    members = cfg.agents.members
    owners = [owner_of(m) for m in members if m.shares_weights_with is None]
    checkpoints, hashes = checkpoints_of(cfg)
    dataset = report.done(stage.prepare_dataset(ctx, cfg.data, source_hash(cfg.data)), cycle=0)
    report.run.log(lambda run_id: tracking.log_datasets(cfg, run_id, dataset))
    agents = report.done(stage.init_agents(ctx, members, dataset), cycle=0)
    if needs_bootstrap(members) and not set(owners) <= set(checkpoints):
        agents = report.done(stage.bootstrap_agents(ctx, members, agents, dataset, cfg.grading), cycle=0)
    weights = agents
    if checkpoints:
        weights = report.done(stage.import_checkpoints(ctx, checkpoints, hashes, agents), cycle=0)
    return dataset, agents, weights


@hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")
def main(_: DictConfig) -> None:
    run_flow_from_cli(lambda overrides: checkpoints_of(compose_eval(overrides)), evaluate_agents, "evaluation")


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
