"""The refine gate: is refining a failed program better than sampling afresh, for this team on these problems?

    python flows/gate.py                                    # the default team (warm-started tiny agents), held out
    python flows/gate.py gate.split=train gate.n_fresh=16   # more fresh samples per agent, on training problems
    python flows/gate.py eval.from_run=<mlflow run id>      # the final weights of a train-cycle run
    python flows/gate.py search.detailed_feedback=true      # refine prompts with T+ feedback
    python flows/gate.py agents=known_team                  # the known-answer team on data=known_answer

Composes the run config (``conf/config.yaml``) with the same overrides the train flow takes; the gate samples as
the rollout's trees do (``search.*``). The table (``gate.md``), every attempt and the figures go to one MLflow run
(docs/eval.md, "The refine gate"). The study flow runs the same stage first and refuses to start when it fails.
"""

from __future__ import annotations

import sys

from pipeline.runtime import configure_process

CONFIG_NAME = "config"

if __name__ == "__main__":  # a bad override fails before the imports below
    from stagekit.checkpoint_checks import require_given_checkpoints
    from pipeline.cli import check_first

    check_first(sys.argv[1:], require_given_checkpoints, config_name=CONFIG_NAME, updates=False, dispatch=False)
configure_process(temporary_server=__name__ == "__main__")  # before Prefect/MLflow/transformers load (pipeline/runtime.py)
import hydra
from omegaconf import DictConfig
from prefect import flow
from prefect.runtime import flow_run

from mars2.config import RunConfig
from pipeline.cli import run_flow_from_cli
from pipeline.config import CONF_DIR, compose_run
from pipeline.session import checkpoints_of, flow_session, team_weights


def compose_gate(overrides: list[str]) -> RunConfig:
    return compose_run(overrides, config_name=CONFIG_NAME, updates=False, dispatch=False)  # no update to fit


@flow(name="refine-gate")
def refine_gate_flow(overrides: list[str] | None = None) -> dict:
    """The refine gate of the agents of ``overrides`` (Hydra overrides of ``conf/config.yaml``); returns the run
    summary with the gate's metrics under ``gate`` and whether it passes under ``passes``."""
    cfg = compose_gate(overrides or [])
    with flow_session(cfg, kind="gate", run_name=f"gate-{cfg.agents.preset}-{flow_run.name}",
                      title="mars2 refine gate") as s:
        dataset, agents, team = team_weights(s)
        gate = s.report.done(s.stage.refine_gate(s.ctx, gate=cfg.gate, search=cfg.search, grading=cfg.grading,
                                                 backend=cfg.backend, members=cfg.agents.members, weight_record=team,
                                                 agents=agents, dataset=dataset), cycle=0)
        summary = s.finish(notes=gate.path("gate.md").read_text())
    return summary | {"gate": gate.metrics, "passes": bool(gate.metrics["passes"]), "gate_dir": gate.dir}


@hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")
def main(_: DictConfig) -> None:
    run_flow_from_cli(lambda overrides: checkpoints_of(compose_gate(overrides)), refine_gate_flow, "refine gate")


if __name__ == "__main__":
    main()
