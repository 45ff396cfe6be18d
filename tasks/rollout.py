"""Stage 2 — rollout: the agents build one search tree per training problem (or sample independently)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task

from mars2.config import AgentConfig, GradingConfig, SearchConfig
from mars2.data.tables import cycle_subset, problems_from_frame
from mars2.io import write_parquet
from tasks.weights import load_backend
from tasks.stage import StageContext, StageRecord, cache_key_fn, current_parameters, run_stage

STAGE = "rollout"
MODULES = ("mars2.backends", "mars2.search", "mars2.sandbox", "mars2.data", "mars2.io", "tasks.rollout",
           "tasks.weights")


@task(name=STAGE, cache_key_fn=cache_key_fn(STAGE, MODULES), persist_result=True, task_run_name="rollout-c{cycle}")
def rollout(ctx: StageContext, search: SearchConfig, grading: GradingConfig, members: list[AgentConfig],
            weights: dict[str, StageRecord], agents: StageRecord, dataset: StageRecord, cycle: int,
            max_problems: int | None, rotate: bool = True) -> StageRecord:
    """Trees for cycle ``cycle``'s ``max_problems`` training problems (the next window each cycle, or with
    ``rotate=False`` the first window every cycle).

    ``trees.parquet``: one row per node (problem, node id, parent, depth, agent, prompt, response, code,
    token ids, rollout log-probs, public-test verdict and score); ``trees.png``: a few trees."""

    def produce(out: Path) -> dict:
        from mars2.backends import SamplingParams
        from mars2.search.tree_stats import plot_trees, tree_stats

        train = pd.read_parquet(dataset.path("train.parquet"))
        ids = cycle_subset(train["id"].tolist(), cycle, max_problems, rotate)
        problems = problems_from_frame(train.set_index("id").loc[ids].reset_index())
        runners = agent_runners(members, weights, agents, search.batch_size)
        sampling = SamplingParams(temperature=search.temperature, top_p=search.top_p,
                                  max_new_tokens=search.max_new_tokens, seed=search.seed + 7919 * cycle)
        nodes = pd.DataFrame(search_problems(problems, runners, search, sampling, public_grader(grading)))
        write_parquet(out / "trees.parquet", nodes)
        plot_trees(nodes, out / "trees.png")
        return {"metrics": {**tree_stats(nodes), "n_nodes": len(nodes), "n_problems": len(problems)}}

    return run_stage(STAGE, MODULES, ctx, current_parameters(), produce)


def agent_runners(members: list[AgentConfig], weights: dict[str, StageRecord], agents: StageRecord,
                  batch_size: int) -> dict:
    """Each agent's backend (shared between roles of one set of weights), tokenizer and role prompt."""
    from mars2.search.tree_search import AgentRunner
    from tasks.weights import owner_of

    loaded: dict[str, tuple] = {}
    runners = {}
    for m in members:
        owner = owner_of(m)
        if owner not in loaded:
            loaded[owner] = load_backend(next(x for x in members if x.name == owner), weights, agents,
                                         batch_size=batch_size)
        backend, tok = loaded[owner]
        runners[m.name] = AgentRunner(backend=backend, tokenizer=tok, role_prompt=m.role_prompt)
    return runners


def public_grader(grading: GradingConfig):
    """The search signal: grade programs on public tests in the sandbox pool."""
    from mars2.data import gradable
    from mars2.sandbox import GradeJob, grade_many

    def grade(jobs):
        # every public test runs (no early stop): the node's score is the fraction it passes
        return grade_many([GradeJob(*gradable(c, t, f)) for c, t, f in jobs], workers=grading.workers or None,
                          time_limit_s=grading.time_limit_s, memory_mb=grading.memory_mb,
                          isolation=grading.isolation, parity=grading.parity, stop_at_first_failure=False)

    return grade


def search_problems(problems, runners, search: SearchConfig, sampling, grade) -> list[dict]:
    from mars2.search.ab_mcts import ABMCTSA, DepthDecay, Prior
    from mars2.search.sampling import run_independent_sampling
    from mars2.search.tree_search import run_tree_search

    if search.strategy == "independent":
        return run_independent_sampling(problems, runners, n_samples=search.n_samples, sampling=sampling, grade=grade)
    prior = Prior(dist=search.dist, m=search.prior_m, kappa=search.prior_kappa, nu=search.prior_nu,
                  tau2=search.prior_tau2)
    decay = DepthDecay(search.depth_gamma0, search.depth_gamma_step, search.depth_gamma_min) if search.depth_decay else None
    return run_tree_search(problems, runners, policy=ABMCTSA(prior, decay), max_nodes=search.max_nodes,
                           sampling=sampling, grade=grade, seed=sampling.seed, detailed_feedback=search.detailed_feedback,
                           expansions_per_wave=search.expansions_per_wave)
