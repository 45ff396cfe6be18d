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

from pipeline.runtime import configure_process

CONFIG_NAME = "evaluate"

if __name__ == "__main__":  # a bad override fails before the imports below
    from stagekit.checkpoint_checks import require_given_checkpoints
    from pipeline.cli import check_first

    check_first(sys.argv[1:], require_given_checkpoints, config_name=CONFIG_NAME, updates=False, dispatch=False)
configure_process(temporary_server=__name__ == "__main__")  # before Prefect/MLflow/transformers load (pipeline/runtime.py)
import hydra
from omegaconf import DictConfig
from prefect import flow
from prefect.runtime import flow_run

from pipeline.cli import run_flow_from_cli
from pipeline.config import CONF_DIR, compose_run
from pipeline.session import checkpoints_of, flow_session, team_weights


def compose_eval(overrides: list[str]):
    return compose_run(overrides, config_name=CONFIG_NAME, updates=False, dispatch=False)  # no update to fit


@flow(name="evaluate")
def evaluate_agents(overrides: list[str] | None = None) -> dict:
    """Evaluate the agents of ``overrides`` (Hydra overrides of ``conf/evaluate.yaml``); returns the run summary."""
    cfg = compose_eval(overrides or [])
    with flow_session(cfg, kind="evaluate", run_name=f"eval-{cfg.agents.preset}-{flow_run.name}",
                      title="mars2 evaluation") as s:
        dataset, agents, team = team_weights(s)
        s.metrics = s.report.done(s.stage.evaluate(
            s.ctx, evaluation=cfg.eval, search=cfg.search, grading=cfg.grading, backend=cfg.backend,
            members=cfg.agents.members, weight_records={m.name: team for m in cfg.agents.owners}, agents=agents,
            dataset=dataset, cycle=0, max_problems=cfg.data.max_eval_problems), cycle=0).metrics
        return s.finish()


@hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")
def main(_: DictConfig) -> None:
    run_flow_from_cli(lambda overrides: checkpoints_of(compose_eval(overrides)), evaluate_agents, "evaluation")


if __name__ == "__main__":
    main()
