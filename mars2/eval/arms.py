"""Side-by-side comparison of runs in the paper's layout: arms × Pass@1 / Pass@1(MCTS) / Pass@N, over seeds.

An *arm* is a training recipe (``base``: the agents before any RL; ``grpo``: vanilla GRPO; ``single``: single-agent
tree RL; ``homogeneous``: multi-role, one set of weights; ``heterogeneous``: MARS² multi-agent). Each run gives
one row ``{arm, seed, pass_at_1, pass_at_1_mcts, pass_at_n}``; :func:`comparison_table` reduces the rows to
mean, standard deviation (ddof=1; NaN for one seed) and count per arm.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from mars2.eval.report import save_figure

ARMS = ("base", "grpo", "single", "homogeneous", "heterogeneous")
ARM_NAMES = {"base": "Base", "grpo": "GRPO", "single": "Single-agent (RS²)", "homogeneous": "Homogeneous multi-role",
             "heterogeneous": "Heterogeneous (MARS²)"}
METRICS = ("pass_at_1", "pass_at_1_mcts", "pass_at_n")
METRIC_NAMES = {"pass_at_1": "Pass@1", "pass_at_1_mcts": "Pass@1(MCTS)", "pass_at_n": "Pass@N"}


def arm_of(params: dict[str, str], tags: dict[str, str]) -> str:
    """The arm of an MLflow run: its ``mars2.arm`` tag, else derived from its resolved config params."""
    if tags.get("mars2.arm"):
        return tags["mars2.arm"]
    unset = ("", "None", "null", "{}")
    if (tags.get("mars2.kind") == "evaluate" and params.get("eval.from_run", "") in unset
            and params.get("eval.checkpoints", "") in unset and not any(k.startswith("eval.checkpoints.") for k in params)):
        return "base"
    if params.get("search.strategy") == "independent":
        return "grpo"
    return params.get("agents.paradigm", "unknown")


def run_row(metrics: dict[str, float], *, agent: str | None = None) -> dict[str, float]:
    """Pass@1 of ``agent`` (else the team's: the mean over agents) and the team tree's Pass@1(MCTS)/Pass@N, from
    a run's ``eval/...`` metrics (latest values)."""
    def get(name: str) -> float:
        return float(metrics.get(f"eval/{name}", float("nan")))

    p1 = get(f"{agent}/pass_at_1") if agent is not None else float("nan")
    if p1 != p1:
        p1 = get("team/pass_at_1")
    return {"pass_at_1": p1, "pass_at_1_mcts": get("team/pass_at_1_mcts"), "pass_at_n": get("team/pass_at_n")}


def per_problem_scores(results: pd.DataFrame, *, agent: str | None = None) -> pd.DataFrame:
    """One run's per-problem scores from its evaluation's results table (:func:`mars2.eval.report.per_problem_results`):
    ``problem_id``, ``pass_at_1`` (``agent``'s samples, else the mean over agents), ``pass_at_1_mcts`` and
    ``pass_at_n`` (the team tree, without T+), and ``pass_at_1/<agent>`` for every agent that sampled; NaN where the
    run did not measure it."""
    samples = results[results["kind"] == "samples"]
    mine = samples[samples["who"] == agent] if agent is not None and (samples["who"] == agent).any() else samples
    out = mine.groupby("problem_id", sort=True)["pass_at_1"].mean().rename("pass_at_1").to_frame()
    trees = results[(results["kind"] == "tree") & (results["who"] == "team") & ~results["tplus"].astype(bool)]
    out = out.join(trees.set_index("problem_id")[["pass_at_1_mcts", "pass_at_n"]], how="outer") if len(trees) else \
        out.assign(pass_at_1_mcts=np.nan, pass_at_n=np.nan)
    each = samples.pivot_table(index="problem_id", columns="who", values="pass_at_1")
    out = out.join(each.rename(columns=lambda who: f"pass_at_1/{who}"), how="outer")
    return out.reset_index()[["problem_id", *METRICS, *sorted(c for c in out.columns if c.startswith("pass_at_1/"))]]


def is_claim_metric(metric: str) -> bool:
    """A metric a claim can test: one of :data:`METRICS`, or ``pass_at_1/<agent>`` (that agent's Pass@1)."""
    return metric in METRICS or (metric.startswith("pass_at_1/") and len(metric) > len("pass_at_1/"))


def metric_name(metric: str) -> str:
    return f"Pass@1 of {metric.split('/', 1)[1]}" if metric.startswith("pass_at_1/") else METRIC_NAMES[metric]


def claim_intervals(per_problem: pd.DataFrame, claims: Sequence, *, n_boot: int = 10_000, seed: int = 0,
                    level: float = 0.95, seeds_as_units: bool = False, alpha: float | None = None) -> pd.DataFrame:
    """Each claim (``name``, ``metric``, ``better``, ``worse`` arms, ``exploratory``) tested on ``per_problem``
    (columns ``arm``, ``seed``, ``problem_id`` and the metrics): Δ = mean(better) − mean(worse) over the problems both
    arms scored in every seed, its interval, two-sided p-value and verdict.

    Default: the paired bootstrap over problems and seeds (:func:`mars2.eval.stats.paired_bootstrap`).
    ``seeds_as_units``: only the seeds both arms ran, one Δ_s per seed and a t interval with S − 1 degrees of freedom
    (:func:`mars2.eval.stats.seed_level_interval`).

    ``p_holm`` and ``verdict_holm``: Holm's adjustment over the pre-registered claims (``exploratory`` false) at
    ``alpha`` (default 1 − ``level``); a claim holds when its adjusted p is below alpha and Δ > 0, does not hold when
    below alpha and Δ < 0, else is inconclusive. An exploratory claim has no ``p_holm`` (NaN) and keeps its unadjusted
    verdict as ``verdict_holm``; ``family`` says which it is."""
    from mars2.eval.stats import holm, paired_bootstrap, seed_level_interval

    alpha = 1 - level if alpha is None else alpha
    rows = []
    for claim in claims:
        if not is_claim_metric(claim.metric):
            raise ValueError(f"claim {claim.name!r}: metric {claim.metric!r} is not one of {METRICS} or "
                             "pass_at_1/<agent>")
        grids = {}
        for arm in (claim.better, claim.worse):
            of_arm = per_problem[per_problem["arm"] == arm]
            scored = of_arm.dropna(subset=[claim.metric]) if claim.metric in of_arm.columns else of_arm.iloc[:0]
            if scored.empty:
                raise ValueError(f"claim {claim.name!r}: arm {arm!r} has no per-problem {claim.metric}")
            grids[arm] = scored.pivot_table(index="seed", columns="problem_id", values=claim.metric)
        better, worse = grids[claim.better], grids[claim.worse]
        if seeds_as_units:
            seeds = sorted(set(better.index) & set(worse.index))
            if len(seeds) < 2:
                raise ValueError(f"claim {claim.name!r}: arms {claim.better!r} and {claim.worse!r} share "
                                 f"{len(seeds)} seed(s); seeds as units need at least 2")
            better, worse = better.loc[seeds], worse.loc[seeds]
        common = sorted(set(better.dropna(axis=1).columns) & set(worse.dropna(axis=1).columns))
        if not common:
            raise ValueError(f"claim {claim.name!r}: arms {claim.better!r} and {claim.worse!r} share no problem")
        a, b = better[common].to_numpy(), worse[common].to_numpy()
        ci = seed_level_interval(a, b, level=level) if seeds_as_units else \
            paired_bootstrap(a, b, n_boot=n_boot, seed=seed, level=level)
        rows.append({"claim": claim.name, "metric": claim.metric, "better": claim.better, "worse": claim.worse,
                     "delta": ci.delta, "low": ci.low, "high": ci.high, "level": level, "verdict": ci.verdict,
                     "p_value": ci.p_value, "family": "exploratory" if claim.exploratory else "pre-registered",
                     "problems": ci.problems, "seeds_better": ci.seeds_a, "seeds_worse": ci.seeds_b})
    table = pd.DataFrame(rows, columns=[c for c in CLAIM_COLUMNS if c not in ("p_holm", "verdict_holm")])
    family = table["family"] == "pre-registered"
    adjusted, rejected = holm(table["p_value"].where(family).to_numpy(), alpha)
    table["p_holm"] = adjusted
    table["verdict_holm"] = [(("holds" if d > 0 else "does not hold") if r else "inconclusive") if f else v
                             for d, r, f, v in zip(table["delta"], rejected, family, table["verdict"], strict=True)]
    return table[CLAIM_COLUMNS]


CLAIM_COLUMNS = ["claim", "metric", "better", "worse", "delta", "low", "high", "level", "verdict", "p_value", "p_holm",
                 "verdict_holm", "family", "problems", "seeds_better", "seeds_worse"]


def arm_intervals(per_problem: pd.DataFrame, metrics: Sequence[str] = METRICS, *, n_boot: int = 10_000,
                  seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per arm and metric of ``per_problem`` (columns ``arm``, ``seed``, ``problem_id`` and the metrics): the mean
    over the problems the arm scored in every seed, and its bootstrap interval over problems and seeds
    (:func:`mars2.eval.stats.bootstrap_mean`). Rows in :data:`ARMS` order, controls after."""
    from mars2.eval.stats import bootstrap_mean

    rank = {a: i for i, a in enumerate(ARMS)}
    rows = []
    for arm in sorted(per_problem["arm"].unique(), key=lambda a: (rank.get(a, len(rank)), a)):
        of_arm = per_problem[per_problem["arm"] == arm]
        for m in metrics:
            grid = of_arm.pivot_table(index="seed", columns="problem_id", values=m).dropna(axis=1) \
                if m in of_arm.columns else of_arm.iloc[:0]
            if grid.size == 0:  # not measured in this arm
                continue
            ci = bootstrap_mean(grid.to_numpy(), n_boot=n_boot, seed=seed, level=level)
            rows.append({"arm": arm, "metric": m, "mean": ci.delta, "low": ci.low, "high": ci.high, "level": level,
                         "problems": ci.problems, "seeds": ci.seeds_a})
    return pd.DataFrame(rows, columns=["arm", "metric", "mean", "low", "high", "level", "problems", "seeds"])


def plot_arm_intervals(intervals: pd.DataFrame, path: str | Path,
                       title: str = "held-out results per arm (mean, 95% bootstrap interval over problems and seeds)"
                       ) -> Path:
    """Grouped bars from :func:`arm_intervals`: one group per metric, one bar per arm, error bars = the interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(dict.fromkeys(intervals["metric"]))
    arms = list(dict.fromkeys(intervals["arm"]))
    fig, ax = plt.subplots(figsize=(min(16, max(8, 2 + 0.3 * len(metrics) * len(arms))), 4.5))
    width = 0.8 / max(1, len(arms))
    x = np.arange(len(metrics))
    for i, arm in enumerate(arms):
        of_arm = intervals[intervals["arm"] == arm].set_index("metric").reindex(metrics)
        err = np.vstack([of_arm["mean"] - of_arm["low"], of_arm["high"] - of_arm["mean"]]).clip(min=0)
        ax.bar(x + (i - (len(arms) - 1) / 2) * width, of_arm["mean"], width, yerr=np.nan_to_num(err), capsize=3,
               label=ARM_NAMES.get(arm, arm))
    ax.set_xticks(x, [metric_name(m) for m in metrics], fontsize=8)
    ax.set_ylim(0, min(1.0, 1.25 * float(np.nanmax(intervals["high"]))) if len(intervals) else 1.0)
    ax.set_ylabel("share of held-out problems")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_claims(claims: pd.DataFrame, path: str | Path,
                title: str = "claims: Δ = better − worse, 95% paired bootstrap interval") -> Path:
    """Forest plot of :func:`claim_intervals`: one row per claim, Δ in points with its interval, the zero line,
    colour by verdict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"holds": "tab:green", "does not hold": "tab:red", "inconclusive": "tab:gray"}
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(claims) + 1.4))
    y = np.arange(len(claims))[::-1]
    for yi, r in zip(y, claims.itertuples()):
        ax.errorbar(100 * r.delta, yi, xerr=[[100 * (r.delta - r.low)], [100 * (r.high - r.delta)]], fmt="o",
                    capsize=4, color=colours.get(r.verdict, "black"))
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y, [f"{r.claim}\n{metric_name(r.metric)}: {r.better} − {r.worse} ({r.verdict})"
                      for r in claims.itertuples()], fontsize=7)
    ax.set_xlabel("Δ (points)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def claims_markdown(claims: pd.DataFrame) -> str:
    """The claims as Markdown: Δ and its interval in points (percent), p and Holm's adjusted p, the verdict after
    Holm's adjustment (exploratory claims: unadjusted, and marked so), the counts behind it."""
    lines = ["| claim | metric | Δ (points) | interval | p | p (Holm) | verdict | problems × seeds |",
             "|---|---|---|---|---:|---:|---|---|"]
    for r in claims.itertuples():
        holm = "unadjusted (exploratory)" if r.family == "exploratory" else f"{r.p_holm:.3f}"
        lines.append(f"| {r.claim} | {metric_name(r.metric)}: {r.better} − {r.worse} | {100 * r.delta:+.1f} | "
                     f"[{100 * r.low:+.1f}, {100 * r.high:+.1f}] ({100 * r.level:.0f}%) | {r.p_value:.3f} | {holm} | "
                     f"**{r.verdict_holm}** | {r.problems} × {r.seeds_better}/{r.seeds_worse} |")
    return "\n".join(lines)


def comparison_table(rows: Sequence[dict], metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Per arm (in :data:`ARMS` order, others after): ``<metric>_mean``, ``<metric>_std``, ``n_seeds``."""
    frame = pd.DataFrame(list(rows))
    if frame.empty:
        raise ValueError("comparison: no runs to compare")
    missing = {"arm", *metrics} - set(frame.columns)
    if missing:
        raise ValueError(f"comparison: rows lack {sorted(missing)}")
    out = []
    for arm, group in frame.groupby("arm", sort=False):
        row: dict = {"arm": arm, "n_seeds": len(group)}
        for m in metrics:
            values = group[m].astype(float)
            row[f"{m}_mean"] = float(values.mean())
            row[f"{m}_std"] = float(values.std(ddof=1)) if values.notna().sum() > 1 else float("nan")
        out.append(row)
    table = pd.DataFrame(out)
    rank = {a: i for i, a in enumerate(ARMS)}
    return table.sort_values("arm", key=lambda s: s.map(lambda a: rank.get(a, len(rank)))).reset_index(drop=True)


def to_markdown(table: pd.DataFrame, metrics: Sequence[str] = METRICS) -> str:
    """The table as Markdown, values in percent, ``mean ± std (n)``."""
    head = "| arm | " + " | ".join(METRIC_NAMES.get(m, m) for m in metrics) + " | seeds |"
    lines = [head, "|" + "---|" * (len(metrics) + 2)]
    for _, r in table.iterrows():
        cells = []
        for m in metrics:
            mean, std = r[f"{m}_mean"], r[f"{m}_std"]
            cells.append("-" if mean != mean else f"{100 * mean:.1f}" + ("" if std != std else f" ± {100 * std:.1f}"))
        lines.append(f"| {ARM_NAMES.get(r['arm'], r['arm'])} | " + " | ".join(cells) + f" | {int(r['n_seeds'])} |")
    return "\n".join(lines) + "\n"


def plot_comparison(table: pd.DataFrame, path: str | Path, metrics: Sequence[str] = METRICS,
                    title: str = "final held-out results per arm (mean ± std over seeds)") -> Path:
    """Grouped bars: one group per metric, one bar per arm, error bars = std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(table))
    x = np.arange(len(metrics))
    for i, (_, r) in enumerate(table.iterrows()):
        means = [r[f"{m}_mean"] for m in metrics]
        stds = [0.0 if r[f"{m}_std"] != r[f"{m}_std"] else r[f"{m}_std"] for m in metrics]
        ax.bar(x + (i - (len(table) - 1) / 2) * width, means, width, yerr=stds, capsize=3,
               label=ARM_NAMES.get(r["arm"], r["arm"]))
    ax.set_xticks(x, [METRIC_NAMES.get(m, m) for m in metrics])
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of held-out problems")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_learning_curves(history: pd.DataFrame, path: str | Path, *, ylabel: str = "Pass@1 (held-out)",
                         title: str = "learning curves (mean over seeds, band = min..max)") -> Path:
    """One line per arm over ``cycle`` (mean of ``value`` over ``seed``) with a min–max band across seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    rank = {a: i for i, a in enumerate(ARMS)}
    for arm in sorted(history["arm"].unique(), key=lambda a: rank.get(a, len(rank))):
        g = history[history["arm"] == arm].groupby("cycle")["value"].agg(["mean", "min", "max"]).sort_index()
        ax.plot(g.index, g["mean"], marker="o", label=ARM_NAMES.get(arm, arm))
        ax.fill_between(g.index, g["min"], g["max"], alpha=0.2)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("cycle (0 = before RL)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
