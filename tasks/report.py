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


@dataclass
class RunReport:
    cfg: RunConfig
    ctx: StageContext
    run_id: str
    title: str = "mars2 train cycle"
    console: Console = field(default_factory=lambda: Console(stderr=True))
    rows: list[dict] = field(default_factory=list)

    def done(self, record: StageRecord, cycle: int, label: str | None = None) -> StageRecord:
        """Record that a stage returned (ran now, or came from cache), log it to MLflow, print one line."""
        ran = record.flow_run_id == self.ctx.flow_run_id
        name = label or record.stage
        self.rows.append({"cycle": cycle, "stage": name, "status": "ran" if ran else "cached",
                          "seconds": record.seconds if ran else 0.0, "key": record.key[:16], "dir": record.dir,
                          "metrics": dict(record.metrics)})
        tracking.log_stage(self.cfg, self.run_id, record, step=cycle, prefix=name)
        mark = "[green]✓ ran   [/]" if ran else "[cyan]↺ cached[/]"
        took = f"{record.seconds:7.1f}s" if ran else "       -"
        self.console.print(f"{mark} cycle {cycle} [bold]{name:<22}[/] {took}  {record.key[:12]}")
        return record

    def cycle_done(self, cycle: int) -> None:
        """Log ``cycle_<c>/summary.json``: every stage of the cycle, ran or cached, with its metrics."""
        rows = [r for r in self.rows if r["cycle"] == cycle]
        tracking.log_json(self.cfg, self.run_id, rows, f"cycle_{cycle}/summary.json")

    def finish(self, status: str, eval_metrics: dict[str, float]) -> dict:
        """Log the stage table, close the MLflow run, print the summary; returns it as a dict."""
        table = pd.DataFrame([{k: v for k, v in r.items() if k != "metrics"} for r in self.rows])
        path = write_parquet(Path(self.cfg.paths.root) / "runs" / f"{self.run_id}.parquet", table)
        tracking.log_table(self.cfg, self.run_id, path, "summary")
        curves = self.eval_curves()
        if curves is not None:
            tracking.log_table(self.cfg, self.run_id, curves)
        tracking.end_run(self.cfg, self.run_id, status)
        self._print(table, status, eval_metrics)
        return {"run_id": self.run_id, "status": status, "stages": self.rows, "eval": eval_metrics,
                "tracking_uri": tracking.tracking_uri(self.cfg)}

    def eval_curves(self) -> Path | None:
        """``eval_curves.png``: held-out Pass@1 per agent and the team's tree metrics, per cycle (None if no eval)."""
        from mars2.eval.report import plot_curves

        points = [{"metric": name, "cycle": r["cycle"], "value": v} for r in self.rows if r["stage"] == "eval"
                  for name, v in r["metrics"].items()
                  if name.count("/") == 1 and name.split("/")[1] in ("pass_at_1", "pass_at_1_mcts", "pass_at_n")]
        if not points:
            return None
        folder = Path(self.cfg.paths.root) / "runs" / self.run_id
        folder.mkdir(parents=True, exist_ok=True)
        return plot_curves(pd.DataFrame(points), folder / "eval_curves.png")

    def _print(self, table: pd.DataFrame, status: str, eval_metrics: dict[str, float]) -> None:
        out = Table(title=f"{self.title} — {status}", show_lines=False)
        for col in ("stage", "ran", "cached", "seconds"):
            out.add_column(col, justify="left" if col == "stage" else "right")
        if len(table):
            for stage, g in table.groupby("stage", sort=False):
                out.add_row(stage, str((g["status"] == "ran").sum()), str((g["status"] == "cached").sum()),
                            f"{g['seconds'].sum():.1f}")
        self.console.print(out)
        if eval_metrics:
            self.console.print(evaluation_table(eval_metrics))
        uri = tracking.tracking_uri(self.cfg)
        self.console.print(f"MLflow run [bold]{self.run_id}[/] in experiment '{self.cfg.paths.experiment}' at {uri}")
        if uri.startswith("sqlite"):
            self.console.print(f"  view it: mlflow ui --backend-store-uri {uri}")
        self.console.print(f"  artefacts: {self.cfg.paths.root}/artifacts")


def evaluation_table(metrics: dict[str, float]) -> Table:
    """The paper's layout: one row per agent and the team × Pass@1, Pass@1(MCTS), Pass@N (T+ variants)."""
    from mars2.eval.report import headline

    table = headline(metrics)
    names = {"pass_at_1": "Pass@1", "pass_at_1_mcts": "Pass@1(MCTS)", "pass_at_n": "Pass@N",
             "pass_at_1_mcts_tplus": "Pass@1(MCTS) T+", "pass_at_n_tplus": "Pass@N T+"}
    n = int(metrics.get("n_problems", 0))
    public = " — public tests stand in for hidden ones" if metrics.get("graded_on_public_tests") else ""
    out = Table(title=f"held-out evaluation ({n} problems{public})")
    out.add_column("")
    for col in table.columns:
        out.add_column(names.get(col, col), justify="right")
    for who, row in table.iterrows():
        out.add_row(str(who), *("-" if v != v else f"{100 * v:.1f}" for v in row))
    div = [f"{k.split('/')[1]} {v:.2f}" for k, v in sorted(metrics.items())
           if k.startswith("team/") and k.split("/")[1].startswith(("da_at_", "aec", "g_vendi")) and k.count("/") == 1]
    if div:
        out.caption = "team diversity (docs/eval.md): " + ", ".join(div)
    return out
