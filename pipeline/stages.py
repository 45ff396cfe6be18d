"""The stages the flows run, in the order a train cycle runs them, and what the pipeline derives from their
declarations (:class:`stagekit.stage.StageDeclaration`, one in each ``tasks/<stage>.py``): the tasks dispatch places,
the labels and columns of the run's summary, which metrics are MLflow params, the checks of the settings that name
stages.

Adding a stage: its ``tasks/<stage>.py`` (the task and its ``DECLARATION``), its task in :data:`TASKS`, and its line in
the flow.
"""

from __future__ import annotations

import sys

from mars2.config import ConfigError, OrchestrationConfig
from stagekit.stage import StageDeclaration
from tasks.advantage import compute_advantages
from tasks.agents import init_agents
from tasks.bootstrap import bootstrap_agents
from tasks.checkpoints import import_checkpoints
from tasks.data import prepare_dataset
from tasks.evaluation import evaluate
from tasks.gate import refine_gate
from tasks.grading import grade
from tasks.rollout import rollout
from tasks.update import update_policy

TASKS = (prepare_dataset, init_agents, bootstrap_agents, import_checkpoints, rollout, grade, compute_advantages,
         update_policy, evaluate, refine_gate)


def declaration_of(task) -> StageDeclaration:
    """The declaration of the stage ``task`` runs: its module's ``DECLARATION``."""
    return sys.modules[task.fn.__module__].DECLARATION


DECLARATIONS: dict[str, StageDeclaration] = {declaration_of(t).name: declaration_of(t) for t in TASKS}


def stage_pools(orchestration: OrchestrationConfig) -> dict[str, str]:
    """Stage name -> the work pool it runs on with ``orchestration=pools``: ``orchestration.pools[<stage>]``
    (``conf/orchestration/pools.yaml``), else the flow's own (``flow_pool``)."""
    return {name: orchestration.pools.get(name, orchestration.flow_pool) for name in DECLARATIONS}


def check_stage_names(orchestration: OrchestrationConfig, fail_at: str | None = None) -> None:
    """The settings that name stages: ``orchestration.pools``' keys and ``debug.fail_at`` are stages; a run on several
    nodes (``node_pools``) sends the generating stages and the weight owners' stages to worker pools, not to the flow's
    own process. Raises :class:`ConfigError` saying what to change."""
    names = ", ".join(DECLARATIONS)
    unknown = sorted(set(orchestration.pools) - set(DECLARATIONS))
    if unknown:
        raise ConfigError(f"orchestration.pools names unknown stage(s) {unknown}. Stages: {names}.")
    if fail_at is not None and fail_at not in DECLARATIONS:
        raise ConfigError(f"debug.fail_at={fail_at!r} is unknown. Stages: {names}.")
    if not orchestration.node_pools:
        return
    pools = stage_pools(orchestration)
    local = sorted(n for n, d in DECLARATIONS.items() if d.generates and pools[n] == orchestration.flow_pool)
    if local:
        raise ConfigError(f"orchestration.node_pools: stage(s) {local} would run in the flow's own process (pool "
                          f"{orchestration.flow_pool!r}), which reaches no engine on another node. Send the generation "
                          "stages to a worker pool: orchestration.pools.<stage>=<pool> (pools.yaml does).")
    local = sorted(n for n, d in DECLARATIONS.items() if d.per_owner and pools[n] == orchestration.flow_pool)
    if local:
        raise ConfigError(f"orchestration.node_pools: stage(s) {local} would run in the flow's own process (pool "
                          f"{orchestration.flow_pool!r}) for every agent, not on each agent's node. Send them to a "
                          "worker pool, which a run on several nodes replaces by each owner's node pool: "
                          "orchestration.pools.update=<pool> (pools.yaml does).")
