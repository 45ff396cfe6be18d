"""Evaluation rollouts: the i.i.d. samples and search trees the LiveCodeBench metrics are computed from."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from mars2.backends.base import SamplingParams
from mars2.config import EvalConfig, SearchConfig
from mars2.data.schema import Problem
from mars2.journal import Journal
from mars2.search.run import resumable_search, run_search
from mars2.search.sampling import run_independent_sampling
from mars2.search.scheduler import AgentRunner, GradeFn

TEAM = "team"


# the SearchConfig fields evaluation_rollouts reads; it sets strategy, max_nodes, detailed_feedback, depth_decay and
# temperature itself, and takes n_samples, max_new_tokens and seed from the EvalConfig
SEARCH_READS = ("prior", "depth_gamma0", "depth_gamma_step", "depth_gamma_min", "expansions_per_wave", "top_p",
                "trees_in_flight")


def evaluation_rollouts(problems: Sequence[Problem], evaluation: EvalConfig, search: SearchConfig, grade: GradeFn,
                        runners: Mapping[str, AgentRunner],
                        progress: Callable[[int, int], None] | None = None,
                        journal: Journal | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The i.i.d. samples (``evaluation.n_samples`` per agent per problem) and the evaluation trees: the team's
    ``evaluation.max_nodes``-node tree (and one per agent alone with ``per_agent_trees``), without and/or with T+
    (detailed feedback + depth-guided exploration), built by ``evaluation.tree_strategy`` (AB-MCTS-A by default).
    Public scores only: hidden grading comes after.
    ``progress`` is told ``(programs generated, programs in all)`` as samples and tree nodes come in. With
    ``journal``, each problem's samples and each tree are kept as they are finished (:func:`evaluation_parts` names
    the parts), and what an earlier run of the stage key kept is not generated again."""
    groups = {TEAM: runners}
    if evaluation.per_agent_trees and len(runners) > 1:
        groups |= {name: {name: r} for name, r in runners.items()}
    n_samples = evaluation.n_samples * len(runners) * len(problems)
    n_nodes = evaluation.max_nodes * len(problems) * len(groups) * len(evaluation.tplus) if evaluation.tree else 0
    done = 0

    def part(offset: int) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda d, _total: progress(offset + d, n_samples + n_nodes))

    params = SamplingParams(temperature=evaluation.temperature, max_new_tokens=evaluation.max_new_tokens,
                            seed=evaluation.seed)
    if journal is None:
        samples = pd.DataFrame(run_independent_sampling(problems, runners, n_samples=evaluation.n_samples,
                                                        sampling=params, grade=grade, progress=part(0)))
    else:
        independent = dataclasses.replace(search, strategy="independent", n_samples=evaluation.n_samples,
                                          score="public_fraction")
        samples = resumable_search(problems, runners, independent, params, grade, journal, SAMPLES, part(0))
    done += len(samples)
    trees = []
    if evaluation.tree:
        for tplus in evaluation.tplus:
            tree_search = dataclasses.replace(search, strategy=evaluation.tree_strategy, score="public_fraction",
                                              max_nodes=evaluation.max_nodes,
                                              detailed_feedback=tplus, depth_decay=tplus,
                                              temperature=evaluation.tree_temperature)
            sampling = SamplingParams(temperature=evaluation.tree_temperature, top_p=search.top_p,
                                      max_new_tokens=evaluation.max_new_tokens, seed=evaluation.seed + 1)
            for who, group in groups.items():
                nodes = (pd.DataFrame(run_search(problems, group, tree_search, sampling, grade, progress=part(done)))
                         if journal is None else
                         resumable_search(problems, group, tree_search, sampling, grade, journal,
                                          tree_part(who, tplus), part(done)))
                done += len(nodes)
                trees.append(nodes.assign(who=who, tplus=tplus))
    keep = ["problem_id", "node_id", "parent", "depth", "agent", "action", "code", "score", "public_status",
            "response_len", "who", "tplus"]
    trees_table = pd.concat(trees, ignore_index=True)[keep] if trees else pd.DataFrame(columns=keep)
    samples_table = samples[["problem_id", "node_id", "agent", "code", "score", "public_status", "response_len"]]
    return samples_table, trees_table


SAMPLES = "samples"  # the journal's part of the evaluation's i.i.d. samples (one shard per problem)


def tree_part(who: str, tplus: bool) -> str:
    """The journal's part of the evaluation trees of ``who`` (the team or one agent) with or without T+."""
    return f"tree-{who}-{'tplus' if tplus else 'plain'}"


def evaluation_parts(evaluation: EvalConfig, agents: Sequence[str]) -> list[str]:
    """Every journal part of one evaluation: the samples, then each tree set it builds."""
    groups = [TEAM] + (list(agents) if evaluation.per_agent_trees and len(agents) > 1 else [])
    trees = [tree_part(who, tplus) for tplus in evaluation.tplus for who in groups] if evaluation.tree else []
    return [SAMPLES, *trees]
