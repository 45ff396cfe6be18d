"""Summaries and pictures of search trees, from their node table (one row per node)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mars2.search.tree import ROOT


def tree_stats(nodes: pd.DataFrame) -> dict[str, float]:
    """Nodes and public pass rate per agent, depth histogram, share of cross-agent refinements."""
    stats: dict[str, float] = {}
    for agent, g in nodes.groupby("agent"):
        stats[f"{agent}/nodes_per_tree"] = len(g) / nodes["problem_id"].nunique()
        stats[f"{agent}/public_pass_rate"] = float((g["public_status"] == "AC").mean())
        stats[f"{agent}/mean_score"] = float(g["score"].mean())
    for depth, n in nodes["depth"].value_counts().sort_index().items():
        stats[f"depth/{int(depth)}"] = float(n)
    refine = nodes[nodes["parent"] != ROOT]
    stats["refine_share"] = len(refine) / max(len(nodes), 1)
    stats["cross_agent_refine_share"] = float((refine["agent"] != refine["parent_agent"]).mean()) if len(refine) else 0.0
    stats["max_depth"] = float(nodes["depth"].max()) if len(nodes) else 0.0
    return stats


def plot_trees(nodes: pd.DataFrame, path: str | Path, max_trees: int = 4) -> Path:
    """A picture of the first ``max_trees`` trees: node colour = agent, label = public score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = list(dict.fromkeys(nodes["problem_id"]))[:max_trees]
    agents = sorted(nodes["agent"].unique())
    colours = {a: plt.cm.tab10(i % 10) for i, a in enumerate(agents)}
    fig, axes = plt.subplots(1, max(len(ids), 1), figsize=(4 * max(len(ids), 1), 3.6), squeeze=False)
    for ax, pid in zip(axes[0], ids, strict=False):
        t = nodes[nodes["problem_id"] == pid].sort_values("node_id")
        pos = _layout(t)
        for r in t.itertuples():
            px, py = pos[r.parent]
            x, y = pos[r.node_id]
            ax.plot([px, x], [py, y], color="0.7", zorder=1)
        ax.scatter(*pos[ROOT], s=120, color="black", zorder=2)
        for r in t.itertuples():
            x, y = pos[r.node_id]
            ax.scatter(x, y, s=220, color=colours[r.agent], zorder=3)
            ax.annotate(f"{r.score:.1f}", (x, y), ha="center", va="center", fontsize=7, zorder=4)
        ax.set_title(pid, fontsize=9)
        ax.axis("off")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", ls="", color=colours[a], label=a) for a in agents]
    fig.legend(handles=handles, loc="lower center", ncol=len(agents), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_tree(nodes: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """One tree, large enough to read, drawn left to right (depth across, siblings down: a search tree is wide and
    shallow, and an image viewer fits the width): each node a box labelled ``#<node id> <agent>``, its hidden verdict
    (status), reward and advantage Â (``flat``: a tree whose rewards are all equal trains nothing), edge = refinement
    of the parent, colour = agent, a bold edge for reward 1.

    ``nodes``: one tree's rows with ``node_id``, ``parent``, ``agent``, ``status``, ``reward`` and ``advantage`` (NaN
    for a node that is not trained)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = nodes.sort_values("node_id")
    pos = {n: (-y, x) for n, (x, y) in _layout(t).items()}  # (depth, leaf order)
    depth = max(x for x, _ in pos.values()) + 1
    leaves = max(y for _, y in pos.values()) + 1
    agents = sorted(t["agent"].unique())
    colours = {a: plt.cm.Pastel1(i % 9) for i, a in enumerate(agents)}
    fig, ax = plt.subplots(figsize=(1.0 + 2.6 * depth, 0.8 + 0.85 * leaves))
    for r in t.itertuples():
        (px, py), (x, y) = pos[r.parent], pos[r.node_id]
        ax.plot([px, x], [py, y], color="0.6", zorder=1)
    ax.annotate("problem", pos[ROOT], ha="center", va="center", fontsize=10, color="white",
                bbox={"boxstyle": "round", "fc": "0.2"})
    for r in t.itertuples():
        adv = "flat" if r.advantage != r.advantage else f"Â {r.advantage:+.2f}"
        ax.annotate(f"#{r.node_id} {r.agent}\n{r.status}  r={r.reward:g}  {adv}", pos[r.node_id], ha="center",
                    va="center", fontsize=9, zorder=3,
                    bbox={"boxstyle": "round", "fc": colours[r.agent], "ec": "0.1" if r.reward else "0.6",
                          "lw": 2.0 if r.reward else 0.8})
    ax.set_xlim(-0.6, depth - 0.4)
    ax.set_ylim(leaves - 0.5, -0.5)
    ax.set_title(title, fontsize=11)
    ax.axis("off")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _layout(t: pd.DataFrame) -> dict[int, tuple[float, float]]:
    children: dict[int, list[int]] = {}
    for r in t.itertuples():
        children.setdefault(r.parent, []).append(r.node_id)
    pos: dict[int, tuple[float, float]] = {}
    next_x = [0.0]

    def place(n: int, depth: int) -> float:
        kids = children.get(n, [])
        x = sum(place(k, depth + 1) for k in kids) / len(kids) if kids else next_x[0]
        if not kids:
            next_x[0] += 1
        pos[n] = (x, -depth)
        return x

    place(ROOT, 0)
    return pos
