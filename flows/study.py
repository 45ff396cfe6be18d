"""The CPU-scale study: base / GRPO / single-agent / homogeneous / heterogeneous arms × seeds, one comparison.

    python flows/study.py                 # default size: warm-started tiny agents, 2 seeds (≤ 60 min on 2 cores)
    python flows/study.py study=smoke     # a few minutes
    python flows/study.py study.seeds=[0,1,2]

With ``study.gate_arm`` set, the refine gate (flows/gate.py) runs first on that arm's team and the study stops
unless it passes (``study.ignore_gate=true`` goes on anyway). Every arm × seed is a ``train-cycle`` flow run (and the
base arm an ``evaluate`` run) nested under one MLflow parent run; all arms see the same problems and the same
number of programs per problem per cycle (checked before anything runs). Results: ``<out_dir>/study.md`` (the table, the claims of ``study.claims`` with their
paired bootstrap intervals, the command), ``runs.csv``, ``per_problem.csv`` (every run's per-problem scores),
``claims.csv`` and ``claims.png`` (forest plot), ``claims_seed_level.csv`` (the claims with seeds as the units),
``arm_intervals.csv`` and ``arm_intervals.png`` (each arm's mean with its bootstrap interval), ``comparison.png``
and ``learning_curves.png``, all logged to the parent run.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pipeline.runtime import configure_process

configure_process(temporary_server=__name__ == "__main__")  # before Prefect/MLflow/transformers load (pipeline/runtime.py)
import hydra
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from prefect import flow
from prefect.runtime import flow_run

from flows.evaluate import compose_eval, evaluate_agents
from flows.gate import refine_gate_flow
from flows.train_cycle import train_cycle
from mars2.config import ConfigError, EvalConfig, RunConfig, StudyConfig
from mars2.eval.arms import (METRICS, arm_intervals, claim_intervals, claims_markdown, comparison_table,
                                is_claim_metric, per_problem_scores, plot_arm_intervals, plot_claims, plot_comparison,
                                plot_learning_curves, run_row, to_markdown)
from mars2.io import atomic_write_text
from pipeline import tracking
from pipeline.cli import run_flow_from_cli
from pipeline.config import CONF_DIR, compose_run, load_cfg, to_yaml

CONFIG_NAME = "study_config"


def compose_study(overrides: list[str]) -> StudyConfig:
    """The validated study config, and a check that every arm's run config composes."""
    try:
        node = OmegaConf.merge(OmegaConf.structured(StudyConfig), load_cfg(overrides, config_name=CONFIG_NAME).study)
        study: StudyConfig = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid study config: {' '.join(str(e).split())}") from None
    if not study.arms or not study.seeds:
        raise ConfigError("a study needs at least one arm (study.arms) and one seed (study.seeds)")
    budgets = {arm: programs_per_problem(compose_run(arm_overrides(study, arm, study.seeds[0])))
               for arm in study.arms}
    if len(set(budgets.values())) > 1:
        raise ConfigError(f"arms differ in sample budget (programs per training problem per cycle): {budgets}; "
                          "set search.max_nodes / search.n_samples so they are equal")
    compose_eval(base_overrides(study, study.seeds[0]))
    for name, control in study.controls.items():
        cfg = compose_eval(control_overrides(study, name, study.seeds[0], {}))
        owners = {m.name for m in cfg.agents.owners}
        if not set(control.weights) <= owners or not set(control.weights.values()) <= set(study.arms):
            raise ConfigError(f"study control {name!r}: weights must map owners among {sorted(owners)} to arms among "
                              f"{sorted(study.arms)}, got {dict(control.weights)}")
    if study.gate_arm is not None and study.gate_arm not in study.arms:
        raise ConfigError(f"study.gate_arm={study.gate_arm!r} is not an arm; arms: {sorted(study.arms)} (or null: no "
                          "gate)")
    for claim in study.claims:
        unknown = {claim.better, claim.worse} - {"base", *study.arms, *study.controls}
        if unknown or not is_claim_metric(claim.metric) or not claim.name:
            raise ConfigError(f"study claim {claim.name or '(unnamed)'!r}: needs a name, arms among "
                              f"{['base', *study.arms, *study.controls]} (unknown: {sorted(unknown)}) and a metric among {METRICS} "
                              "or pass_at_1/<agent>")
    return study


def programs_per_problem(cfg: RunConfig) -> int:
    """Programs generated per training problem per cycle: tree nodes, or i.i.d. samples × agents."""
    if cfg.search.strategy == "independent":
        return cfg.search.n_samples * len(cfg.agents.members)
    return cfg.search.max_nodes


def arm_overrides(study: StudyConfig, arm: str, seed: int) -> list[str]:
    return [*study.common, *study.arms[arm], f"seed={seed}"]


def base_overrides(study: StudyConfig, seed: int) -> list[str]:
    return [*study.common, *study.base, f"seed={seed}"]


def control_overrides(study: StudyConfig, name: str, seed: int,
                      final_model_dirs: dict[str, dict[str, str]]) -> list[str]:
    """A control's evaluation: its agents, each owner of ``control.weights`` with the final weights of that arm's run
    (``final_model_dirs``: arm → {owner: model folder} of this seed's runs)."""
    control = study.controls[name]
    checkpoints = [f"+eval.checkpoints.{owner}='{final_model_dirs[arm][owner]}'"
                   for owner, arm in control.weights.items() if arm in final_model_dirs]
    return [*study.common, *control.overrides, f"seed={seed}", *checkpoints]


@flow(name="study")
def study_flow(overrides: list[str] | None = None) -> dict:
    """Run every arm × seed, then the comparison; returns the per-run rows and the table."""
    study = compose_study(overrides or [])
    cfg = compose_run(study.common)
    parent = tracking.start_run(cfg, {"study": OmegaConf.to_container(OmegaConf.structured(study))}, to_yaml(cfg),
                                flow_run_id=str(flow_run.id), run_name=f"study-{study.name}-{flow_run.name}",
                                kind="study")
    nest = [f"paths.parent_run={parent}"]
    rows, curves, problems = [], [], []
    try:
        if study.gate_arm is not None:
            check_gate(study, nest)
        for seed in study.seeds:
            base = evaluate_agents([*base_overrides(study, seed), *nest, "+paths.tags.arm=base"])
            base_row = agent_row(base, study.agent)
            rows.append({"arm": "base", "seed": seed, "run_id": base["run_id"], **base_row})
            problems.append(final_per_problem(base, study.agent).assign(arm="base", seed=seed))
            trained: dict[str, dict[str, str]] = {}  # arm → {owner: final model folder} of this seed
            for arm in study.arms:
                result = train_cycle([*arm_overrides(study, arm, seed), *nest, f"+paths.tags.arm={arm}"])
                rows.append({"arm": arm, "seed": seed, "run_id": result["run_id"],
                             **agent_row(result, study.agent)})
                problems.append(final_per_problem(result, study.agent).assign(arm=arm, seed=seed))
                trained[arm] = tracking.final_model_dirs(cfg, result["run_id"])
                history = tracking.metric_history(cfg, result["run_id"], f"eval/{study.agent}/pass_at_1")
                if history:  # an arm without the study's agent (e.g. the other agent trained alone) has no curve
                    curves.append({"arm": arm, "seed": seed, "cycle": 0, "value": base_row["pass_at_1"]})
                    curves += [{"arm": arm, "seed": seed, "cycle": step + 1, "value": value} for step, value in history]
            for name in study.controls:
                result = evaluate_agents([*control_overrides(study, name, seed, trained), *nest,
                                          f"+paths.tags.arm={name}"])
                rows.append({"arm": name, "seed": seed, "run_id": result["run_id"],
                             **agent_row(result, study.agent)})
                problems.append(final_per_problem(result, study.agent).assign(arm=name, seed=seed))
        summary = write_results(study, cfg, parent, pd.DataFrame(rows), pd.DataFrame(curves),
                                pd.concat(problems, ignore_index=True), overrides or [])
    except BaseException:
        tracking.end_run(cfg, parent, "FAILED")
        raise
    tracking.end_run(cfg, parent, "FINISHED")
    return summary


class GateNotPassed(RuntimeError):
    """The refine gate did not pass for the study's gate arm, and ``study.ignore_gate`` is false."""


def check_gate(study: StudyConfig, nest: list[str]) -> dict:
    """Run the refine gate on ``study.gate_arm``'s team (first seed, nested under the study's run); raise
    :class:`GateNotPassed` unless it passes or ``study.ignore_gate``."""
    gate = refine_gate_flow([*arm_overrides(study, study.gate_arm, study.seeds[0]), *nest, "+paths.tags.arm=gate"])
    if gate["passes"] or study.ignore_gate:
        return gate
    m = gate["gate"]
    raise GateNotPassed(
        f"the refine gate does not pass for arm {study.gate_arm!r}: refining a failed program succeeds "
        f"{100 * m.get('all/refine', 0):.1f}% of the time against {100 * m.get('all/fresh', 0):.1f}% for a fresh "
        "sample "
        f"(Δ {100 * m.get('all/delta', 0):+.1f} points, interval [{100 * m.get('all/low', 0):+.1f}, "
        f"{100 * m.get('all/high', 0):+.1f}]), so the tree's refine nodes are wasted samples and the study cannot show "
        f"cross-agent refinement; see {gate['gate_dir']}/gate.md. Set study.ignore_gate=true to run it anyway.")


def final_per_problem(result: dict, agent: str) -> pd.DataFrame:
    """A run's per-problem scores from its last evaluation stage's ``results.parquet``; ``pass_at_1`` is ``agent``'s,
    NaN in a run without it (its own agents' Pass@1 are the ``pass_at_1/<agent>`` columns)."""
    folder = [row["dir"] for row in result["stages"] if row["stage"] == "eval"][-1]
    scores = per_problem_scores(pd.read_parquet(Path(folder) / "results.parquet"), agent=agent)
    return scores if f"pass_at_1/{agent}" in scores.columns else scores.assign(pass_at_1=float("nan"))


def agent_row(result: dict, agent: str) -> dict[str, float]:
    """A run's row of the table: ``agent``'s Pass@1 (NaN in a run without it, rather than its team's) and the
    team tree's Pass@1(MCTS)/Pass@N."""
    metrics = prefixed(result["eval"])
    row = run_row(metrics, agent=agent)
    return row if f"eval/{agent}/pass_at_1" in metrics else {**row, "pass_at_1": float("nan")}


def prefixed(eval_metrics: dict[str, float]) -> dict[str, float]:
    return {f"eval/{k}": v for k, v in eval_metrics.items()}


def pass_at_1_kind(evaluation: EvalConfig) -> str:
    """How Pass@1 is measured: "greedy Pass@1", or "Pass@1 over 4 samples at T=0.5"."""
    if evaluation.temperature <= 0:
        return "greedy Pass@1"
    return f"Pass@1 over {evaluation.n_samples} samples at T={evaluation.temperature:g}"


def write_results(study: StudyConfig, cfg: RunConfig, parent: str, runs: pd.DataFrame, curves: pd.DataFrame,
                  per_problem: pd.DataFrame, overrides: list[str]) -> dict:
    out = Path(study.out_dir or Path(cfg.paths.root) / "study" / study.name)
    out.mkdir(parents=True, exist_ok=True)
    table = comparison_table(runs.to_dict(orient="records"))
    command = "python flows/study.py" + "".join(f" {shlex.quote(o)}" for o in overrides)
    held_out = cfg.eval.split == "eval"
    problems = "held-out" if held_out else "training (the ones the cycles train on)"
    text = (f"# Study `{study.name}`\n\nCommand: `{command}`  \nMLflow parent run: `{parent}`  \n"
            f"Seeds: {list(study.seeds)}; Pass@1 = {pass_at_1_kind(cfg.eval)} of `{study.agent}`; Pass@1(MCTS) and "
            f"Pass@N = the arm's team tree ({cfg.eval.max_nodes} nodes); all on the {problems} problems."
            f"\n\n{to_markdown(table)}")
    claims = claim_intervals(per_problem, study.claims, n_boot=study.n_boot) if study.claims else None
    if claims is not None:
        text += (f"\n\n## Claims\n\nΔ = mean over problems and seeds of the better arm minus the other; "
                 f"95% paired bootstrap interval over problems and seeds ({study.n_boot} replicates) and its two-sided "
                 f"bootstrap p. The verdict is Holm's over the pre-registered claims (family-wise error 5%): a claim "
                 f"holds when its adjusted p is below 0.05 and Δ > 0, does not hold when below 0.05 and Δ < 0, else "
                 f"is inconclusive; exploratory claims are reported unadjusted.\n\n{claims_markdown(claims)}")
        atomic_write_text(out / "claims.csv", claims.to_csv(index=False))
        plot_claims(claims, out / "claims.png")
        if len(study.seeds) >= 2:
            by_seed = claim_intervals(per_problem, study.claims, seeds_as_units=True)
            text += (f"\n\n### Secondary: seeds as the units\n\nThe same claims with one Δ per run seed (seed s of one "
                     f"arm against seed s of the other, the seeds both arms ran) and a t interval with S − 1 degrees "
                     f"of freedom: the runs are the units, problems are not resampled within a run. Every claim is "
                     f"conditional on the warm-start weights unless the seed varies them."
                     f"\n\n{claims_markdown(by_seed)}")
            atomic_write_text(out / "claims_seed_level.csv", by_seed.to_csv(index=False))
    atomic_write_text(out / "study.md", text)
    atomic_write_text(out / "runs.csv", runs.to_csv(index=False))
    atomic_write_text(out / "curves.csv", curves.to_csv(index=False))
    atomic_write_text(out / "per_problem.csv", per_problem.to_csv(index=False))
    plot_comparison(table, out / "comparison.png")
    if len(per_problem):
        each_agent = sorted(m for m in per_problem.columns if m.startswith("pass_at_1/"))
        intervals = arm_intervals(per_problem, [*each_agent, "pass_at_1_mcts", "pass_at_n"], n_boot=study.n_boot)
        atomic_write_text(out / "arm_intervals.csv", intervals.to_csv(index=False))
        plot_arm_intervals(intervals, out / "arm_intervals.png")
    if len(curves):
        plot_learning_curves(curves, out / "learning_curves.png",
                             ylabel=f"Pass@1 of {study.agent} ({'held-out' if held_out else 'training'})")
    for f in sorted(out.iterdir()):
        tracking.log_table(cfg, parent, f, "study")
    print(text)
    return {"run_id": parent, "out_dir": str(out), "runs": runs.to_dict(orient="records"),
            "table": table.to_dict(orient="records"),
            "claims": [] if claims is None else claims.to_dict(orient="records")}


@hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")
def main(_: DictConfig) -> None:
    run_flow_from_cli(compose_study, study_flow, "study")


if __name__ == "__main__":
    main()

