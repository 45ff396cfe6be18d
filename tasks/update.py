"""Stage 5 — update: one policy step per weight owner through its own DeepSpeed engine."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task

from mars2.config import AgentConfig, ConfigError, TrainConfig
from tasks._agents import model_dir, tokenizer_dir
from tasks._stage import StageContext, StageRecord, cache_key_fn, current_parameters, run_stage

STAGE = "update"
MODULES = ("mars2.train", "mars2.rl", "mars2.io", "tasks.update", "tasks._agents")


@task(name=STAGE, cache_key_fn=cache_key_fn(STAGE, MODULES), persist_result=True,
      task_run_name="update-{member.name}-c{cycle}")
def update_policy(ctx: StageContext, member: AgentConfig, train: TrainConfig, profile: dict[str, Any],
                  weights: StageRecord, agents: StageRecord, routed: StageRecord, cycle: int,
                  temperature: float = 1.0) -> StageRecord:
    """New weights (``model/``, safetensors), optimizer/scheduler/RNG state (``ds/``) and sample buffer of ``member``.

    ``member.processes > 1`` (``gpus`` or ``update_procs``): the step runs data parallel on that many torchrun ranks
    (:mod:`mars2.train.launch`), the same update as one process makes. ``temperature``: the rollouts' sampling
    temperature T; the policy trained is softmax(logits / T), the distribution the samples came from.

    The agent's buffer = samples carried over from earlier cycles + the samples routed to it now. When it holds
    at least ``train.train_batch`` samples the agent takes one step on all of them (computing their log-probs
    itself) and the buffer empties; otherwise the record points at the previous weights and keeps the buffer.
    """
    owner = member.name

    def produce(out: Path) -> dict:
        from transformers import AutoTokenizer

        from mars2.io import write_parquet
        from mars2.train import Sample, UpdateHParams, update_agent
        from mars2.train.launch import launch_update

        carried = weights.meta.get("buffers", {}).get(owner)
        new = pd.read_parquet(routed.path(f"routed/{owner}.parquet"))
        table = pd.concat([pd.read_parquet(weights.resolve(carried)), new], ignore_index=True) if carried else new
        prev_ds = weights.meta.get("ds_dirs", {}).get(owner)
        if len(table) < train.train_batch:
            write_parquet(out / "buffer.parquet", table)
            return {"metrics": {"skipped": 1.0, "buffered": len(table)},
                    "meta": {"model_dirs": {owner: model_dir(weights, owner)},
                             "ds_dirs": {owner: weights.resolve(prev_ds)} if prev_ds else {},
                             "buffers": {owner: "buffer.parquet"}}}
        samples = [Sample(list(r.prompt_ids), list(r.response_ids), list(r.logprobs), float(r.advantage))
                   for r in table.itertuples()]
        opt = member.optimizer
        hp = UpdateHParams(loss=train.loss, clip_eps=train.clip_eps, tis_threshold=train.tis_threshold,
                           tis_veto=train.tis_veto, kl_coef=train.kl_coef, micro_batch=train.micro_batch, lr=opt.lr,
                           min_lr=opt.min_lr, betas=tuple(opt.betas), weight_decay=opt.weight_decay,
                           warmup_ratio=opt.warmup_ratio, grad_clip=opt.grad_clip, cycle=cycle, cycles=train.cycles,
                           dtype=member.dtype, seed=train.seed + cycle,
                           step_batch=train.step_batch, temperature=temperature if temperature > 0 else 1.0,
                           micro_batch_tokens=train.micro_batch_tokens, logprob_chunk_tokens=train.logprob_chunk_tokens)
        pad_id = AutoTokenizer.from_pretrained(tokenizer_dir(agents, owner), local_files_only=True).pad_token_id
        args = dict(model_dir=model_dir(weights, owner), ref_model_dir=model_dir(agents, owner),
                    prev_ds_dir=weights.resolve(prev_ds) if prev_ds else None, samples=samples, profile=profile, hp=hp,
                    pad_id=pad_id, device=member.device)
        if member.processes > 1:  # data parallel over torchrun ranks (one per GPU); the job folder goes afterwards
            check_processes(member)
            metrics = launch_update(member.processes, out / "job", out_dir=str(out), **args)
            shutil.rmtree(out / "job")
        else:
            metrics = update_agent(out_dir=out, **args)
        adv = table["advantage"]
        metrics.update(advantage_mean=float(adv.mean()), advantage_std=float(adv.std(ddof=0)),
                       advantage_abs_max=float(adv.abs().max()), carried_over=float(len(table) - len(new)))
        return {"metrics": metrics,
                "meta": {"model_dirs": {owner: "model"}, "ds_dirs": {owner: "ds"}}}

    return run_stage(STAGE, MODULES, ctx, current_parameters(), produce)


def check_processes(member: AgentConfig) -> None:
    """A multi-process update on CUDA needs one visible GPU per rank."""
    import torch

    visible = torch.cuda.device_count()
    if member.device.startswith("cuda") and visible < member.processes:
        raise ConfigError(f"agent {member.name!r}: its update needs {member.processes} GPUs (gpus/update_procs) but "
                          f"this worker sees {visible}; run the update stage on a worker with enough GPUs "
                          "(orchestration=pools) or lower agents.members.N.gpus")
