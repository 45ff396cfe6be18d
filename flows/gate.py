"""The refine gate: is refining a failed program better than sampling afresh, for this team on these problems?

    python flows/gate.py                                    # the default team (warm-started tiny agents), held out
    python flows/gate.py gate.split=train gate.n_fresh=8    # more fresh samples per agent, on training problems
    python flows/gate.py eval.from_run=<mlflow run id>      # the final weights of a train-cycle run
    python flows/gate.py search.detailed_feedback=true      # refine prompts with T+ feedback

Composes the run config (``conf/config.yaml``) with the same overrides the train flow takes; the gate samples as
the rollout's trees do (``search.*``). The table (``gate.md``), every attempt and the figures go to one MLflow run
(docs/eval.md, "The refine gate"). The study flow runs the same stage first and refuses to start when it fails.
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

from flows.evaluate import checkpoints_of, team_weights
from mars2.config import RunConfig
from tasks import tracking
from tasks.cli import check_command_line, run_flow_from_cli
from tasks.config import CONF_DIR, compose_run, to_container, to_yaml
from tasks.engines import engine_pool
from tasks.report import RunReport
from tasks.stage import StageContext
from tasks.stages import bound

CONFIG_NAME = "config"


def compose_gate(overrides: list[str]) -> RunConfig:
    return compose_run(overrides, config_name=CONFIG_NAME, check_fit=False)  # no update to fit


@flow(name="refine-gate")
def refine_gate_flow(overrides: list[str] | None = None) -> dict:
    """The refine gate of the agents of ``overrides`` (Hydra overrides of ``conf/config.yaml``); returns the run
    summary with the gate's metrics under ``gate`` and whether it passes under ``passes``."""
    cfg = compose_gate(overrides or [])
    ctx = StageContext(root=str(Path(cfg.paths.root).resolve()), flow_run_id=str(flow_run.id),
                       progress_every_s=cfg.progress_every_s, cpus=cfg.cpus)
    use_cpu_budget(ctx.cpus)
    run = tracking.open_run(cfg, to_container(cfg), to_yaml(cfg), flow_run_id=ctx.flow_run_id,
                            run_name=f"gate-{cfg.agents.preset}-{flow_run.name}", kind="gate")
    report = RunReport(cfg, ctx, run, title="mars2 refine gate")
    stage = bound(cfg.paths.root)
    with engine_pool(cfg.backend.persistent, ctx, cfg.backend.start_timeout_s) as engines:
        try:
            dataset, agents, weights = team_weights(cfg, ctx, stage, report)
            gate = report.done(stage.refine_gate(ctx, cfg.gate, cfg.search, cfg.grading, cfg.backend,
                                                 cfg.agents.members, weights, agents, dataset), cycle=0)
        except BaseException:
            report.finish("FAILED", {}, {"engine_starts": engines.starts}, stage.failed)
            raise
        summary = report.finish("FINISHED", {}, {"engine_starts": engines.starts},
                                notes=gate.path("gate.md").read_text())
    return summary | {"gate": gate.metrics, "passes": bool(gate.metrics["passes"]), "gate_dir": gate.dir}


@hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")
def main(_: DictConfig) -> None:
    run_flow_from_cli(lambda overrides: checkpoints_of(compose_gate(overrides)), refine_gate_flow, "refine gate")


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
