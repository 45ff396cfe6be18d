"""MARS² train cycle: dataset prep → agents (→ bootstrap) → (rollout → grading → advantage → per-agent update → evaluation) × cycles.

    python flows/train_cycle.py                              # tiny CPU agents, embedded Prefect + MLflow
    python flows/train_cycle.py agents=heterogeneous_32b     # GPU cluster
    python flows/train_cycle.py train.cycles=3 --cfg job     # print the composed config
    python flows/train_cycle.py -m agents=tiny_cpu,tiny_cpu_single   # Hydra multirun: one flow run per job

The flow's one parameter is a list of Hydra overrides, so the CLI, a deployment started from the Prefect UI
(``["agents=heterogeneous_8b", "train.kl_coef=2e-3"]``) and a sweep (``flows/deploy.py``) compose the config
with the same function. Every stage is a cached Prefect task (see pipelines.md): re-running the same command
re-uses finished stages and runs only what failed and what depends on it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from tasks.runtime import configure_process, use_cpu_budget

configure_process(temporary_server=__name__ == "__main__")  # before Prefect/MLflow/transformers load (tasks/runtime.py)
import hydra
from omegaconf import DictConfig
from prefect import flow, get_run_logger
from prefect.runtime import deployment, flow_run

from mars2.sandbox import isolation_params
from mars2.train.checkpoints import prune_optimizer_states
from tasks import tracking
from tasks.weights import model_dir, owner_of
from tasks.stage import StageContext
from tasks.bootstrap import needs_bootstrap
from tasks.cli import check_command_line, run_flow_from_cli
from tasks.config import CONF_DIR, compose_run, to_container, to_yaml
from tasks.data import source_hash
from tasks.engines import engine_pool
from tasks.report import RunReport
from tasks.stages import bound, check_dispatch


@flow(name="train-cycle")
def train_cycle(overrides: list[str] | None = None) -> dict:
    """One MARS² training run; ``overrides``: Hydra overrides, e.g. ``["agents=tiny_cpu_single", "train.cycles=3"]``."""
    cfg = compose_run(overrides or [])
    if deployment.id and "MARS2_HOME" not in os.environ:
        get_run_logger().warning("MARS2_HOME is not set on this worker: the run folder is %s, inside the worker's "
                                 "temporary directory, and caches are lost after the run", Path(cfg.paths.root).resolve())
    ctx = StageContext(root=str(Path(cfg.paths.root).resolve()), flow_run_id=str(flow_run.id), fail_at=cfg.debug.fail_at,
                       progress_every_s=cfg.progress_every_s, cpus=cfg.cpus)
    use_cpu_budget(ctx.cpus)
    # the same command again resumes its failed MLflow run, and logs no new run when every stage comes from cache
    run = tracking.open_run(cfg, to_container(cfg), to_yaml(cfg), flow_run_id=ctx.flow_run_id,
                            run_name=f"{cfg.agents.preset}-{flow_run.name}")
    run.log_params(cfg, isolation_params(cfg.grading.isolation, cfg.grading.workers or None))
    report = RunReport(cfg, ctx, run)
    stage = bound(cfg.paths.root, cfg.orchestration)  # where each stage runs: conf/orchestration/
    members = cfg.agents.members
    owners = {owner_of(m): m for m in members if m.shares_weights_with is None}
    profile = {name: cfg.deepspeed_profiles[m.deepspeed] if m.deepspeed else cfg.deepspeed for name, m in owners.items()}
    eval_metrics: dict[str, float] = {}
    # one generation engine per weight owner
    with engine_pool(cfg.backend.persistent, ctx, cfg.backend.start_timeout_s) as engines:
        try:
            dataset = report.done(stage.prepare_dataset(ctx, cfg.data, source_hash(cfg.data)), cycle=0)
            run.log(lambda run_id: tracking.log_datasets(cfg, run_id, dataset))
            agents = report.done(stage.init_agents(ctx, members, dataset), cycle=0)
            if needs_bootstrap(members):  # warm-started tiny agents: these weights are cycle 0's and the KL reference
                agents = report.done(stage.bootstrap_agents(ctx, members, agents, dataset, cfg.grading), cycle=0)
            weights = {name: agents for name in owners}
            optimizer_states = {name: [] for name in owners}  # each owner's ds/ after each of its updates, oldest first
            if cfg.eval.before and cfg.train.cycles:  # the starting point of every held-out curve, at step -1
                report.done(stage.evaluate(ctx, cfg.eval, cfg.search, cfg.grading, cfg.backend, members, weights, agents,
                                           dataset, -1, cfg.data.max_eval_problems), -1, label="eval")

            for cycle in range(cfg.train.cycles):
                trees = report.done(stage.rollout(ctx, cfg.search, cfg.grading, cfg.backend, members, weights, agents,
                                                  dataset, cycle, cfg.data.max_train_problems, cfg.data.rotate_train), cycle)
                verdicts = report.done(stage.grade(ctx, cfg.grading, trees, dataset, cycle), cycle)
                routed = report.done(stage.compute_advantages(ctx, cfg.train, cfg.search, members, trees, verdicts, cycle),
                                     cycle)
                run.log(partial(tracking.log_tree_views, cfg, trees=trees, verdicts=verdicts, routed=routed,
                                cycle=cycle))
                updates = {name: stage.update_policy.submit(ctx, m, cfg.train, profile[name], weights[name], agents,
                                                            routed, cycle, cfg.search.temperature)
                           for name, m in owners.items()}  # concurrent on a GPU pool; one after the other locally
                weights = {name: report.done(u.result(), cycle, label=f"update/{name}") for name, u in updates.items()}
                for name, w in weights.items():  # only once every update of the cycle has finished: a retry needs none
                    optimizer_states[name].append(w.weights_of(name).optimizer_dir)
                    prune_optimizer_states(optimizer_states[name], cfg.train.keep_optimizer_states)
                if (cycle + 1) % cfg.eval.every == 0 or cycle == cfg.train.cycles - 1:
                    last = cycle == cfg.train.cycles - 1
                    evaluation = replace(cfg.eval, tree=cfg.eval.tree and (last or not cfg.eval.tree_last_only))
                    result = report.done(stage.evaluate(ctx, evaluation, cfg.search, cfg.grading, cfg.backend, members,
                                                        weights, agents, dataset, cycle, cfg.data.max_eval_problems),
                                         cycle, label="eval")
                    eval_metrics = result.metrics
                report.cycle_done(cycle)
            final = {name: model_dir(w, name) for name, w in weights.items()}
            run.log(lambda run_id: tracking.log_final_weights(cfg, run_id, final))
        except BaseException:
            report.finish("FAILED", eval_metrics, {"engine_starts": engines.starts}, stage.failed)
            raise
        return report.finish("FINISHED", eval_metrics, {"engine_starts": engines.starts})


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(_: DictConfig) -> None:
    # fail fast, before Prefect starts: the config, and a server to dispatch to in pools mode
    run_flow_from_cli(lambda overrides: check_dispatch(compose_run(overrides).orchestration), train_cycle, "run")


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
