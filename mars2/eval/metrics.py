"""LiveCodeBench metrics as pure functions (docs/algorithm.md §17–§18).

Two input tables, both pandas DataFrames:

* **nodes** (tree evaluation): one row per tree node — ``problem_id``, ``node_id`` (expansion order within its
  tree, larger = later), ``agent``, ``score`` (fraction of the *public* tests passed: what the search sees),
  ``reward`` (1 iff the program passes every *hidden* test); optional ``difficulty``, ``platform``.
* **samples** (i.i.d. sampling): ``problem_id``, ``agent``, ``reward``, one row per sample; optional
  ``difficulty``, ``platform``.

:func:`tree_metrics` and :func:`sample_metrics` reduce them to one row per problem; :func:`summarise` averages
those rows over problems, overall or per difficulty/platform/agent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from math import comb

import numpy as np
import pandas as pd

CARRIED = ("difficulty", "platform")
"""Per-problem labels copied through to the per-problem tables when present."""

NODE_COLUMNS = ("problem_id", "node_id", "agent", "score", "reward")
SAMPLE_COLUMNS = ("problem_id", "agent", "reward")

# Columns of the per-problem tables that label a problem rather than measure it; summarise() skips them.
_LABELS = frozenset({"problem_id", "agent", "final_node_id", "final_agent", *CARRIED})
_DIFFICULTY_ORDER = ("easy", "medium", "hard")

Scorer = Callable[[pd.DataFrame], int]
"""Picks a tree's final answer: gets one problem's node rows (every column), returns the chosen ``node_id``."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 − C(n−c, k) / C(n, k)."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(per_problem: Sequence[tuple[int, int]], k: int) -> float:
    """Mean over problems of :func:`pass_at_k`; ``per_problem`` holds (n, c) pairs. Pass@1 is k=1."""
    if not per_problem:
        return 0.0
    return sum(pass_at_k(n, c, k) for n, c in per_problem) / len(per_problem)


def final_node(node_ids: Sequence[int], scores: Sequence[float]) -> int:
    """The T+ final answer of one tree: argmax of the public score, ties → the latest node (largest node_id).

    ``node_ids`` and ``scores`` are parallel, shape (N,); returns the chosen node_id.
    """
    ids = [int(i) for i in node_ids]
    vals = [float(s) for s in scores]
    if len(ids) != len(vals):
        raise ValueError(f"final_node: {len(ids)} node ids but {len(vals)} scores")
    if not ids:
        raise ValueError("final_node: the tree has no nodes")
    if any(np.isnan(vals)):
        raise ValueError("final_node: a public score is NaN (grade every node on its public tests first)")
    if len(set(ids)) != len(ids):
        raise ValueError("final_node: node ids repeat within one tree")
    return max(zip(vals, ids))[1]


def default_scorer(tree: pd.DataFrame) -> int:
    """The paper's rule as a :data:`Scorer`: :func:`final_node` on the tree's ``node_id`` and ``score``."""
    return final_node(tree["node_id"].tolist(), tree["score"].tolist())


def pick_final(tree: pd.DataFrame, scorer: Scorer | None = None) -> pd.Series:
    """The row of one tree's final answer, chosen by ``scorer`` (default :func:`default_scorer`)."""
    chosen = (scorer or default_scorer)(tree)
    hit = tree.loc[tree["node_id"] == chosen]
    if hit.empty:
        raise ValueError(f"the scorer picked node {chosen!r}, which is not in the tree")
    return hit.iloc[0]


def pass_at_1_mcts(tree: pd.DataFrame, scorer: Scorer | None = None) -> float:
    """Pass@1(MCTS) of one tree: the hidden reward r of its final answer (:func:`pick_final`)."""
    return float(pick_final(tree, scorer)["reward"])


def pass_at_n(rewards: Iterable[float]) -> float:
    """Pass@N of one tree (or sample set): max_v r_v, i.e. 1 if any node passes the hidden tests."""
    vals = list(rewards)
    if not vals:
        raise ValueError("pass_at_n: no nodes")
    return float(max(vals))


def public_pass_accuracy(scores: Sequence[float], rewards: Sequence[float]) -> float:
    """Mean hidden reward over the nodes that pass every public test: mean{r_v : score_v = 1}; NaN if none do.

    How often "passes the public tests" (all the search can see) means "passes the hidden tests".
    """
    s = np.asarray(scores, dtype=float)
    r = np.asarray(rewards, dtype=float)
    if s.shape != r.shape:
        raise ValueError(f"public_pass_accuracy: {s.shape[0]} scores but {r.shape[0]} rewards")
    passed = s >= 1.0
    return float(r[passed].mean()) if passed.any() else float("nan")


def tree_metrics(nodes: pd.DataFrame, scorer: Scorer | None = None) -> pd.DataFrame:
    """One row per ``problem_id`` of a nodes table (see the module docstring).

    Columns: ``pass_at_1_mcts`` (hidden reward of the final node), ``pass_at_n`` (any node passes hidden),
    ``public_pass_accuracy`` (NaN when no node passes all public tests), ``n_nodes``, ``final_node_id``,
    ``final_agent``, and ``difficulty``/``platform`` when present. ``scorer`` replaces the default
    final-answer rule (best public score, ties → latest node).
    """
    _check_table(nodes, NODE_COLUMNS, "nodes")
    _check_binary(nodes["reward"], "nodes")
    score = nodes["score"].astype(float)
    if score.isna().any() or ((score < 0) | (score > 1)).any():
        raise ValueError("nodes: 'score' must be a public pass fraction in [0, 1] for every node")
    rows = []
    for pid, tree in nodes.groupby("problem_id", sort=True):
        if tree["node_id"].duplicated().any():
            raise ValueError(f"nodes: problem {pid!r} has repeated node_id values")
        try:
            final = pick_final(tree, scorer)
        except ValueError as err:
            raise ValueError(f"problem {pid!r}: {err}") from err
        rows.append({
            "problem_id": pid,
            "pass_at_1_mcts": float(final["reward"]),
            "pass_at_n": pass_at_n(tree["reward"]),
            "public_pass_accuracy": public_pass_accuracy(tree["score"], tree["reward"]),
            "n_nodes": len(tree),
            "final_node_id": int(final["node_id"]),
            "final_agent": final["agent"],
            **_carried(tree, pid),
        })
    return pd.DataFrame(rows)


def sample_metrics(samples: pd.DataFrame, ks: Sequence[int] = (1,), per_agent: bool = False) -> pd.DataFrame:
    """One row per problem (per (problem, agent) with ``per_agent``) of an i.i.d. samples table.

    Columns: ``n`` samples, ``c`` correct, ``pass_at_1`` = c/n, and ``pass_at_<k>`` = 1 − C(n−c,k)/C(n,k) for
    every other k in ``ks`` (NaN where k > n), plus ``difficulty``/``platform`` (and ``agent``) when present.
    Pooling agents gives the team's numbers; ``per_agent=True`` gives each agent's.
    """
    _check_table(samples, SAMPLE_COLUMNS, "samples")
    _check_binary(samples["reward"], "samples")
    ks = sorted({int(k) for k in ks} - {1})
    if any(k < 1 for k in ks):
        raise ValueError(f"sample_metrics: every k must be >= 1, got {ks}")
    keys = ["problem_id", "agent"] if per_agent else ["problem_id"]
    rows = []
    for key, group in samples.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        n, c = len(group), int(group["reward"].sum())
        row = dict(zip(keys, key)) | {"n": n, "c": c, "pass_at_1": c / n}
        row |= {f"pass_at_{k}": pass_at_k(n, c, k) if k <= n else float("nan") for k in ks}
        rows.append(row | _carried(group, key[0]))
    return pd.DataFrame(rows)


def summarise(per_problem: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """Means over problems of every metric column of a per-problem table, NaN-aware.

    Returns one row labelled ``"all"`` and, with ``by`` (``"difficulty"``, ``"platform"``, ``"agent"``, …), one
    row per group before it; the index is named ``by`` (or ``"group"``). ``n_problems`` counts each row's
    problems; a metric that is NaN for some problems (``public_pass_accuracy``, ``pass_at_k`` with k > n)
    averages only the others and gets a ``<metric>_n_problems`` column saying how many.
    """
    if per_problem.empty:
        raise ValueError("summarise: the per-problem table is empty; no metric is defined over zero problems")
    if by is not None and by not in per_problem.columns:
        raise ValueError(f"summarise: no column {by!r} to group by (columns: {sorted(per_problem.columns)})")
    metrics = [c for c in per_problem.columns
               if c not in _LABELS and c != by and pd.api.types.is_numeric_dtype(per_problem[c])]
    if not metrics:
        raise ValueError(f"summarise: no numeric metric column in {sorted(per_problem.columns)}")
    partial = [c for c in metrics if per_problem[c].isna().any()]

    def reduce(frame: pd.DataFrame) -> dict[str, float]:
        out: dict[str, float] = {"n_problems": len(frame)}
        out |= {c: float(frame[c].mean()) for c in metrics}
        out |= {f"{c}_n_problems": int(frame[c].notna().sum()) for c in partial}
        return out

    rows, labels = [], []
    if by is not None:
        for label, group in per_problem.groupby(by, sort=False, dropna=False):
            labels.append(label)
            rows.append(reduce(group))
        order = sorted(range(len(labels)), key=lambda i: _group_rank(labels[i]))
        labels, rows = [labels[i] for i in order], [rows[i] for i in order]
    labels.append("all")
    rows.append(reduce(per_problem))
    return pd.DataFrame(rows, index=pd.Index(labels, name=by or "group"))


def _group_rank(label: object) -> tuple[int, str]:
    # easy < medium < hard reads better than alphabetical; anything else sorts after, by name.
    text = str(label)
    return (_DIFFICULTY_ORDER.index(text), "") if text in _DIFFICULTY_ORDER else (len(_DIFFICULTY_ORDER), text)


def _check_table(table: pd.DataFrame, required: Sequence[str], name: str) -> None:
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"{name}: expected a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise ValueError(f"{name} table is missing column(s) {missing}; it needs {list(required)}")
    if table.empty:
        raise ValueError(f"{name} table is empty: no metric is defined over zero problems")


def _check_binary(reward: pd.Series, name: str) -> None:
    values = reward.astype(float)
    if values.isna().any() or not values.isin([0.0, 1.0]).all():
        raise ValueError(f"{name}: 'reward' must be the 0/1 hidden-test verdict (raw, unshaped), "
                         f"got values {sorted(set(values.dropna().tolist()))[:5]}"
                         + (" and NaN" if values.isna().any() else ""))


def _carried(group: pd.DataFrame, pid: object) -> dict[str, object]:
    out = {}
    for col in CARRIED:
        if col in group.columns:
            values = group[col].dropna().unique()
            if len(values) > 1:
                raise ValueError(f"problem {pid!r} has several {col} values: {list(values)}")
            out[col] = values[0] if len(values) else None
    return out
