"""What a person sees of a flow run: a line per stage as it ends, MLflow logging, a one-screen summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from mars2.config import RunConfig
from mars2.io import write_parquet
from tasks import tracking
from tasks.stage import StageContext, StageRecord


def summary_console() -> Console:
    """stderr; 120 columns where it is not a terminal (a log file, CI), not rich's 80, so the tables keep a row a line."""
    console = Console(stderr=True)
    return console if console.is_terminal else Console(stderr=True, width=120)


@dataclass
class RunReport:
    cfg: RunConfig
    ctx: StageContext
    run: tracking.TrackedRun
    title: str = "mars2 train cycle"
    console: Console = field(default_factory=lambda: summary_console())
    rows: list[dict] = field(default_factory=list)

    def done(self, record: StageRecord, cycle: int, label: str | None = None) -> StageRecord:
        """Record that a stage returned (ran now, or came from cache), log it to MLflow, print one line."""
        ran = record.flow_run_id == self.ctx.flow_run_id
        name = label or record.stage
        self.rows.append({"cycle": cycle, "stage": name, "status": "ran" if ran else "cached",
                          "seconds": record.seconds if ran else 0.0, "key": record.key[:16], "dir": record.dir,
                          "metrics": dict(record.metrics)})
        if ran:
            self.run.needed()
        if ran or not self.run.has_stage(self.cfg, name, cycle):
            self.run.log(lambda run_id: tracking.log_stage(self.cfg, run_id, record, step=cycle, prefix=name))
        mark = "[green]✓ ran   [/]" if ran else "[cyan]↺ cached[/]"
        took = f"{record.seconds:7.1f}s" if ran else "       -"
        when = f"cycle {cycle}" if cycle >= 0 else "before "
        self.console.print(f"{mark} {when} [bold]{name:<22}[/] {took}  {record.key[:12]}")
        return record

    def cycle_done(self, cycle: int) -> None:
        """Log ``cycle_<c>/summary.json``: every stage of the cycle, ran or cached, with its metrics."""
        rows = [r for r in self.rows if r["cycle"] == cycle]
        self.run.log(lambda run_id: tracking.log_json(self.cfg, run_id, rows, f"cycle_{cycle}/summary.json"))

    def finish(self, status: str, eval_metrics: dict[str, float], run_metrics: dict[str, float] | None = None) -> dict:
        """Log the stage table and ``run_metrics`` (e.g. ``engine_starts``), close the MLflow run, print the summary;
        returns it as a dict.

        A finished re-run where every stage came from cache logs nothing: it points at the earlier run instead."""
        table = pd.DataFrame([{k: v for k, v in r.items() if k != "metrics"} for r in self.rows])
        reused = self.run.reused if status == "FINISHED" else None
        if reused is None:
            run_id = self.run.needed()
            tracking.log_metrics(self.cfg, run_id, run_metrics or {})
            path = write_parquet(Path(self.cfg.paths.root) / "runs" / f"{run_id}.parquet", table)
            tracking.log_table(self.cfg, run_id, path, "summary")
            curves = self.eval_curves(run_id)
            if curves is not None:
                tracking.log_table(self.cfg, run_id, curves)
            tracking.end_run(self.cfg, run_id, status)
        self._print(table, status, eval_metrics, run_metrics or {})
        return {"run_id": reused or self.run.id, "status": status, "stages": self.rows, "eval": eval_metrics,
                **(run_metrics or {}),
                "tracking_uri": tracking.tracking_uri(self.cfg), "reused": reused is not None,
                "resumed": self.run.resumed}

    def eval_curves(self, run_id: str) -> Path | None:
        """``eval_curves.png``: held-out Pass@1 per agent and the team's tree metrics, per cycle (None if no eval)."""
        from mars2.eval.report import plot_curves

        points = [{"metric": name, "cycle": r["cycle"], "value": v} for r in self.rows if r["stage"] == "eval"
                  for name, v in r["metrics"].items()
                  if name.count("/") == 1 and name.split("/")[1] in ("pass_at_1", "pass_at_1_mcts", "pass_at_n")]
        if not points:
            return None
        folder = Path(self.cfg.paths.root) / "runs" / run_id
        folder.mkdir(parents=True, exist_ok=True)
        return plot_curves(pd.DataFrame(points), folder / "eval_curves.png")

    def _print(self, table: pd.DataFrame, status: str, eval_metrics: dict[str, float],
               run_metrics: dict[str, float]) -> None:
        out = Table(title=f"{self.title} — {status}", show_lines=False)
        for col in ("stage", "ran", "cached", "seconds"):
            out.add_column(col, justify="left" if col == "stage" else "right")
        if len(table):
            for stage, g in table.groupby("stage", sort=False):
                out.add_row(stage, str((g["status"] == "ran").sum()), str((g["status"] == "cached").sum()),
                            f"{g['seconds'].sum():.1f}")
        self.console.print(out)
        if any(r["stage"] in ("rollout", "eval") for r in self.rows):
            self.console.print(cycle_table(self.rows))
        if eval_metrics:
            before = next((r["metrics"] for r in self.rows if r["stage"] == "eval" and r["cycle"] < 0), None)
            self.console.print(evaluation_table(eval_metrics, before))
        if run_metrics.get("engine_starts"):
            how = "one per weight owner, kept for the run" if self.cfg.backend.persistent else \
                "a model load per stage and weight owner: backend.persistent=false"
            self.console.print(f"generation engines started: {run_metrics['engine_starts']} ({how})")
        uri = tracking.tracking_uri(self.cfg)
        if self.run.reused:
            self.console.print("Every stage came from cache: nothing new to log, no new MLflow run.")
            self.console.print(f"The run of this command is MLflow run [bold]{self.run.reused}[/] in experiment "
                               f"'{self.cfg.paths.experiment}' at {uri}")
        else:
            resumed = " (resumed: the earlier attempt of this command failed)" if self.run.resumed else ""
            self.console.print(f"MLflow run [bold]{self.run.id}[/]{resumed} in experiment "
                               f"'{self.cfg.paths.experiment}' at {uri}")
        # MLflow 3's UI opens in its GenAI view unless the URL asks for the model-training one
        page = f"#/experiments/{tracking.experiment_id(self.cfg)}/runs/{self.run.reused or self.run.id}" \
               "?workflowType=machine_learning"
        if uri.startswith("sqlite"):
            self.console.print(f"  view it: mlflow ui --backend-store-uri {uri}")
            self.console.print(f"  then open http://127.0.0.1:5000/{page}")
        elif uri.startswith("http"):
            self.console.print(f"  view it: {uri.rstrip('/')}/{page}")
        self.console.print(f"  artefacts: {self.cfg.paths.root}/artifacts")


def cycle_table(rows: list[dict]) -> Table:
    """What each cycle did, ran or cached: trees and nodes built, the share of refinements that refine another
    agent's program (the team at work in one tree), the rollouts' pass rate on the hidden tests, the share of flat
    trees (no advantage), mean |Â| of the trained nodes, each weight owner's update loss / KL, and the team's held-out
    Pass@1 where the cycle was evaluated ("before": the starting weights)."""
    owners = sorted({r["stage"].split("/", 1)[1] for r in rows if r["stage"].startswith("update/")})
    out = Table(title="per cycle: cross-agent refinements, rollouts' pass rate, flat trees, mean |Â|, each agent's "
                      "update loss / KL, the team's held-out Pass@1")
    for col in ("cycle", "trees", "nodes", "x-agent", "pass", "flat", "|Â|", *owners, "Pass@1"):
        out.add_column(col, justify="right")

    def pct(value) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    for cycle in sorted({r["cycle"] for r in rows}):
        m = {r["stage"]: r["metrics"] for r in rows if r["cycle"] == cycle}
        if "rollout" not in m and "eval" not in m:
            continue
        rollout, grading, advantage = m.get("rollout", {}), m.get("grading", {}), m.get("advantage", {})
        updates = []
        for o in owners:
            u = m.get(f"update/{o}", {})
            updates.append("buffered" if u.get("skipped") else
                           f"{u['loss']:.2g} / {u['kl']:.1g}" if "loss" in u else "-")
        adv = advantage.get("advantage_abs_mean")
        out.add_row(str(cycle) if cycle >= 0 else "before", str(int(rollout.get("n_problems", 0))),
                    str(int(rollout.get("n_nodes", 0))), pct(rollout.get("cross_agent_refine_share")),
                    pct(grading.get("pass_rate")), pct(advantage.get("flat_tree_share")),
                    "-" if adv is None else f"{adv:.3f}", *updates, pct(m.get("eval", {}).get("team/pass_at_1")))
    return out


def evaluation_table(metrics: dict[str, float], before: dict[str, float] | None = None) -> Table:
    """The paper's layout: one row per agent and the team × Pass@1, Pass@1(MCTS), Pass@N (T+ variants); with
    ``before`` (the evaluation of the starting weights), each cell reads "before → after"."""
    from mars2.eval.report import headline

    table = headline(metrics)
    start = headline(before) if before else None

    def cell(who: str, col: str, v: float) -> str:
        after = "-" if v != v else f"{100 * v:.1f}"
        if start is None or who not in start.index or col not in start.columns or start.at[who, col] != start.at[who, col]:
            return after
        return f"{100 * start.at[who, col]:.1f} → {after}"

    names = {"pass_at_1": "Pass@1", "pass_at_1_mcts": "Pass@1(MCTS)", "pass_at_n": "Pass@N",
             "pass_at_1_mcts_tplus": "Pass@1(MCTS) T+", "pass_at_n_tplus": "Pass@N T+"}
    n = int(metrics.get("n_problems", 0))
    public = " — public tests stand in for hidden ones" if metrics.get("graded_on_public_tests") else ""
    change = ", before → after training" if start is not None else ""
    title = f"held-out evaluation ({n} problems{public}{change})"
    out = Table(title=title, min_width=len(title) + 2)  # the title on one line
    out.add_column("")
    for col in table.columns:
        out.add_column(names.get(col, col), justify="right")
    for who, row in table.iterrows():
        out.add_row(str(who), *(cell(who, col, v) for col, v in row.items()))
    div = [f"{k.split('/')[1]} {v:.2f}" for k, v in sorted(metrics.items())
           if k.startswith("team/") and k.split("/")[1].startswith(("da_at_", "aec", "g_vendi")) and k.count("/") == 1]
    if div:
        out.caption = "team diversity (docs/eval.md): " + ", ".join(div)
    return out
