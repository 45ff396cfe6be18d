"""One problem's search tree and the ask/tell protocol every tree search strategy follows (docs/algorithm.md §3).

A strategy is stateless: all it knows lives in the :class:`SearchTree` it made (``new_tree``), which the caller
keeps, one per problem. The caller alternates ``ask`` (where to expand: a parent, −1 = the root, i.e. a fresh
solution; and which agent writes the node) and ``tell`` (the new node's score s_v in [0, 1]; returns its id).
Several asks before their tells are allowed (``search.expansions_per_wave`` > 1): they do not see each other.
:data:`mars2.search.run.TREE_POLICIES` maps ``search.strategy`` to a strategy's builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

ROOT = -1


@dataclass
class SearchNode:
    parent: int | None  # None for the root, ROOT (−1) for children of the root
    depth: int
    agent: str | None
    score: float | None
    children: list[int] = field(default_factory=list)


@dataclass
class SearchTree:
    """One problem's tree. ``nodes[i]`` is node i in expansion order; the root is separate (id −1). A strategy that
    keeps statistics per node or per tree subclasses both this and :class:`SearchNode` (``new_node``)."""

    agents: tuple[str, ...]
    root: SearchNode = field(init=False)
    nodes: list[SearchNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = self.new_node(parent=None, depth=0, agent=None, score=None)

    def new_node(self, *, parent: int | None, depth: int, agent: str | None, score: float | None) -> SearchNode:
        return SearchNode(parent=parent, depth=depth, agent=agent, score=score)

    def node(self, i: int) -> SearchNode:
        return self.root if i == ROOT else self.nodes[i]

    def add(self, expansion: Expansion, score: float) -> int:
        """Append the node ``expansion`` asked for, with ``score``, as the next id; returns that id."""
        parent = self.node(expansion.parent)
        new_id = len(self.nodes)
        self.nodes.append(self.new_node(parent=expansion.parent, depth=parent.depth + 1, agent=expansion.agent,
                                        score=score))
        parent.children.append(new_id)
        return new_id

    def __len__(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class Expansion:
    """Where to add the next node (``parent``: −1 = the root, i.e. a fresh solution) and which agent writes it."""

    parent: int
    agent: str


class TreePolicy(Protocol):
    """A tree search strategy: where to expand next and what a new node's score changes (module docstring)."""

    def new_tree(self, agents: tuple[str, ...]) -> SearchTree:
        """An empty tree (the root only) with whatever state this strategy keeps."""

    def ask(self, tree: SearchTree, rng: np.random.Generator) -> Expansion:
        """The next expansion; random choices draw from ``rng`` only (a tree's own generator)."""

    def tell(self, tree: SearchTree, expansion: Expansion, score: float) -> int:
        """Add the node ``expansion`` asked for with ``score``; returns its id (:meth:`SearchTree.add`)."""
