"""The set-up every flow shares: the stage context, the MLflow run and its summary, the placed stages and one
generation engine per weight owner, kept for the flow run. A flow body that raises finishes the run as FAILED,
naming the stages that raised."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from prefect.runtime import flow_run

from mars2.config import RunConfig
from pipeline import tracking
from tasks.bootstrap import needs_bootstrap
from tasks.checkpoints import checkpoint_hashes
from pipeline.config import to_container, to_yaml
from tasks.data import source_hash
from stagekit.engines import engine_pool
from pipeline.report import RunReport
from pipeline.runtime import use_cpu_budget
from stagekit.stage import StageContext, StageRecord
from pipeline.dispatch import concurrent_update_ranks, owner_pools, placed_stages


@dataclass
class FlowSession:
    """One flow run's handles (its engines are ``ctx.engines``); ``metrics`` are the evaluation metrics its summary
    reports (the latest ones)."""

    cfg: RunConfig
    ctx: StageContext
    run: tracking.TrackedRun
    report: RunReport
    stage: SimpleNamespace
    metrics: dict[str, float] = field(default_factory=dict)

    def finish(self, notes: str = "") -> dict:
        """Close the run as FINISHED; returns the run summary."""
        return self.report.finish("FINISHED", self.metrics, {"engine_starts": self.ctx.engines.starts},
                                  notes=notes)


@contextmanager
def flow_session(cfg: RunConfig, *, kind: str, run_name: str, title: str, dispatch: bool = False, label: str = ""
                 ) -> Iterator[FlowSession]:
    """Open the flow run's session. ``dispatch``: stages run where ``cfg.orchestration`` places them (the train
    flow); otherwise all in this process. ``kind`` and ``run_name`` name the MLflow run; ``label`` (the overrides of
    the preset, :func:`pipeline.config.override_label`) goes in its tags, description and summary, and, when not
    empty, ``run_name`` names the Prefect flow run too. A point of a sweep (Prefect tag ``sweep-<id>``) tags its
    MLflow run ``mars2.sweep=<id>``, or the earlier run it reuses when every stage comes from cache."""
    ctx = StageContext(root=str(Path(cfg.paths.root).resolve()), flow_run_id=str(flow_run.id),
                       fail_at=cfg.debug.fail_at, progress_every_s=cfg.progress_every_s, cpus=cfg.cpus,
                       engine_pools=owner_pools(cfg.orchestration, cfg.agents.owners) if dispatch else {},
                       node_update_ranks=concurrent_update_ranks(cfg.orchestration, cfg.agents.owners)
                       if dispatch else {}, gpu_memory_gb=cfg.plan.gpu_memory_gb)
    use_cpu_budget(ctx.cpus)
    # the same command again resumes its failed MLflow run, and logs no new run when every stage comes from cache
    sweep = [t.removeprefix("sweep-") for t in flow_run.tags if t.startswith("sweep-")]
    run = tracking.open_run(cfg, to_container(cfg), to_yaml(cfg), flow_run_id=ctx.flow_run_id, run_name=run_name,
                            kind=kind, label=label, tags={"mars2.sweep": sweep[0]} if sweep else {})
    if label:
        name_flow_run(run_name)
    report = RunReport(cfg, ctx, run, title=title, label=label)
    stage = placed_stages(cfg.orchestration if dispatch else None)
    with engine_pool(cfg.backend, ctx) as engines:
        session = FlowSession(cfg, dataclasses.replace(ctx, engines=engines), run, report, stage)
        try:
            yield session
        except BaseException:
            report.finish("FAILED", session.metrics, {"engine_starts": engines.starts}, stage.failed)
            raise


def name_flow_run(name: str) -> None:
    """Give this flow run ``name`` on its Prefect server (a run started from the UI or a sweep has a random one)."""
    from prefect.client.orchestration import get_client

    if flow_run.name != name:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name)


def checkpoints_of(cfg: RunConfig) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """``{owner: folder}`` from ``eval.from_run`` and ``eval.checkpoints`` (the latter wins) and their file hashes."""
    checkpoints = dict(cfg.eval.checkpoints)
    if cfg.eval.from_run:
        checkpoints = tracking.final_model_dirs(cfg, cfg.eval.from_run) | checkpoints
    return checkpoints, checkpoint_hashes(checkpoints, [m.name for m in cfg.agents.owners])


def team_weights(s: FlowSession, *, from_checkpoints: bool = True) -> tuple[StageRecord, StageRecord, StageRecord]:
    """The data (logged to the run as its datasets), the agents (warm-started where the preset says so, unless every
    owner has a checkpoint) and the team's record to start from: the agents', or (``from_checkpoints``) the one that
    imports ``eval.from_run`` / ``eval.checkpoints`` over them."""
    cfg, ctx, stage, report = s.cfg, s.ctx, s.stage, s.report
    members = cfg.agents.members
    checkpoints, hashes = checkpoints_of(cfg) if from_checkpoints else ({}, {})
    dataset = report.done(stage.prepare_dataset(ctx, cfg.data, source_hash(cfg.data)), cycle=0)
    s.run.log(lambda run_id: tracking.log_datasets(cfg, run_id, dataset))
    agents = report.done(stage.init_agents(ctx, members, dataset), cycle=0)
    if needs_bootstrap(members) and not {m.name for m in cfg.agents.owners} <= set(checkpoints):
        agents = report.done(stage.bootstrap_agents(ctx, members, agents, dataset, cfg.grading), cycle=0)
    team = agents
    if checkpoints:
        team = report.done(stage.import_checkpoints(ctx, checkpoints, hashes, agents), cycle=0)
    return dataset, agents, team
