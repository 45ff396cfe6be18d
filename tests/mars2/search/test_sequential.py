"""mars2/search/sequential.py: sequential refinement, the worked example of adding a tree search strategy
(docs/algorithm.md §3.1): one file, its line in ``TREE_POLICIES``, its name in ``mars2.config.STRATEGIES``."""

import numpy as np
import pandas as pd
import pytest

from mars2.backends import SamplingParams
from mars2.backends.transformers_backend import load_transformers_backend
from mars2.config import STRATEGIES, TREE_STRATEGIES, ConfigError, EvalConfig, GradingConfig, SearchConfig
from mars2.data import problem_from_lcb_row, toy_benchmark
from mars2.sandbox import GradeJob, grade_many
from mars2.search.run import TREE_POLICIES, run_search, search_policy
from mars2.search.sequential import SequentialRefinement
from mars2.search.tree import ROOT, Expansion
from mars2.search.scheduler import AgentRunner
from pipeline.config import load_cfg, resolve


def test_each_node_refines_the_last_and_the_agents_take_turns():
    policy, rng = SequentialRefinement(), np.random.default_rng(0)
    tree = policy.new_tree(("a", "b", "c"))
    for score in (0.0, 0.5, 0.25, 1.0, 0.0):
        policy.tell(tree, policy.ask(tree, rng), score)
    assert [n.parent for n in tree.nodes] == [ROOT, 0, 1, 2, 3]
    assert [n.depth for n in tree.nodes] == [1, 2, 3, 4, 5]
    assert [n.agent for n in tree.nodes] == ["a", "b", "c", "a", "b"]
    assert [n.score for n in tree.nodes] == [0.0, 0.5, 0.25, 1.0, 0.0]
    assert tree.root.children == [0] and all(tree.nodes[i].children == [i + 1] for i in range(4))


def test_asks_of_one_round_refine_the_last_node_told_and_still_take_turns():
    """With expansions_per_wave k > 1 the round's asks come before its tells: they are siblings under the last
    node told, each agent's turn counted by asks."""
    policy, rng = SequentialRefinement(), np.random.default_rng(0)
    tree = policy.new_tree(("a", "b"))
    first = [policy.ask(tree, rng) for _ in range(2)]
    assert first == [Expansion(ROOT, "a"), Expansion(ROOT, "b")]
    for e in first:
        policy.tell(tree, e, 0.5)
    assert [policy.ask(tree, rng) for _ in range(3)] == [Expansion(1, "a"), Expansion(1, "b"), Expansion(1, "a")]


def test_the_chain_does_not_depend_on_scores_or_random_draws():
    def chain(seed, scores):
        policy, rng = SequentialRefinement(), np.random.default_rng(seed)
        tree = policy.new_tree(("a", "b"))
        for score in scores:
            policy.tell(tree, policy.ask(tree, rng), score)
        return [(n.parent, n.agent) for n in tree.nodes]

    assert chain(0, [0.0, 1.0, 0.0]) == chain(7, [1.0, 0.0, 0.5]) == [(ROOT, "a"), (0, "b"), (1, "a")]


def test_every_strategy_the_config_allows_builds_a_tree_or_is_independent_sampling():
    assert sorted(TREE_POLICIES) == sorted(TREE_STRATEGIES) and STRATEGIES == (*TREE_STRATEGIES, "independent")
    for name in TREE_POLICIES:
        policy = search_policy(SearchConfig(strategy=name))
        tree = policy.new_tree(("a", "b"))
        node = policy.tell(tree, policy.ask(tree, np.random.default_rng(0)), 1.0)
        assert (node, len(tree), tree.nodes[0].parent) == (0, 1, ROOT)
    with pytest.raises(ValueError, match="builds no tree"):
        search_policy(SearchConfig(strategy="independent"))


def test_the_search_group_option_selects_it_and_the_planner_counts_its_trees():
    from mars2.plan.planner import in_flight

    cfg = resolve(load_cfg(["search=sequential", "search.expansions_per_wave=2"]), cuda_available=False)
    assert cfg.search.strategy == "sequential"
    trees = cfg.data.max_train_problems or cfg.search.batch_size
    assert in_flight(cfg) == trees * 2  # a tree strategy: k requests per tree, not n_samples per problem
    with pytest.raises(ConfigError, match="search.strategy"):
        resolve(load_cfg(["search.strategy=best_of_all"]), cuda_available=False)


@pytest.fixture(scope="module")
def team(tiny_model_dir):
    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    problems = [problem_from_lcb_row(r) for r in toy_benchmark(2, 0)]

    def grade(jobs):
        return grade_many([GradeJob(c, tuple(t), f) for c, t, f in jobs],
                          grading=GradingConfig(workers=2, time_limit_s=2))

    return problems, {"a": AgentRunner(backend, tok, "role A"), "b": AgentRunner(backend, tok, "role B")}, grade


def assert_chains(nodes: pd.DataFrame, length: int) -> None:
    for _, t in nodes.groupby("problem_id"):
        assert t["node_id"].tolist() == list(range(length))
        assert t["parent"].tolist() == [ROOT, *range(length - 1)]
        assert t["action"].tolist() == ["generate"] + ["refine"] * (length - 1)
        assert t["agent"].tolist() == ["a", "b"] * (length // 2) + ["a"] * (length % 2)


def test_a_rollout_with_strategy_sequential_builds_one_chain_per_problem(team):
    problems, agents, grade = team
    search = SearchConfig(strategy="sequential", max_nodes=3)
    rows = run_search(problems, agents, search, SamplingParams(temperature=1.0, max_new_tokens=8, seed=1), grade)
    assert_chains(pd.DataFrame(rows), 3)


def test_evaluation_trees_use_the_strategy_eval_tree_strategy_names(team):
    from mars2.eval.run import evaluation_rollouts

    problems, agents, grade = team
    evaluation = EvalConfig(n_samples=1, max_nodes=3, tree=True, tplus=[False, True], max_new_tokens=8,
                            tree_strategy="sequential")
    _, trees = evaluation_rollouts(problems, evaluation, SearchConfig(strategy="independent"), grade, agents)
    assert len(trees) == 2 * 2 * 3
    for _, t in trees.groupby(["who", "tplus"]):
        assert_chains(t, 3)
    cfg = resolve(load_cfg(["eval.tree_strategy=sequential"]), cuda_available=False)
    assert (cfg.eval.tree_strategy, cfg.search.strategy) == ("sequential", "ab_mcts")
    with pytest.raises(ConfigError, match="eval.tree_strategy"):
        resolve(load_cfg(["eval.tree_strategy=independent"]), cuda_available=False)
