"""MARS² train cycle: dataset prep → agents (→ bootstrap) → (rollout → grading → advantage → per-agent update → evaluation) × cycles.

    python flows/train_cycle.py                              # tiny CPU agents, embedded Prefect + MLflow
    python flows/train_cycle.py agents=heterogeneous_32b     # GPU cluster
    python flows/train_cycle.py train.cycles=3 --cfg job     # print the composed config
    python flows/train_cycle.py -m agents=tiny_cpu,tiny_cpu_single   # Hydra multirun: one flow run per job

The flow's one parameter is a list of Hydra overrides, so the CLI, a deployment started from the Prefect UI
(``["agents=heterogeneous_8b", "train.kl_coef=2e-3"]``) and a sweep (``flows/deploy.py``) compose the config
with the same function. Every stage is a Prefect task whose folder is its cache (see pipelines.md): re-running the
same command re-uses finished stages and runs only what failed and what depends on it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from pipeline.runtime import configure_process

if __name__ == "__main__":  # a bad override fails before the imports below
    from pipeline.cli import check_first

    check_first(sys.argv[1:])
configure_process(temporary_server=__name__ == "__main__")  # before Prefect/MLflow/transformers load (pipeline/runtime.py)
import hydra
from omegaconf import DictConfig
from prefect import flow, get_run_logger
from prefect.runtime import deployment, flow_run

from mars2.sandbox import isolation_params
from mars2.train.checkpoints import prune_optimizer_states
from pipeline import tracking
from pipeline.cli import run_flow_from_cli
from pipeline.config import CONF_DIR, VARY_TAG, compose_run, override_label, run_name
from pipeline.session import flow_session, team_weights
from pipeline.dispatch import all_results, check_dispatch
from stagekit.runners import model_dir


@flow(name="train-cycle")
def train_cycle(overrides: list[str] | None = None) -> dict:
    """One MARS² training run; ``overrides``: Hydra overrides, e.g. ``["agents=tiny_cpu_single", "train.cycles=3"]``."""
    cfg = compose_run(overrides or [])
    if deployment.id and "MARS2_HOME" not in os.environ:
        get_run_logger().warning("MARS2_HOME is not set on this worker: the run folder is %s, inside the worker's "
                                 "temporary directory, and caches are lost after the run", Path(cfg.paths.root).resolve())
    label = override_label(overrides or [])  # the run's name says what sets it apart; a plain preset's, which run it is
    varied = [t.removeprefix(VARY_TAG) for t in flow_run.tags if t.startswith(VARY_TAG)]
    name = run_name(cfg.agents.preset, overrides or [], varied) or f"{cfg.agents.preset}-{flow_run.name}"
    with flow_session(cfg, kind="train", run_name=name, title="mars2 train cycle", dispatch=True,
                      label=label) as s:  # stages run where conf/orchestration/ places them
        ctx, stage, report, run = s.ctx, s.stage, s.report, s.run
        run.log_params(cfg, isolation_params(cfg.grading.isolation, cfg.grading.workers or None))
        members, owners = cfg.agents.members, {m.name: m for m in cfg.agents.owners}
        profile = {name: cfg.deepspeed_profiles[m.deepspeed] if m.deepspeed else cfg.deepspeed for name, m in owners.items()}
        common = dict(ctx=ctx, grading=cfg.grading, backend=cfg.backend, members=members)  # every generation stage's
        dataset, agents, _ = team_weights(s, from_checkpoints=False)  # cycle 0's weights and the KL reference
        latest = {name: agents for name in owners}  # each owner's latest record that hands on its weights
        optimizer_states = {name: [] for name in owners}  # each owner's ds/ after each of its updates, oldest first
        if cfg.eval.before and cfg.train.cycles:  # the starting point of every held-out curve, at step -1
            report.done(stage.evaluate(**common, evaluation=cfg.eval, search=cfg.search, weight_records=latest,
                                       agents=agents, dataset=dataset, cycle=-1,
                                       max_problems=cfg.data.max_eval_problems), -1)

        for cycle in range(cfg.train.cycles):
            trees = report.done(stage.rollout(**common, search=cfg.search, weight_records=latest, agents=agents,
                                              dataset=dataset, cycle=cycle, max_problems=cfg.data.max_train_problems,
                                              rotate=cfg.data.rotate_train), cycle)
            verdicts = report.done(stage.grade(ctx, cfg.grading, trees, dataset, cycle), cycle)
            routed = report.done(stage.compute_advantages(ctx, train=cfg.train, search=cfg.search, members=members,
                                                          trees=trees, verdicts=verdicts, cycle=cycle), cycle)
            run.log(partial(tracking.log_tree_views, cfg, trees=trees, verdicts=verdicts, routed=routed, cycle=cycle))
            updates = {name: stage.update_policy.submit(ctx, member=m, train=cfg.train, profile=profile[name],
                                                        weight_record=latest[name], agents=agents, routed=routed,
                                                        cycle=cycle, temperature=cfg.search.temperature)
                       for name, m in owners.items()}  # concurrent on a GPU pool; one after the other locally
            latest = {name: report.done(u, cycle, owner=name) for name, u in all_results(updates).items()}
            for name, w in latest.items():  # only once every update of the cycle has finished: a retry needs none
                optimizer_states[name].append(w.weights_of(name).optimizer_dir)
                prune_optimizer_states(optimizer_states[name], cfg.train.keep_optimizer_states)
            if (cycle + 1) % cfg.eval.every == 0 or cycle == cfg.train.cycles - 1:
                last = cycle == cfg.train.cycles - 1
                evaluation = replace(cfg.eval, tree=cfg.eval.tree and (last or not cfg.eval.tree_last_only))
                s.metrics = report.done(stage.evaluate(**common, evaluation=evaluation, search=cfg.search,
                                                       weight_records=latest, agents=agents, dataset=dataset,
                                                       cycle=cycle, max_problems=cfg.data.max_eval_problems),
                                        cycle).metrics
            report.cycle_done(cycle)
        final = {name: model_dir(w, name) for name, w in latest.items()}
        run.log(lambda run_id: tracking.log_final_model_dirs(cfg, run_id, final))
        return s.finish()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(_: DictConfig) -> None:
    # fail fast, before Prefect starts: the config, and a server to dispatch to in pools mode
    run_flow_from_cli(lambda overrides: check_dispatch(compose_run(overrides).orchestration), train_cycle, "run")


if __name__ == "__main__":
    main()
