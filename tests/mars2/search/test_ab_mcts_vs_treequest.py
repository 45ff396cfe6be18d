"""Our AB-MCTS-A against SakanaAI's TreeQuest (``multiarm_bandit_thompson``) on the same scoring environment.

Both draw from their own random streams, so the comparison is statistical: over many seeded trees, the share
of nodes written by each agent, the mean depth and the share of fresh root solutions must agree.
"""

import numpy as np
import pytest

from mars2.search.ab_mcts import ABMCTSA, ABMCTSTree

treequest = pytest.importorskip("treequest")

AGENTS = ["strong", "weak"]
N_TREES, N_NODES = 240, 12


def score(agent: str, depth: int, noise: float) -> float:
    """Refinement helps, the strong agent helps more; clipped to [0, 1]."""
    base = {"strong": 0.45, "weak": 0.15}[agent] + 0.08 * (depth - 1)
    return float(np.clip(base + noise, 0.0, 1.0))


def stats(nodes: list[tuple[str, int]]) -> dict[str, float]:
    agents = [a for a, _ in nodes]
    depths = np.array([d for _, d in nodes])
    return {"strong_share": agents.count("strong") / len(agents), "mean_depth": float(depths.mean()),
            "root_share": float((depths == 1).mean())}


def ours() -> dict[str, float]:
    nodes = []
    policy = ABMCTSA()
    for seed in range(N_TREES):
        tree, rng, noise = ABMCTSTree(agents=tuple(AGENTS)), np.random.default_rng(seed), np.random.default_rng(10_000 + seed)
        for _ in range(N_NODES):
            e = policy.ask(tree, rng)
            depth = tree.node(e.parent).depth + 1
            policy.tell(tree, e, score(e.agent, depth, noise.normal(0, 0.1)))
            nodes.append((e.agent, depth))
    return stats(nodes)


def theirs() -> dict[str, float]:
    nodes = []
    algo = treequest.ABMCTSA()
    for seed in range(N_TREES):
        np.random.seed(seed)
        noise = np.random.default_rng(10_000 + seed)
        state = algo.init_tree()
        for _ in range(N_NODES):
            state, (trial,) = algo.ask_batch(state, 1, AGENTS)
            parent = state.tree.get_node(trial.node_to_expand)
            depth = 1 if parent.state is None else parent.state[1] + 1
            state = algo.tell(state, trial.trial_id, ((trial.action, depth),
                                                      score(trial.action, depth, noise.normal(0, 0.1))))
            nodes.append((trial.action, depth))
    return stats(nodes)


def test_agent_choice_and_tree_shape_match_treequest():
    a, b = ours(), theirs()
    assert abs(a["strong_share"] - b["strong_share"]) < 0.05, (a, b)
    assert abs(a["root_share"] - b["root_share"]) < 0.06, (a, b)
    assert abs(a["mean_depth"] - b["mean_depth"]) < 0.15, (a, b)
    assert a["strong_share"] > 0.6 and b["strong_share"] > 0.6  # both learn which agent is better
