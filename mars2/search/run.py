"""A rollout from its config: the search signal (public tests in the sandbox), the strategy.

``run_search`` is what the rollout and evaluation stages call; it builds the tree search strategy
``search.strategy`` names (:data:`TREE_POLICIES`), or independent sampling (the GRPO baseline), from a
:class:`mars2.config.SearchConfig` and grades programs with a :class:`GradingConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pandas as pd

from mars2.backends.base import SamplingParams
from mars2.config import GradingConfig, SearchConfig
from mars2.data.schema import Problem
from mars2.journal import Journal
from mars2.search.ab_mcts import ABMCTSA, DepthDecay
from mars2.search.sampling import run_independent_sampling
from mars2.search.scheduler import NODE_COLUMNS, SIGNALS, AgentRunner, GradeFn, run_tree_search
from mars2.search.sequential import SequentialRefinement
from mars2.search.tree import TreePolicy


def public_grader(grading: GradingConfig) -> GradeFn:
    """The search's grader: programs graded on the tests the search signal names (public ones unless
    ``search.score=all_tests_binary``) in the sandbox pool, every test run (no early stop), so a node's score can be
    the fraction it passes."""
    from mars2.data.checks import gradable
    from mars2.sandbox import GradeJob, grade_many

    every_test = dataclasses.replace(grading, stop_at_visible_failure=False)
    return lambda jobs: grade_many([GradeJob(*gradable(*job)) for job in jobs], grading=every_test)


def search_sampling(search: SearchConfig, seed: int) -> SamplingParams:
    """How the rollout's trees sample (``search.temperature``, ``top_p``, ``max_new_tokens``), seeded with ``seed``."""
    return SamplingParams(temperature=search.temperature, top_p=search.top_p, max_new_tokens=search.max_new_tokens,
                          seed=seed)


def ab_mcts_policy(search: SearchConfig) -> ABMCTSA:
    """AB-MCTS-A with the configured posterior prior and, for T+, depth-guided exploration."""
    decay = (DepthDecay(search.depth_gamma0, search.depth_gamma_step, search.depth_gamma_min)
             if search.depth_decay else None)
    return ABMCTSA(search.prior, decay)


# search.strategy -> the tree search strategy it builds (its names: mars2.config.TREE_STRATEGIES)
TREE_POLICIES: dict[str, Callable[[SearchConfig], TreePolicy]] = {
    "ab_mcts": ab_mcts_policy,
    "sequential": lambda search: SequentialRefinement(),
}


def search_policy(search: SearchConfig) -> TreePolicy:
    """The tree search strategy ``search.strategy`` names, built from ``search``."""
    if search.strategy not in TREE_POLICIES:
        raise ValueError(f"search.strategy {search.strategy!r} builds no tree; tree strategies: "
                         f"{sorted(TREE_POLICIES)}")
    return TREE_POLICIES[search.strategy](search)


def run_search(problems: Sequence[Problem], runners: Mapping[str, AgentRunner], search: SearchConfig,
               sampling: SamplingParams, grade: GradeFn,
               progress: Callable[[int, int], None] | None = None,
               on_tree: Callable[[str, list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """One row per node (:data:`mars2.search.scheduler.NODE_COLUMNS`): a ``search.max_nodes``-node tree per problem
    built by ``search.strategy``, or ``search.n_samples`` i.i.d. samples per agent per problem
    (``strategy: independent``). ``progress`` is told
    ``(nodes built, nodes in all)`` as nodes are built; ``on_tree(problem id, rows)`` as a problem's nodes are
    finished."""
    signal = SIGNALS[search.score]
    if search.strategy == "independent":
        return run_independent_sampling(problems, runners, n_samples=search.n_samples, sampling=sampling, grade=grade,
                                        signal=signal, progress=progress, on_tree=on_tree)
    return run_tree_search(problems, runners, policy=search_policy(search), max_nodes=search.max_nodes,
                           sampling=sampling, grade=grade, seed=sampling.seed,
                           detailed_feedback=search.detailed_feedback, expansions_per_wave=search.expansions_per_wave,
                           signal=signal, progress=progress, on_tree=on_tree,
                           trees_in_flight=search.trees_in_flight)


def resumable_search(problems: Sequence[Problem], runners: Mapping[str, AgentRunner], search: SearchConfig,
                     sampling: SamplingParams, grade: GradeFn, journal: Journal, part: str,
                     progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """:func:`run_search` for the problems whose trees ``journal`` has not kept under ``part``, each tree kept as it
    is finished; returns every problem's nodes, in problem order: the trees made now and those read back are joined
    as Arrow tables and converted once, so a resumed run's table is the one an uninterrupted run makes."""
    import pyarrow as pa

    kept = journal.finished_tables(part)
    todo = [p for p in problems if p.id not in kept]
    made: dict[str, pa.Table] = {}

    def keep(pid: str, rows: list[dict[str, Any]]) -> None:
        made[pid] = pa.Table.from_pylist(rows)
        journal.write_table(part, pid, made[pid])

    if todo:
        # one writer thread: encoding a tree's shard must not hold up the search's scheduler
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mars2-journal") as writer:
            written = []
            run_search(todo, runners, search, sampling, grade, progress,
                       on_tree=lambda pid, rows: written.append(writer.submit(keep, pid, rows)))
        for future in written:
            future.result()
    if not problems:
        return pd.DataFrame(columns=NODE_COLUMNS)
    # one Arrow table, then one conversion: a tree made now and one read back give the same rows and types
    tables = [made[p.id] if p.id in made else kept[p.id] for p in problems]
    return pa.concat_tables(tables, promote_options="default").to_pandas()
