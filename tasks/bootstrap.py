"""Bootstrap stage: supervised warm-start of the tiny agents on the training split's reference solutions.

Its record has the shape of an ``agents`` record (``weights``: :class:`AgentWeights` per weight owner), so
the flow uses it in place of ``agents`` downstream: the warm weights are what cycle 0 rolls out with and what
the KL term's reference model is. Owners without ``bootstrap.steps`` point at their ``agents`` folders unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from mars2.config import AgentConfig, GradingConfig
from mars2.io import atomic_write_json
from stagekit.stage import (StageContext, StageDeclaration, StageRecord, current_parameters, declared, run_declared,
                            run_stage, stage_task)

DECLARATION = StageDeclaration(
    name="bootstrap", label="bootstrap",
    # the modules the warm-start uses, file by file: an edit elsewhere in mars2.train/search does not redo it
    modules=("mars2.train.warm_start", "mars2.train.checkpoints", "mars2.search.prompts", "mars2.search.run",
             "mars2.backends", "mars2.sandbox", "mars2.data.checks", "mars2.data.schema", "mars2.data.tables",
             "mars2.io", "tasks.bootstrap", "stagekit.runners"),
    # the warm-start reads all of an agent's fields but how the RL update trains it and where it generates: an lr
    # sweep of the RL update reuses it
    reads={"members": tuple(f.name for f in dataclasses.fields(AgentConfig)
                            if f.name not in ("optimizer", "deepspeed", "update_procs", "gpus", "backend")),
           # the sandbox settings that decide whether a faulty variant fails a public test (refine examples)
           "grading": ("time_limit_s", "memory_mb", "isolation", "parity")})


def needs_bootstrap(members: list[AgentConfig]) -> bool:
    return any(m.bootstrap.steps > 0 for m in members if m.shares_weights_with is None)


@stage_task(DECLARATION)
def bootstrap_agents(ctx: StageContext, members: list[AgentConfig], agents: StageRecord, dataset: StageRecord,
                     grading: GradingConfig) -> StageRecord:
    """Warm weights per weight owner with ``bootstrap.steps > 0`` (``weights[owner].model_dir`` points at its complete
    warm model folder; the others and every tokenizer point at the ``agents`` folders); metrics
    ``<owner>/loss_first|loss_last|...``.

    Each owner's warm-start is its own content-addressed folder (``artifacts/bootstrap-agent/<key>/``), keyed by
    the owner's config (incl. its role prompt), the hashes of its initial model and tokenizer files and the dataset's
    files — not by the other agents of the preset, so arms that share an agent (single, homogeneous,
    heterogeneous) and seeds that only change the RL share its warm-start.
    """

    members, grading = declared(members, DECLARATION.reads["members"]), declared(grading, DECLARATION.reads["grading"])

    def produce(out: Path) -> dict:
        from mars2.search.run import public_grader
        from mars2.train.warm_start import warm_start_owner

        weights = {o: agents.weights_of(o) for o in agents.weights}
        metrics: dict[str, float] = {}
        for m in members:
            if m.shares_weights_with is not None or m.bootstrap.steps == 0:
                continue
            roles = [m.role_prompt]  # the owner's own role: every preset sharing this agent shares its warm-start
            init = {f: h for f, h in agents.files.items() if f.startswith(f"{m.name}/")}
            inputs = {"member": m, "roles": roles, "init": init, "dataset": dataset}
            if m.bootstrap.refine_per_problem or m.bootstrap.wrong_readings:
                inputs["grading"] = grading
            record = run_stage(f"{DECLARATION.name}-agent", DECLARATION.modules, ctx, inputs,
                               lambda folder, m=m, roles=roles: warm_start_owner(
                                   folder, m.name, m.bootstrap, roles, weights[m.name].model_dir,
                                   weights[m.name].tokenizer_dir, *warm_start_inputs(m, dataset),
                                   public_grader(ctx.grading(grading))),
                               {"member": DECLARATION.reads["members"], "grading": DECLARATION.reads["grading"]})
            weights[m.name] = dataclasses.replace(weights[m.name], model_dir=str(Path(record.dir) / "model"))
            metrics.update({f"{m.name}/{k}": v for k, v in record.metrics.items()})
        atomic_write_json(out / "model_dirs.json", {o: w.model_dir for o, w in weights.items()})
        return {"metrics": metrics, "weights": weights}

    return run_declared(DECLARATION, ctx, current_parameters(), produce)


def warm_start_inputs(member: AgentConfig, dataset: StageRecord) -> tuple[list, dict[str, str], dict | None]:
    """The dataset files an owner's warm-start reads: the training problems, their reference solutions and (with
    ``bootstrap.wrong_readings``) the wrong readings; a clear error where the dataset lacks them."""
    from mars2.data.tables import problems_from_frame

    if "reference_solutions.json" not in dataset.files:
        raise ValueError("bootstrap needs reference solutions in the dataset (data=toy, toy_warm, known_answer or "
                         "humaneval); set agents.members.N.bootstrap.steps=0 for other data")
    if member.bootstrap.wrong_readings and "wrong_readings.json" not in dataset.files:
        raise ValueError(f"agents member {member.name}: bootstrap.wrong_readings=true needs a dataset with wrong "
                         "readings (data=known_answer)")
    wrong = (json.loads(dataset.path("wrong_readings.json").read_text()) if member.bootstrap.wrong_readings
             else None)
    return (problems_from_frame(pd.read_parquet(dataset.path("train.parquet"))),
            json.loads(dataset.path("reference_solutions.json").read_text()), wrong)
