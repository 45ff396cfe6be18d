"""What a person sees of a flow run: a line per stage as it ends, MLflow logging, a one-screen summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from mars2.config import RunConfig
from mars2.io import write_parquet
from pipeline import tracking
from pipeline.stages import DECLARATIONS
from stagekit.stage import StageContext, StageRecord, came_from_cache


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
    label: str = ""  # the overrides that make the run differ from its preset
    console: Console = field(default_factory=lambda: summary_console())
    rows: list[dict] = field(default_factory=list)

    def done(self, record: StageRecord, cycle: int, owner: str | None = None) -> StageRecord:
        """Record that a stage returned (ran now, or came from cache), log it to MLflow, print one line; all under its
        declared label (``<label>/<owner>`` for one weight owner's stage)."""
        declaration = DECLARATIONS[record.stage]
        ran = not came_from_cache(record, self.ctx)
        name = f"{declaration.label}/{owner}" if owner else declaration.label
        self.rows.append({"cycle": cycle, "stage": name, "status": "ran" if ran else "cached",
                          "seconds": record.seconds if ran else 0.0, "key": record.key[:16], "dir": record.dir,
                          "metrics": dict(record.metrics)})
        if ran:
            self.run.needed()
        if ran or not self.run.has_stage(self.cfg, name, cycle):
            self.run.log(lambda run_id: tracking.log_stage(self.cfg, run_id, record, step=cycle, prefix=name,
                                                           facts=declaration.facts))
        mark = "[green]✓ ran   [/]" if ran else "[cyan]↺ cached[/]"
        took = f"{record.seconds:7.1f}s" if ran else "       -"
        when = f"cycle {cycle}" if cycle >= 0 else "before "
        resumed = f"  {record.meta['resumed']}" if ran and record.meta.get("resumed") else ""
        self.console.print(f"{mark} {when} [bold]{name:<22}[/] {took}  {record.key[:12]}{resumed}")
        return record

    def cycle_done(self, cycle: int) -> None:
        """Log ``cycle_<c>/summary.json``: every stage of the cycle, ran or cached, with its metrics."""
        rows = [r for r in self.rows if r["cycle"] == cycle]
        self.run.log(lambda run_id: tracking.log_json(self.cfg, run_id, rows, f"cycle_{cycle}/summary.json"))

    def finish(self, status: str, eval_metrics: dict[str, float], run_metrics: dict[str, float] | None = None,
               failed: Sequence[str] = (), notes: str = "") -> dict:
        """Log the stage table (with the ``failed`` stages, by task run name), ``run_metrics`` (e.g.
        ``engine_starts``) and the summary (``summary.md``; ``notes``, markdown, follow its tables), close the MLflow
        run, print the summary and publish it to the Prefect flow run (:func:`publish_to_prefect`); returns it as a
        dict.

        A finished re-run where every stage came from cache logs nothing: it points at the earlier run instead."""
        self.rows += [{"cycle": cycle_of(name), "stage": name, "status": "failed", "seconds": 0.0, "key": "",
                       "dir": "", "metrics": {}} for name in failed]
        table = pd.DataFrame([{k: v for k, v in r.items() if k != "metrics"} for r in self.rows])
        run_metrics = run_metrics or {}
        tables = self.summary_tables(table, eval_metrics)
        if note := unchanged_note(self.rows, eval_metrics, self.before()):
            notes = "\n\n".join(x for x in (note[0].upper() + note[1:] + ".", notes) if x)
        if verdict := method_verdict(self.rows, eval_metrics, self.before()):
            notes = "\n\n".join(x for x in (notes, verdict) if x)
        reused = self.run.reused if status == "FINISHED" else None
        run_id = reused or self.run.needed()
        if reused and self.run.tags:  # a sweep point whose every stage came from cache: its run is the reused one
            tracking.set_tags(self.cfg, reused, self.run.tags)
        summary = self.markdown(status, tables, run_metrics, notes)  # after needed(): a deferred run gets its id there
        if reused is None:
            tracking.log_metrics(self.cfg, run_id, run_metrics)
            path = write_parquet(Path(self.cfg.paths.root) / "runs" / f"{run_id}.parquet", table)
            tracking.log_table(self.cfg, run_id, path, "summary")
            curves = self.eval_curves(run_id)
            if curves is not None:
                tracking.log_table(self.cfg, run_id, curves)
            tracking.log_text(self.cfg, run_id, summary, "summary.md")
            if url := prefect_run_url():
                tracking.set_tags(self.cfg, run_id, {"prefect.flow_run_url": url})
            tracking.end_run(self.cfg, run_id, status)
        self._print(status, tables, run_metrics, notes)
        publish_to_prefect(summary, run_id, tracking.run_link(self.cfg, run_id),
                           f"{self.cfg.agents.preset}, {self.overrides_text()}")
        return {"run_id": run_id, "status": status, "stages": self.rows, "eval": eval_metrics,
                **run_metrics,
                "tracking_uri": tracking.tracking_uri(self.cfg), "reused": reused is not None,
                "resumed": self.run.resumed}

    def before(self) -> dict[str, float] | None:
        """The metrics of the evaluation of the starting weights (cycle -1), if the run made one."""
        return next((r["metrics"] for r in self.rows if r["stage"] == "eval" and r["cycle"] < 0), None)

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

    def summary_tables(self, table: pd.DataFrame, eval_metrics: dict[str, float]) -> list[SummaryTable]:
        """The stages (ran / cached / seconds), what each cycle did, and the held-out evaluation (before → after)."""
        tables = [stage_table(table, f"{self.title} — stages")]
        if any(r["stage"] in ("rollout", "eval") for r in self.rows):
            tables.append(cycle_table(self.rows))
        if eval_metrics:
            tables.append(evaluation_table(eval_metrics, self.before()))
        return tables

    def engines_line(self, run_metrics: dict[str, float]) -> str | None:
        if not run_metrics.get("engine_starts"):
            return None
        how = "one per weight owner, kept for the run" if self.cfg.backend.persistent else \
            "a model load per stage and weight owner: backend.persistent=false"
        return f"generation engines started: {run_metrics['engine_starts']:g} ({how})"

    def markdown(self, status: str, tables: list[SummaryTable], run_metrics: dict[str, float], notes: str = "") -> str:
        """The console summary as markdown: the Prefect run's summary artifact and the MLflow run's ``summary.md``."""
        run_id = self.run.reused or self.run.id
        lines = [f"# {self.title}: {status}", "", f"{self.cfg.agents.preset}, {self.overrides_text()}", "",
                 f"MLflow run [{run_id}]({tracking.run_link(self.cfg, run_id)}) in experiment "
                 f"`{self.cfg.paths.experiment}` at `{tracking.tracking_uri(self.cfg)}`"
                 + (" (every stage came from cache: the run of this command)" if self.run.reused else
                    " (resumed: the earlier attempt of this command failed)" if self.run.resumed else ""), ""]
        for t in tables:
            lines += [t.markdown(), ""]
        if notes:
            lines += [notes.strip(), ""]
        if engines := self.engines_line(run_metrics):
            lines += [engines, ""]
        lines += ["**Terms** (metric names in MLflow; docs/eval.md, docs/training.md)", ""]
        lines += [f"- `{term}`: {meaning}" for term, meaning in GLOSSARY.items()]
        return "\n".join(lines)

    def overrides_text(self) -> str:
        return f"overrides: {self.label}" if self.label else "no overrides"

    def _print(self, status: str, tables: list[SummaryTable], run_metrics: dict[str, float], notes: str = "") -> None:
        from rich.markdown import Markdown

        self.console.print(f"[bold]{self.title}[/]: {status}, {self.cfg.agents.preset}, {self.overrides_text()}",
                           highlight=False)
        for t in tables:
            self.console.print(t)
        if notes:
            self.console.print(Markdown(notes))
        if engines := self.engines_line(run_metrics):
            self.console.print(engines)
        uri = tracking.tracking_uri(self.cfg)
        if self.run.reused:
            self.console.print("Every stage came from cache: nothing new to log, no new MLflow run.")
            self.console.print(f"The run of this command is MLflow run [bold]{self.run.reused}[/] in experiment "
                               f"'{self.cfg.paths.experiment}' at {uri}")
        else:
            resumed = " (resumed: the earlier attempt of this command failed)" if self.run.resumed else ""
            self.console.print(f"MLflow run [bold]{self.run.id}[/]{resumed} in experiment "
                               f"'{self.cfg.paths.experiment}' at {uri}")
        link = tracking.run_link(self.cfg, self.run.reused or self.run.id)
        if uri.startswith("sqlite"):
            self.console.print(f"  view it: mlflow ui --backend-store-uri {uri}")
            self.console.print(f"  then open {link}")
        else:
            self.console.print(f"  view it: {link}")
        if url := prefect_run_url():
            self.console.print(f"Prefect flow run: {url}")
        self.console.print(f"  artefacts: {self.cfg.paths.root}/artifacts")


GLOSSARY = {
    "x-agent, cross_agent_refine_share": "share of refinements in which an agent refines another agent's program",
    "pass, grading/pass_rate": "share of the rollout's programs that pass the hidden tests (reward 1)",
    "refine, grading/refine_pass_rate": "the same among the rollout's refinements alone (cross_refine_pass_rate: "
                                        "refinements of another agent's program; generate_pass_rate: fresh programs)",
    "flat, flat_tree_share": "share of trees whose rewards are all equal: no advantage, nothing trained",
    "|Â|, advantage_abs_mean": "mean absolute advantage of the trained nodes",
    "loss / KL": "each weight owner's update loss and its KL to the reference policy",
    "tis_vetoed": "share of sequences given weight 0 by truncated importance sampling (a token's ratio to the rollout "
                  "policy below train.tis_veto)",
    "clip_frac": "share of tokens whose GSPO/PPO ratio was clipped",
    "pass_at_1, pass_at_1_mcts, pass_at_n": "held-out Pass@1 of i.i.d. samples, of the tree's final node (best "
                                            "public score, latest on ties), and of any node of the tree",
    "da_at_K, aec, g_vendi": "diversity of the team tree's correct programs: distinct algorithms among K, effective "
                             "number of algorithm classes, Vendi score of their AST embeddings",
}


def prefect_run_url() -> str | None:
    """This flow run's page in the Prefect UI, where one outlives the run (None under the temporary server)."""
    from prefect.runtime import flow_run

    from pipeline.runtime import prefect_server_outlives_run

    return flow_run.ui_url if prefect_server_outlives_run() else None


def publish_to_prefect(markdown: str, mlflow_run_id: str, mlflow_link: str, what: str) -> None:
    """Show the run's results on its Prefect flow run page: the summary as a markdown artifact (described as the
    summary of ``what``: the preset and its overrides), a link artifact to the
    MLflow run, and the tag ``mlflow:<run id>`` on the flow run (its list of runs can be filtered by it)."""
    from prefect.artifacts import create_link_artifact, create_markdown_artifact
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    create_markdown_artifact(markdown, description=f"mars2 summary of {what}: stages, cycles, held-out evaluation")
    create_link_artifact(mlflow_link, link_text=f"MLflow run {mlflow_run_id}", description="the run's MLflow page")
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, tags=sorted({*flow_run.tags, f"mlflow:{mlflow_run_id}"}))


@dataclass(frozen=True)
class SummaryTable:
    """A table of the run's summary: cells already formatted; printed by rich and as markdown."""

    title: str
    frame: pd.DataFrame
    caption: str = ""

    def __rich_console__(self, console, options):
        # the title on one line where the console is wide enough, not a table stretched past it
        out = Table(title=self.title, min_width=min(len(self.title) + 2, options.max_width),
                    caption=self.caption or None)
        for i, col in enumerate(self.frame.columns):
            out.add_column(str(col), justify="left" if i == 0 else "right")
        for row in self.frame.itertuples(index=False):
            out.add_row(*map(str, row))
        yield out

    def markdown(self) -> str:
        def escaped(text) -> str:  # a "|" in a cell or header (|Â|) would end the cell
            return str(text).replace("|", "\\|")

        frame = self.frame.rename(columns=escaped).map(escaped)
        body = frame.to_markdown(index=False, colalign=["left"] + ["right"] * (frame.shape[1] - 1))
        return "\n\n".join(x for x in (f"**{self.title}**", body, self.caption and f"_{self.caption}_") if x)


def stage_table(table: pd.DataFrame, title: str) -> SummaryTable:
    """Per stage (cycles together): how many times it ran or came from cache, and its seconds; a stage that failed
    (by its Prefect task run name, e.g. ``advantage-c0``) with ``FAILED``."""
    rows = [{"stage": stage, "ran": str((g["status"] == "ran").sum()), "cached": str((g["status"] == "cached").sum()),
             "seconds": f"{g['seconds'].sum():.1f}"} for stage, g in table.groupby("stage", sort=False)
            if (g["status"] != "failed").all()] if len(table) else []
    failed = table[table["status"] == "failed"] if len(table) else table
    rows += [{"stage": r.stage, "ran": "FAILED", "cached": "", "seconds": ""} for r in failed.itertuples()]
    return SummaryTable(title, pd.DataFrame(rows, columns=["stage", "ran", "cached", "seconds"]))


def cycle_of(task_run_name: str) -> int | None:
    """``rollout-c3`` → 3, ``evaluation-c-1`` → -1 (the stages' task run names end in their cycle)."""
    import re

    found = re.search(r"-c(-?\d+)$", task_run_name)
    return int(found.group(1)) if found else None


def cycle_table(rows: list[dict]) -> SummaryTable:
    """What each cycle did, ran or cached: one column per metric the stages declare (``columns`` of their
    declarations, in the order the cycle runs them; a weight owner's stage once per owner) — trees and nodes built,
    the share of refinements that refine another agent's program (the team at work in one tree), the rollouts' pass
    rate on the hidden tests and that of their refinements alone (does refining work?), the share of flat trees (no
    advantage), mean |Â| of the trained nodes, each weight owner's update loss / KL, and the team's held-out Pass@1
    where the cycle was evaluated ("before": the starting weights). A cycle none of those stages reported is left
    out."""
    shown = [d for d in DECLARATIONS.values() if d.columns]
    owners = {d.label: sorted({r["stage"].split("/", 1)[1] for r in rows if r["stage"].startswith(f"{d.label}/")})
              for d in shown if d.per_owner}

    def cells(d, metrics: dict, owner: str = "") -> dict[str, str]:
        return {c.header.format(owner=owner): c.show(metrics if c.metric is None else metrics.get(c.metric))
                for c in d.columns}

    def labels(d) -> list[tuple[str, str]]:  # (owner, the label its rows carry)
        return [(o, f"{d.label}/{o}") for o in owners[d.label]] if d.per_owner else [("", d.label)]

    out = []
    for cycle in sorted({r["cycle"] for r in rows}):
        m = {r["stage"]: r["metrics"] for r in rows if r["cycle"] == cycle}
        if not any(label in m for d in shown for _, label in labels(d)):
            continue
        row = {"cycle": str(cycle) if cycle >= 0 else "before"}
        for d in shown:
            for owner, label in labels(d):
                row |= cells(d, m.get(label, {}), owner)
        out.append(row)
    columns = ["cycle"]
    legend = []
    for d in shown:
        for c in d.columns:
            if d.per_owner:
                columns += [c.header.format(owner=o) for o in owners[d.label]]
                legend.append(f"{', '.join(owners[d.label]) or 'each agent'}: {c.legend}")
            else:
                columns.append(c.header)
                legend += [f"{c.header}: {c.legend}"] if c.legend else []
    return SummaryTable("per cycle", pd.DataFrame(out, columns=columns), " · ".join(legend))


def unchanged_note(rows: list[dict], after: dict[str, float], before: dict[str, float] | None) -> str:
    """When the team's held-out Pass@1 ends where it started (within half a point), what the cycles did change: the
    rollouts' pass rate, their refinements' and the share of cross-agent refinements, first cycle → last; "" when it
    moved, or without a "before" or a rollout."""
    start, end = (before or {}).get("team/pass_at_1"), after.get("team/pass_at_1")
    grading = [r["metrics"] for r in rows if r["stage"] == "grading"]
    rollout = [r["metrics"] for r in rows if r["stage"] == "rollout"]
    if start is None or end is None or abs(end - start) >= 0.005 or not grading:
        return ""

    def moved(what: str, first: dict, last: dict, key: str) -> str | None:
        if key not in first or key not in last:
            return None
        return f"{what} {100 * first[key]:.1f}% → {100 * last[key]:.1f}%"

    parts = [moved("rollouts passing", grading[0], grading[-1], "pass_rate"),
             moved("refinements passing", grading[0], grading[-1], "refine_pass_rate")]
    if rollout:
        parts.append(moved("cross-agent refinements", rollout[0], rollout[-1], "cross_agent_refine_share"))
    return (f"held-out Pass@1 did not move in {len(grading)} cycle{'s' * (len(grading) != 1)}; what did: "
            + ", ".join(x for x in parts if x))


def method_verdict(rows: list[dict], after: dict[str, float], before: dict[str, float] | None) -> str:
    """The run's closing line: whether it shows the method's mechanism, in words, from four signs — the team tree beats
    one sample at the end (Pass@1(MCTS) > team Pass@1), refinements pass the hidden tests (≥ 10% in some cycle),
    cross-agent refinements pass (> 0 in some cycle, when there are any) and the held-out Pass@1(MCTS) does not fall
    from "before" to the end. "" without a rollout or a final evaluation of the tree."""
    grading = [r["metrics"] for r in rows if r["stage"] == "grading"]
    mcts, sample = after.get("team/pass_at_1_mcts"), after.get("team/pass_at_1")
    if not grading or mcts is None or sample is None:
        return ""
    refine = max((g["refine_pass_rate"] for g in grading if "refine_pass_rate" in g), default=None)
    cross = max((g["cross_refine_pass_rate"] for g in grading if "cross_refine_pass_rate" in g), default=None)
    start = (before or {}).get("team/pass_at_1_mcts")
    signs = [(mcts > sample, f"the team tree {'beats' if mcts > sample else 'does not beat'} one sample "
                             f"(Pass@1(MCTS) {100 * mcts:.1f}% vs Pass@1 {100 * sample:.1f}%)")]
    if refine is not None:
        signs.append((refine >= 0.10, f"refinements pass at most {100 * refine:.1f}% in a cycle"))
    if cross is not None:
        signs.append((cross > 0, f"cross-agent refinements pass at most {100 * cross:.1f}%"))
    if start is not None:
        signs.append((mcts >= start, f"held-out Pass@1(MCTS) {100 * start:.1f}% → {100 * mcts:.1f}%"))
    shown = all(ok for ok, _ in signs) and refine is not None
    facts = "; ".join(text for _, text in signs)
    if shown:
        return f"**This run shows the method at work**: {facts}."
    return (f"**This run does not show the method's mechanism**: {facts} (it needs all four: RESULTS.md, "
            "\"The refine gate\").")


DIVERSITY = {"da_at_": "distinct algorithms among {k} correct programs (DA@{k})",
             "aec": "effective number of algorithm classes (AEC)",
             "g_vendi": "Vendi score of their AST embeddings (G-Vendi)"}


def diversity_caption(metrics: dict[str, float]) -> str:
    """The team tree's diversity of correct programs in words: ``distinct algorithms among 4 correct programs
    (DA@4) 1.50, ...`` (definitions: docs/eval.md)."""
    parts = []
    for key, v in sorted(metrics.items()):
        name = key.removeprefix("team/")
        if key.startswith("team/") and key.count("/") == 1 and v == v:
            for prefix, words in DIVERSITY.items():
                if name.startswith(prefix):
                    parts.append(f"{words.format(k=name.removeprefix(prefix))} {v:.2f}")
    return "diversity of the team tree's correct programs (docs/eval.md): " + ", ".join(parts) if parts else ""


def evaluation_table(metrics: dict[str, float], before: dict[str, float] | None = None) -> SummaryTable:
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
    frame = pd.DataFrame([{"": str(who), **{names.get(col, col): cell(who, col, v) for col, v in row.items()}}
                          for who, row in table.iterrows()])
    return SummaryTable(f"held-out evaluation ({n} problems{public}{change})", frame, diversity_caption(metrics))
