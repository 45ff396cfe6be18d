"""One evaluation's tables, metric names and plots, from its graded samples and trees (pure; no I/O but plots).

Inputs (pandas DataFrames, every program already graded on the hidden tests):

* ``samples`` — i.i.d. samples: ``problem_id``, ``agent``, ``code``, ``reward`` (+ ``difficulty``, ``platform``).
* ``trees`` — evaluation trees: ``who`` (``"team"`` for the shared tree of all agents, or an agent's name for its
  tree alone), ``tplus`` (bool: built with the T+ test-time strategy), ``problem_id``, ``node_id``, ``agent``,
  ``score`` (public pass fraction), ``code``, ``reward`` (+ ``difficulty``, ``platform``).

Metric names are stable and MLflow-safe (MLflow names cannot hold ``@``: ``pass_at_1`` stands for Pass@1):

=====================================  ==========================================================================
``<agent>/pass_at_1``                  mean over problems of c/n of the agent's i.i.d. samples (Pass@1)
``<agent>/pass_at_<k>``                unbiased pass@k, for each k of ``ks`` with k <= n_samples
``team/pass_at_1``                     mean of the agents' Pass@1 (a random agent answers each problem)
``<who>/pass_at_1_mcts``               Pass@1(MCTS): hidden reward of the tree's final answer (best public score,
                                       ties → latest node)
``<who>/pass_at_n``                    Pass@N: any node of the tree passes the hidden tests
``<who>/public_pass_accuracy``         mean hidden reward of the nodes that pass all public tests
``…_tplus``                            the same from trees built with T+ (error feedback + depth-guided search)
``<metric>/<difficulty>``              the same over the problems of one difficulty
``<metric>/platform/<platform>``       the same over one platform (when there are several)
``team/da_at_<K>``, ``team/aec``,      our diversity metrics (docs/eval.md) of the correct programs of the team
``team/g_vendi``                       tree (T+ off when it was built, else T+ on)
=====================================  ==========================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mars2.eval.diversity import diversity_metrics
from mars2.eval.metrics import sample_metrics, summarise, tree_metrics

TEAM = "team"
TREE_METRICS = ("pass_at_1_mcts", "pass_at_n", "public_pass_accuracy")


def tplus_suffix(tplus: bool) -> str:
    return "_tplus" if tplus else ""


def per_problem_results(samples: pd.DataFrame, trees: pd.DataFrame, ks: Sequence[int] = (1,)) -> pd.DataFrame:
    """The per-problem results table: one row per (problem, who, kind, tplus).

    ``kind`` is ``samples`` (columns ``n``, ``c``, ``pass_at_1``, ``pass_at_<k>``) or ``tree`` (columns of
    :func:`mars2.eval.metrics.tree_metrics`); ``who`` is an agent or ``team``.
    """
    parts = []
    if len(samples):
        per_agent = sample_metrics(samples, ks, per_agent=True).rename(columns={"agent": "who"})
        parts.append(per_agent.assign(kind="samples", tplus=False))
    for (who, tplus), nodes in trees.groupby(["who", "tplus"], sort=True) if len(trees) else ():
        parts.append(tree_metrics(nodes).assign(who=who, kind="tree", tplus=bool(tplus)))
    if not parts:
        raise ValueError("evaluation: neither samples nor trees to score")
    table = pd.concat(parts, ignore_index=True)
    first = ["problem_id", "who", "kind", "tplus"]
    return table[first + [c for c in table.columns if c not in first]]


def evaluation_metrics(results: pd.DataFrame, trees: pd.DataFrame, *, ks: Sequence[int] = (1,),
                       diversity_k: int = 4) -> dict[str, float]:
    """Flat ``{name: value}`` with the names of the module docstring; NaN values are left out."""
    out: dict[str, float] = {}
    samples = results[results["kind"] == "samples"]
    agent_pass = []
    for who, rows in samples.groupby("who", sort=True):
        cols = ["pass_at_1"] + [f"pass_at_{k}" for k in sorted(set(ks) - {1}) if f"pass_at_{k}" in rows.columns]
        out |= _summary(rows[["problem_id", *cols, *_labels(rows)]], f"{who}/")
        agent_pass.append(float(rows["pass_at_1"].mean()))
    if agent_pass:
        out[f"{TEAM}/pass_at_1"] = sum(agent_pass) / len(agent_pass)
    tree_rows = results[results["kind"] == "tree"]
    for (who, tplus), rows in tree_rows.groupby(["who", "tplus"], sort=True):
        out |= _summary(rows[["problem_id", *TREE_METRICS, *_labels(rows)]], f"{who}/", tplus_suffix(bool(tplus)))
    team = trees[trees["who"] == TEAM] if len(trees) else trees
    if len(team):
        plain = team[~team["tplus"].astype(bool)]
        div = diversity_metrics(plain if len(plain) else team, diversity_k)
        out |= {f"{TEAM}/da_at_{diversity_k}": div["da_at_k"], f"{TEAM}/aec": div["aec"],
                f"{TEAM}/g_vendi": div["g_vendi"], f"{TEAM}/n_problems_with_correct": div["n_problems_with_correct"]}
    out["n_problems"] = int(results["problem_id"].nunique())
    return {k: float(v) for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


def _labels(rows: pd.DataFrame) -> list[str]:
    # a label is used only when every problem has one (HumanEval has no difficulty: "")
    return [c for c in ("difficulty", "platform") if c in rows.columns and rows[c].notna().all()
            and (rows[c].astype(str).str.strip() != "").all()]


def _summary(per_problem: pd.DataFrame, prefix: str, suffix: str = "") -> dict[str, float]:
    """Overall and per-difficulty means (``<metric>/<difficulty>``), and per platform (``<metric>/platform/<p>``)
    when the problems come from more than one platform."""
    by = "difficulty" if "difficulty" in per_problem.columns else None
    table = summarise(per_problem.drop(columns=["platform"], errors="ignore"), by=by)
    metrics = [c for c in table.columns if c != "n_problems" and not c.endswith("_n_problems")]
    out = {}
    for group, row in table.iterrows():
        tail = "" if group == "all" else f"/{group}"
        out |= {f"{prefix}{m}{suffix}{tail}": row[m] for m in metrics}
    if "platform" in per_problem.columns and per_problem["platform"].nunique() > 1:
        platforms = summarise(per_problem.drop(columns=["difficulty"], errors="ignore"), by="platform")
        for group, row in platforms.drop(index="all").iterrows():
            out |= {f"{prefix}{m}{suffix}/platform/{group}": row[m] for m in metrics}
    return out


def headline(metrics: dict[str, float]) -> pd.DataFrame:
    """One row per agent/team with the paper's columns: Pass@1, Pass@1(MCTS), Pass@N (and their T+ variants)."""
    whos = sorted({k.split("/")[0] for k in metrics if "/" in k}, key=lambda w: (w == TEAM, w))
    cols = ["pass_at_1", "pass_at_1_mcts", "pass_at_n", "pass_at_1_mcts_tplus", "pass_at_n_tplus"]
    rows = [{"who": w, **{c: metrics.get(f"{w}/{c}", float("nan")) for c in cols}} for w in whos]
    table = pd.DataFrame(rows, columns=["who", *cols]).set_index("who")
    return table.dropna(axis=1, how="all")


def plot_difficulty(results: pd.DataFrame, path: str | Path) -> Path:
    """Grouped bars: per difficulty, Pass@1 of each agent and Pass@1(MCTS)/Pass@N of each tree (T+ off)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, pd.Series] = {}
    if "difficulty" not in results.columns:
        results = results.assign(difficulty="all")
    for who, rows in results[results["kind"] == "samples"].groupby("who", sort=True):
        series[f"{who} Pass@1"] = rows.groupby("difficulty")["pass_at_1"].mean()
    trees = results[(results["kind"] == "tree") & ~results["tplus"].astype(bool)]
    for who, rows in trees.groupby("who", sort=True):
        series[f"{who} Pass@1(MCTS)"] = rows.groupby("difficulty")["pass_at_1_mcts"].mean()
        series[f"{who} Pass@N"] = rows.groupby("difficulty")["pass_at_n"].mean()
    table = pd.DataFrame(series)
    order = [d for d in ("easy", "medium", "hard") if d in table.index] + [d for d in table.index
                                                                          if d not in ("easy", "medium", "hard")]
    table = table.loc[order]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(table) * max(1, len(series)) ** 0.5), 4))
    table.plot.bar(ax=ax, rot=0, width=0.8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of problems")
    ax.set_title("held-out results by difficulty")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_curves(history: pd.DataFrame, path: str | Path, *, title: str = "held-out pass rate per cycle") -> Path:
    """Lines of metric value over cycle; ``history`` has columns ``metric``, ``cycle``, ``value``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (name, rows) in enumerate(history.sort_values("cycle").groupby("metric", sort=True)):
        # equal values are common (a tiny run's agents at the same rate): a line style and marker size of its own
        # keeps a line drawn over another visible
        ax.plot(rows["cycle"], rows["value"], marker="osD^v<>p"[i % 8], markersize=9 - 2 * (i % 3),
                linestyle=("-", "--", ":", "-.")[i % 4], alpha=0.85, label=name)
    positions, labels = cycle_ticks(sorted(history["cycle"].unique()))
    if positions:
        ax.set_xticks(positions, labels)
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("cycle")
    ax.set_ylabel("pass rate")
    ax.set_ylim(-0.03, 1.03)  # markers at 0 and 1 drawn whole
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def cycle_ticks(cycles: list[int], most: int = 12) -> tuple[list[int], list[str]]:
    """The x ticks of a per-cycle plot: every cycle (whole numbers only), the evaluation before training (cycle -1)
    labelled ``start``; none (a locator of whole numbers decides) when there are more than ``most``."""
    if len(cycles) > most:
        return [], []
    return [int(c) for c in cycles], ["start" if c < 0 else str(int(c)) for c in cycles]


def save_figure(fig, path: str | Path) -> Path:
    """Write a matplotlib figure atomically (temp file + rename) and close it."""
    import os

    import matplotlib.pyplot as plt

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.png")
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
