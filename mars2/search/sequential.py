"""Sequential refinement (``search.strategy=sequential``): the AB-MCTS paper's chain baseline, and the worked example
of adding a tree search strategy (docs/algorithm.md §3.1).

The first node is a fresh solution (GEN at the root); node i > 0 refines node i − 1, so a ``max_nodes``-node tree is
one chain of depth ``max_nodes``. The agents take turns: the j-th ask of a tree goes to ``agents[j mod m]``. No
score steers the search; with ``expansions_per_wave`` = k > 1, the k asks of a round all refine the last node told.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mars2.search.tree import ROOT, Expansion, SearchTree


@dataclass
class SequentialTree(SearchTree):
    """A :class:`SearchTree` that counts the asks made of it (the agents' turns count asks, not tells)."""

    asked: int = 0


class SequentialRefinement:
    """Stateless policy (:class:`mars2.search.tree.TreePolicy`); see the module docstring."""

    def new_tree(self, agents: tuple[str, ...]) -> SequentialTree:
        return SequentialTree(agents=agents)

    def ask(self, tree: SequentialTree, rng: np.random.Generator) -> Expansion:
        agent = tree.agents[tree.asked % len(tree.agents)]
        tree.asked += 1
        return Expansion(parent=len(tree) - 1 if len(tree) else ROOT, agent=agent)

    def tell(self, tree: SequentialTree, expansion: Expansion, score: float) -> int:
        return tree.add(expansion, score)
