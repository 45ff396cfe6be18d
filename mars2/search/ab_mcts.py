"""AB-MCTS-A with Thompson sampling over several agents (docs/algorithm.md §3–§6), as stateless ask/tell.

The caller owns one :class:`ABMCTSTree` per problem and alternates ``ask`` (where to expand, which agent
writes the node) and ``tell`` (the new node's score). Selection:

1. the root has no children → GEN at the root;
2. at node n draw θ_GEN ~ P(GEN_n), θ_CONT ~ P(CONT_n); if θ_GEN ≥ θ_CONT (ties → GEN) or n has no
   children, GEN a child of n; else descend to argmax_i θ_i, θ_i ~ P(value of child i);
3. the agent: argmax_a of a draw from the posterior over every score agent a earned in this tree.

Backup of a new node v (agent a, score r, parent p): r joins agent a's tree-wide scores, GEN_p and v's own
value posterior; for every ancestor u of v below the root (u = p, ...),
r joins u's value posterior and CONT of u's parent. No discount. This is TreeQuest's
``multiarm_bandit_thompson`` strategy of AB-MCTS-A, written out so that every posterior can be inspected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mars2.config import DISTS, Prior
from mars2.search.tree import ROOT, Expansion, SearchNode, SearchTree


@dataclass(frozen=True)
class DepthDecay:
    """T+ depth-guided exploration (docs/algorithm.md §16; our reading of the paper, which leaves c_d undefined).

    The score fed to GEN at the parent of a new node at depth d is r·γ(d)^{c_d}, with
    γ(d) = max(gamma_min, gamma0 − step·(d − 1)) and c_d the number of GEN expansions already made at depth d.
    """

    gamma0: float = 0.98
    step: float = 0.02
    gamma_min: float = 0.8

    def factor(self, depth: int, gens_at_depth: int) -> float:
        gamma = max(self.gamma_min, self.gamma0 - self.step * (depth - 1))
        return gamma**gens_at_depth


def nig_posterior(obs: list[float], prior: Prior) -> tuple[float, float, float, float]:
    """(m_n, κ_n, ν_n, τ_n²) after n observations with mean x̄ and scatter S = Σ(x − x̄)²:

    κ_n = κ0 + n, ν_n = ν0 + n, m_n = (κ0 m0 + n x̄)/κ_n, τ_n² = (ν0 τ0² + S + n κ0 (m0 − x̄)²/(κ0 + n)) / ν_n.
    """
    n = len(obs)
    if n == 0:
        return prior.m, prior.kappa, prior.nu, prior.tau2
    mean = sum(obs) / n
    scatter = sum((x - mean) ** 2 for x in obs)
    kappa, nu = prior.kappa + n, prior.nu + n
    m = (prior.kappa * prior.m + n * mean) / kappa
    tau2 = (prior.nu * prior.tau2 + scatter + n * prior.kappa * (prior.m - mean) ** 2 / (prior.kappa + n)) / nu
    return m, kappa, nu, tau2


def thompson_draw(obs: list[float], prior: Prior, rng: np.random.Generator) -> float:
    """One draw of the mean: NIG → σ² ~ InvGamma(ν_n/2, ν_n τ_n²/2), μ ~ N(m_n, σ²/κ_n); Beta → θ ~ Beta(a+Σr, b+Σ(1−r))."""
    if prior.dist == "beta":
        s = sum(obs)
        return float(rng.beta(prior.a + s, prior.b + len(obs) - s))
    m, kappa, nu, tau2 = nig_posterior(obs, prior)
    sigma2 = (nu * tau2 / 2) / rng.gamma(nu / 2)
    return float(rng.normal(m, math.sqrt(sigma2 / kappa)))


@dataclass
class ABMCTSNode(SearchNode):
    value_obs: list[float] = field(default_factory=list)  # value of this node, seen from its parent
    gen_obs: list[float] = field(default_factory=list)  # GEN posterior at this node
    cont_obs: list[float] = field(default_factory=list)  # CONT posterior at this node


@dataclass
class ABMCTSTree(SearchTree):
    """A :class:`SearchTree` with AB-MCTS-A's observations: every node's three posteriors, each agent's tree-wide
    scores and (for T+) the GEN expansions made at each depth."""

    agent_scores: dict[str, list[float]] = field(default_factory=dict)
    gens_at_depth: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        for a in self.agents:
            self.agent_scores.setdefault(a, [])

    def new_node(self, *, parent: int | None, depth: int, agent: str | None, score: float | None) -> ABMCTSNode:
        return ABMCTSNode(parent=parent, depth=depth, agent=agent, score=score)


class ABMCTSA:
    """Stateless policy (:class:`mars2.search.tree.TreePolicy`): all state lives in the :class:`ABMCTSTree` the
    caller passes in."""

    def __init__(self, prior: Prior = Prior(), depth_decay: DepthDecay | None = None):
        if prior.dist not in DISTS:
            raise ValueError(f"unknown posterior {prior.dist!r}; allowed: gaussian, beta")
        self.prior = prior
        self.depth_decay = depth_decay

    def new_tree(self, agents: tuple[str, ...]) -> ABMCTSTree:
        return ABMCTSTree(agents=agents)

    def ask(self, tree: ABMCTSTree, rng: np.random.Generator) -> Expansion:
        node_id = ROOT
        node = tree.root
        while node.children:
            gen = thompson_draw(node.gen_obs, self.prior, rng)
            cont = thompson_draw(node.cont_obs, self.prior, rng)
            if gen >= cont:
                break
            draws = [thompson_draw(tree.nodes[c].value_obs, self.prior, rng) for c in node.children]
            node_id = node.children[int(np.argmax(draws))]
            node = tree.nodes[node_id]
        return Expansion(parent=node_id, agent=self.choose_agent(tree, rng))

    def choose_agent(self, tree: ABMCTSTree, rng: np.random.Generator) -> str:
        """argmax over agents of a Thompson draw from each agent's tree-wide scores (one agent: itself)."""
        if len(tree.agents) == 1:
            return tree.agents[0]
        draws = [thompson_draw(tree.agent_scores[a], self.prior, rng) for a in tree.agents]
        return tree.agents[int(np.argmax(draws))]

    def tell(self, tree: ABMCTSTree, expansion: Expansion, score: float) -> int:
        """Add the node written by ``expansion.agent`` under ``expansion.parent`` with ``score``; back it up."""
        if self.prior.dist == "beta" and not 0.0 <= score <= 1.0:
            raise ValueError(f"beta posteriors need scores in [0, 1], got {score}")
        parent = tree.node(expansion.parent)
        new_id = tree.add(expansion, score)
        depth = tree.nodes[new_id].depth
        tree.nodes[new_id].value_obs.append(score)
        tree.agent_scores.setdefault(expansion.agent, []).append(score)
        gen_score = score
        if self.depth_decay is not None:
            gen_score = score * self.depth_decay.factor(depth, tree.gens_at_depth.get(depth, 0))
        tree.gens_at_depth[depth] = tree.gens_at_depth.get(depth, 0) + 1
        parent.gen_obs.append(gen_score)
        u = expansion.parent
        while u != ROOT:
            node = tree.nodes[u]
            node.value_obs.append(score)
            up = tree.node(node.parent)
            up.cont_obs.append(score)
            u = node.parent
        return new_id

