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
from pipeline.stage import StageContext, StageRecord, current_parameters, declared, run_stage, stage_task

STAGE = "bootstrap"
# the warm-start reads all of an agent's fields but how the RL update trains it and where it generates: an lr sweep
# of the RL update reuses it
READS = {"members": tuple(f.name for f in dataclasses.fields(AgentConfig)
                          if f.name not in ("optimizer", "deepspeed", "update_procs", "gpus", "backend")),
         # the sandbox settings that decide whether a faulty variant fails a public test (refine examples)
         "grading": ("time_limit_s", "memory_mb", "isolation", "parity")}
# the modules the warm-start uses, file by file: an edit elsewhere in mars2.train/search does not redo it
MODULES = ("mars2.train.warm_start", "mars2.train.checkpoints", "mars2.search.prompts", "mars2.search.run",
           "mars2.backends", "mars2.sandbox", "mars2.data.checks", "mars2.data.schema", "mars2.data.tables", "mars2.io",
           "tasks.bootstrap", "pipeline.weights")


def needs_bootstrap(members: list[AgentConfig]) -> bool:
    return any(m.bootstrap.steps > 0 for m in members if m.shares_weights_with is None)


@stage_task(STAGE)
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

    members, grading = declared(members, READS["members"]), declared(grading, READS["grading"])

    def produce(out: Path) -> dict:
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
            record = run_stage(f"{STAGE}-agent", MODULES, ctx, inputs,
                               lambda folder, m=m, roles=roles: warm_start_owner(
                                   folder, m, roles, weights[m.name].model_dir, weights[m.name].tokenizer_dir, dataset,
                                   ctx.grading(grading)),
                               {"member": READS["members"], "grading": READS["grading"]})
            weights[m.name] = dataclasses.replace(weights[m.name], model_dir=str(Path(record.dir) / "model"))
            metrics.update({f"{m.name}/{k}": v for k, v in record.metrics.items()})
        atomic_write_json(out / "model_dirs.json", {o: w.model_dir for o, w in weights.items()})
        return {"metrics": metrics, "weights": weights}

    return run_stage(STAGE, MODULES, ctx, current_parameters(), produce, READS)


def warm_start_owner(out: Path, member: AgentConfig, roles: list[str], init_model: str, tokenizer: str,
                     dataset: StageRecord, grading: GradingConfig) -> dict:
    """Fine-tune one owner's initial weights on its data mix (generate examples, and refine examples of faulty
    variants and of the dataset's wrong readings, graded in the sandbox with ``grading``), then, with ``own_failures``,
    a second phase that adds its own failed samples as refine examples; writes ``model/`` (complete: with the tokenizer
    files), ``mix.json`` and the refine cases (problem id, program, public status) as ``faulty.json`` /
    ``wrong_readings.json`` / ``own_failures.json`` into ``out``."""
    from rich.progress import Progress
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mars2.backends.transformers_backend import TransformersBackend
    from mars2.data.tables import problems_from_frame
    from mars2.search.prompts import chat_messages, generate_prompt, refine_prompt, result_summary
    from mars2.search.run import public_grader
    from mars2.train.checkpoints import complete_model_folder
    from mars2.train.warm_start import (faulty_attempts, own_failures, refine_examples, supervised_warm_start,
                                        warm_start_examples, warm_start_mix, wrong_reading_attempts)

    if "reference_solutions.json" not in dataset.files:
        raise ValueError("bootstrap needs reference solutions in the dataset (data=toy, toy_warm, known_answer or "
                         "humaneval); set agents.members.N.bootstrap.steps=0 for other data")
    b = member.bootstrap
    if b.wrong_readings and "wrong_readings.json" not in dataset.files:
        raise ValueError(f"agents member {member.name}: bootstrap.wrong_readings=true needs a dataset with wrong "
                         "readings (data=known_answer)")
    references = json.loads(dataset.path("reference_solutions.json").read_text())
    train = problems_from_frame(pd.read_parquet(dataset.path("train.parquet")))
    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    mix = set(warm_start_mix([p.id for p in train], b.data_fraction, b.seed))
    problems = [p for p in train if p.id in mix]
    role_of = {p.id: roles[i % len(roles)] for i, p in enumerate(problems)}
    grade = public_grader(grading)

    def chat(p, user_prompt: str) -> str:
        return tok.apply_chat_template(chat_messages(user_prompt, role_of[p.id]), tokenize=False,
                                       add_generation_prompt=True)

    def refining(p, code, v, i) -> str:  # every other refine example shows T+ detail
        return chat(p, refine_prompt(p, code, result_summary(v.status, v.passed, v.total, v.detail,
                                                             detailed=i % 2 == 1)))

    def fine_tune(examples, steps: int, seed: int, what: str) -> dict[str, float]:
        with Progress(transient=True) as bar:
            job = bar.add_task(f"{what} {member.name}", total=steps)
            return supervised_warm_start(model, examples, pad_id=tok.pad_token_id, steps=steps, lr=b.lr,
                                         batch_size=b.batch_size, seed=seed,
                                         progress=lambda step, loss: bar.update(job, completed=step))

    examples = warm_start_examples(problems, references, tok, lambda p: chat(p, generate_prompt(p)))
    extra: dict[str, float] = {}
    if b.refine_per_problem:
        cases, harmless = faulty_attempts(problems, references, b.refine_per_problem, b.seed, grade)
        examples += refine_examples(cases, references, tok, refining)
        atomic_write_json(out / "faulty.json", [{"problem_id": p.id, "code": code, "status": v.status}
                                                for p, code, v in cases])
        extra = {"refine_examples": len(cases), "harmless_variants": harmless}
    if b.wrong_readings:
        wrong = json.loads(dataset.path("wrong_readings.json").read_text())
        cases = wrong_reading_attempts(problems, wrong, grade)
        examples += refine_examples(cases, references, tok, refining)
        atomic_write_json(out / "wrong_readings.json", [{"problem_id": p.id, "code": code, "status": v.status}
                                                         for p, code, v in cases])
        extra["wrong_reading_examples"] = len(cases)
    model = AutoModelForCausalLM.from_pretrained(init_model, local_files_only=True)
    stats = fine_tune(examples, b.steps, b.seed, "bootstrap")
    if b.own_failures:
        longest = max(len(e.response_ids) for e in examples)  # a failure longer than every reference is cut there
        failures = own_failures(problems, TransformersBackend(model, tok), lambda p: chat(p, generate_prompt(p)),
                                n=b.own_failures, temperature=b.own_failures_temperature, max_new_tokens=longest,
                                seed=b.seed, grade=grade)
        second = fine_tune(examples + refine_examples(failures, references, tok, refining), b.own_failures_steps,
                       b.seed + 1, "own failures")
        atomic_write_json(out / "own_failures.json", [{"problem_id": p.id, "code": code, "status": v.status}
                                                      for p, code, v in failures])
        extra |= {"own_failures": len(failures), "own_failures_loss_last": second["loss_last"],
                  "own_failure_share": len(failures) / (b.own_failures * len(problems)),
                  "own_failures_seconds": second["seconds"]}
    model.save_pretrained(out / "model", safe_serialization=True)
    complete_model_folder(out / "model", tokenizer, source_model_dir=init_model)
    atomic_write_json(out / "mix.json", sorted(mix))
    return {"metrics": stats | extra}
