"""The refine gate: on the same problems, does refining a failed program succeed more often than a fresh sample?

A tree's refine node is only worth its sample when refining beats writing afresh; otherwise the search is worse than
i.i.d. sampling and no multi-agent study can show cross-agent error correction. For a team and a problem set:

* **fresh**: ``n_fresh`` programs per (problem, agent) from the generate prompt: each agent's baseline;
* **pool**: ``n_pool`` more programs per (problem, agent), drawn on a seed of their own, that only supply parents;
* **parents**: per (problem, author), the first ``n_parents`` of the author's pool programs that fail a public test
  (what a tree would refine: the search sees public tests only);
* **refines**: every agent A refines every parent of every author B once, from the tree's refine prompt (statement,
  the parent's code, its public result; with ``detailed_feedback`` the failing input, expected and actual output).

The baseline never supplies a parent. Were the parents drawn from the baseline's own programs, a problem would enter
the gate only when the baseline failed on it and a self-refiner's own failure would sit in its baseline: under a null
where refining is exactly as good as a fresh sample, Δ would come out biased (self-refinement up, cross-agent
refinement down) and a set would "hold" falsely several times its nominal rate
(tests/mars2/eval/test_gate_calibration.py).

Success is the reward r ∈ {0, 1} (all hidden tests pass), graded after generation. A refine attempt j by agent A on
problem p is matched with A's fresh success rate on p, f_A(p) = mean_i r(fresh_{A,p,i}). For a set J of attempts
(one refiner–author pair, all self-refinements A = B, all cross-agent ones A ≠ B, or all), over the problems P_J
with at least one attempt in J:

    refine(p) = mean_{j ∈ J_p} r_j        fresh(p) = mean_{j ∈ J_p} f_{A_j}(p)
    Δ_J = mean_{p ∈ P_J} [refine(p) − fresh(p)]

with a paired percentile bootstrap interval over P_J (:func:`mars2.eval.stats.paired_bootstrap`). The gate passes
when Δ over all attempts holds (its interval lies above 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from mars2.backends.base import SamplingParams, request_seed
from mars2.data.schema import Problem
from mars2.eval.stats import bootstrap_mean, paired_bootstrap
from mars2.journal import Journal, kept_or_made
from mars2.search.prompts import extract_code, refine_prompt, result_summary
from mars2.search.sampling import run_independent_sampling
from mars2.search.scheduler import AgentRunner, GradeFn, public_score

ATTEMPTS = "attempts"  # the journal's part of the gate's generation phases
ATTEMPT_COLUMNS = ("problem_id", "node_id", "kind", "agent", "author", "parent", "code", "public_status",
                   "public_passed", "public_total", "score", "response_len")


def gate_attempts(problems: Sequence[Problem], runners: Mapping[str, AgentRunner], *, n_fresh: int, n_parents: int,
                  sampling: SamplingParams, grade: GradeFn, n_pool: int | None = None, detailed_feedback: bool = False,
                  progress: Callable[[int, int], None] | None = None, journal: Journal | None = None) -> pd.DataFrame:
    """Every baseline program, every pool program and every refine attempt, one row each (:data:`ATTEMPT_COLUMNS`),
    scored on the public tests. ``node_id`` numbers a problem's rows: fresh ones, then pool ones, then refines;
    ``kind`` is ``fresh``, ``pool`` or ``refine``; a refine row's ``author`` and ``parent`` name the pool row it refines
    (its agent and ``node_id``); other rows have ``author`` = ``agent`` and ``parent`` = −1. ``n_pool`` defaults to
    ``n_fresh``. Fresh programs draw on ``sampling.seed``, refines on seed + 1, the pool on seed + 2. ``progress`` is
    told ``(programs generated, programs in all)``: the total grows once the parents are known. With ``journal``,
    each phase (the fresh programs, the pool, each agent's refines) is kept under ``attempts`` as it is done, and a
    phase an earlier run of the stage key kept is not generated again."""
    n_pool = n_fresh if n_pool is None else n_pool
    if n_fresh < 1 or n_parents < 1 or n_pool < 1:
        raise ValueError(f"the gate needs n_fresh, n_pool and n_parents >= 1, got {n_fresh}, {n_pool} and {n_parents}")
    by_id = {p.id: p for p in problems}
    sampled_total = (n_fresh + n_pool) * len(problems) * len(runners)

    def sample(n: int, seed: int, before: int):
        return pd.DataFrame(run_independent_sampling(
            problems, runners, n_samples=n, sampling=dataclasses.replace(sampling, seed=seed), grade=grade,
            progress=None if progress is None else (lambda done, _t: progress(before + done, sampled_total))))

    fresh = kept_or_made(journal, ATTEMPTS, "fresh", lambda: sample(n_fresh, sampling.seed, 0))
    pool = kept_or_made(journal, ATTEMPTS, "pool",
                        lambda: sample(n_pool, sampling.seed + 2, n_fresh * len(problems) * len(runners)))
    pool["node_id"] += n_fresh * len(runners)
    failed = pool[pool["score"] < 1.0].groupby(["problem_id", "agent"], sort=False).head(n_parents)
    parents = list(failed.itertuples(index=False))
    total = sampled_total + len(parents) * len(runners)
    params = dataclasses.replace(sampling, n=1, seed=sampling.seed + 1)
    refines: list[dict[str, Any]] = []
    for k, (name, runner) in enumerate(runners.items()):
        made = kept_or_made(journal, ATTEMPTS, f"refine-{name}", lambda name=name, runner=runner: pd.DataFrame(
            refine_parents(name, runner, parents, by_id, params, grade, detailed_feedback),
            columns=[c for c in ATTEMPT_COLUMNS if c != "node_id"]))
        refines += made.to_dict(orient="records")
        if progress is not None:
            progress(sampled_total + (k + 1) * len(parents), total)
    refine_rows = pd.DataFrame(refines, columns=[c for c in ATTEMPT_COLUMNS if c != "node_id"])
    refine_rows["node_id"] = (n_fresh + n_pool) * len(runners) + refine_rows.groupby("problem_id").cumcount()
    sampled = [rows.assign(kind=kind, author=rows["agent"], parent=-1)[list(ATTEMPT_COLUMNS)]
               for kind, rows in (("fresh", fresh), ("pool", pool))]
    table = pd.concat([*sampled, refine_rows[list(ATTEMPT_COLUMNS)]], ignore_index=True)
    order = {p.id: i for i, p in enumerate(problems)}
    return table.sort_values(["problem_id", "node_id"], key=lambda c: c.map(order) if c.name == "problem_id" else c,
                             kind="stable").reset_index(drop=True)


def refine_parents(name: str, runner: AgentRunner, parents: Sequence[Any], problems: Mapping[str, Problem],
                   params: SamplingParams, grade: GradeFn, detailed_feedback: bool) -> list[dict[str, Any]]:
    """Agent ``name`` refines each parent (a fresh row) once from the tree's refine prompt; one row per attempt."""
    if not parents:
        return []
    texts = [runner.chat(refine_prompt(problems[q.problem_id], q.code if isinstance(q.code, str) else None,
                                       result_summary(q.public_status, q.public_passed, q.public_total,
                                                      q.public_detail, detailed=detailed_feedback)))
             for q in parents]
    seeds = [request_seed(params.seed, q.problem_id, q.node_id, name) for q in parents]
    generations = [gens[0] for gens in runner.backend.generate(texts, params, seeds)]
    codes = [extract_code(g.text) for g in generations]
    verdicts = grade([(c, problems[q.problem_id].public_tests, problems[q.problem_id].func_name)
                      for q, c in zip(parents, codes, strict=True)])
    return [{"problem_id": q.problem_id, "kind": "refine", "agent": name, "author": q.agent, "parent": int(q.node_id),
             "code": c, "public_status": v.status, "public_passed": v.passed, "public_total": v.total,
             "score": public_score(v), "response_len": len(g.response_ids)}
            for q, c, v, g in zip(parents, codes, verdicts, generations, strict=True)]


def gate_table(attempts: pd.DataFrame, *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """The gate from graded attempts (:func:`gate_attempts`' rows with ``reward``): one row per attempt set — ``all``,
    ``self``, ``cross``, then each ``<refiner>-refines-<author>`` pair — with ``problems`` (|P_J|), ``attempts`` (|J|),
    ``refine`` and ``fresh`` (their means with ``*_low``/``*_high`` bootstrap intervals), ``delta`` Δ_J with
    ``low``/``high``, and ``verdict`` ("holds" when refining beats fresh samples). A set without attempts has NaN
    figures and verdict ``no attempts``."""
    if "reward" not in attempts:
        raise ValueError("the gate needs graded attempts: a reward column (hidden-test verdicts)")
    fresh = attempts[attempts["kind"] == "fresh"].groupby(["problem_id", "agent"])["reward"].mean()
    refines = attempts[attempts["kind"] == "refine"].copy()
    refines["fresh"] = [fresh.get((p, a), float("nan")) for p, a in zip(refines["problem_id"], refines["agent"])]
    agents = sorted(attempts["agent"].unique())
    sets = {"all": refines, "self": refines[refines["agent"] == refines["author"]],
            "cross": refines[refines["agent"] != refines["author"]]}
    sets |= {f"{a}-refines-{b}": refines[(refines["agent"] == a) & (refines["author"] == b)]
             for a in agents for b in agents}
    rows = []
    for name, rs in sets.items():
        row: dict[str, Any] = {"set": name, "problems": rs["problem_id"].nunique(), "attempts": len(rs)}
        if rs.empty:
            rows.append(row | {"verdict": "no attempts"})
            continue
        per_problem = rs.groupby("problem_id")[["reward", "fresh"]].mean()
        r, f = per_problem["reward"].to_numpy(), per_problem["fresh"].to_numpy()
        d = paired_bootstrap(r, f, n_boot=n_boot, level=level, seed=seed)
        ri, fi = (bootstrap_mean(x, n_boot=n_boot, level=level, seed=seed) for x in (r, f))
        rows.append(row | {"refine": ri.delta, "refine_low": ri.low, "refine_high": ri.high, "fresh": fi.delta,
                           "fresh_low": fi.low, "fresh_high": fi.high, "delta": d.delta, "low": d.low,
                           "high": d.high, "verdict": d.verdict})
    return pd.DataFrame(rows, columns=["set", "problems", "attempts", "refine", "refine_low", "refine_high", "fresh",
                                       "fresh_low", "fresh_high", "delta", "low", "high", "verdict"])


def gate_passes(table: pd.DataFrame) -> bool:
    """True when refining beats fresh sampling over all attempts (the ``all`` row's interval lies above 0)."""
    return bool((table.loc[table["set"] == "all", "verdict"] == "holds").any())


def gate_metrics(table: pd.DataFrame) -> dict[str, float]:
    """``<set>/{refine,fresh,delta,low,high,attempts}`` for the pooled sets and each pair, and ``passes`` (1 or 0)."""
    metrics = {"passes": float(gate_passes(table))}
    for row in table.itertuples(index=False):
        for key in ("refine", "fresh", "delta", "low", "high", "attempts"):
            value = getattr(row, key)
            if pd.notna(value):
                metrics[f"{row.set}/{key}"] = float(value)
    return metrics


def refine_outcomes(attempts: pd.DataFrame) -> pd.DataFrame:
    """What refines did to their parents, per refiner–author pair: attempts, the share that compile (not ``CE``/
    ``NO_CODE``), that repeat the parent's code verbatim, and that pass every hidden test."""
    fresh = attempts[attempts["kind"] != "refine"]
    parent_code = {(p, n): c for p, n, c in zip(fresh["problem_id"], fresh["node_id"], fresh["code"])}
    refines = attempts[attempts["kind"] == "refine"].copy()
    refines["copied"] = [parent_code.get((p, n)) == c and isinstance(c, str)
                         for p, n, c in zip(refines["problem_id"], refines["parent"], refines["code"])]
    refines["compiles"] = ~refines["public_status"].isin(["CE", "NO_CODE"])
    return (refines.groupby(["agent", "author"])
            .agg(attempts=("reward", "size"), compiles=("compiles", "mean"), copied=("copied", "mean"),
                 passed=("reward", "mean"))
            .reset_index())


def gate_markdown(table: pd.DataFrame, outcomes: pd.DataFrame) -> str:
    """The gate as a person reads it: the verdict in words, each attempt set's rates and Δ with their intervals, and
    what the refines did (compiled, copied the parent, passed)."""
    def pct(v: float) -> str:
        return "–" if pd.isna(v) else f"{100 * v:.1f}"

    passes = gate_passes(table)
    lines = ["# Refine gate", "",
             ("**Passes**: refining a failed program succeeds more often than a fresh sample on the same problems."
              if passes else "**Does not pass**: refining a failed program does not succeed more often than a fresh "
              "sample on the same problems (Δ over all attempts is not above 0 with confidence)."), "",
             "| set | problems | attempts | refine % | fresh % | Δ (points) | interval | verdict |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in table.itertuples(index=False):
        interval = "" if pd.isna(r.low) else f"[{100 * r.low:+.1f}, {100 * r.high:+.1f}]"
        delta = "–" if pd.isna(r.delta) else f"{100 * r.delta:+.1f}"
        lines.append(f"| {r.set} | {r.problems} | {r.attempts} | {pct(r.refine)} | {pct(r.fresh)} | {delta} | "
                     f"{interval} | {r.verdict} |")
    lines += ["", "Refine attempts by refiner and author of the parent:", "",
              "| refiner | author | attempts | compile % | copied parent % | passed % |",
              "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {o.agent} | {o.author} | {o.attempts} | {pct(o.compiles)} | {pct(o.copied)} | {pct(o.passed)} |"
              for o in outcomes.itertuples(index=False)]
    return "\n".join(lines) + "\n"
