"""Update stage: one policy step per weight owner through its own DeepSpeed engine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from mars2.backends.base import visible_devices
from mars2.config import AgentConfig, ConfigError, TrainConfig, check_machine
from stagekit.progress import stage_progress
from stagekit.stage import (AgentWeights, Column, StageContext, StageDeclaration, StageRecord, current_parameters,
                            run_declared, stage_task)
from stagekit.runners import in_process_device


def loss_and_kl(metrics: dict[str, float]) -> str:
    """An update's cell of the per-cycle table: ``loss / KL``, ``buffered`` (no step: its buffer is filling), ``-``."""
    if metrics.get("skipped"):
        return "buffered"
    return f"{metrics['loss']:.2g} / {metrics['kl']:.1g}" if "loss" in metrics else "-"


DECLARATION = StageDeclaration(
    name="update", label="update", per_owner=True,
    modules=("mars2.train", "mars2.rl", "mars2.io", "tasks.update", "stagekit.runners"),
    columns=(Column("{owner}", None, loss_and_kl, "update loss / KL"),))


@stage_task(DECLARATION, task_run_name="update-{member.name}-c{cycle}")
def update_policy(ctx: StageContext, member: AgentConfig, train: TrainConfig, profile: dict[str, Any],
                  weight_record: StageRecord, agents: StageRecord, routed: StageRecord, cycle: int,
                  temperature: float = 1.0) -> StageRecord:
    """New weights (``model/``: a complete HF folder, safetensors + tokenizer files), optimizer/scheduler/RNG state
    (``ds/``) and sample buffer of ``member``, handed on as ``record.weights[member.name]``; ``weight_record``: the
    record holding its current ones (its last update's, or the agents').

    ``member.processes > 1`` (``gpus`` or ``update_procs``): the step runs data parallel on that many torchrun ranks
    (:mod:`mars2.train.launch`), the same update as one process makes. ``temperature``: the rollouts' sampling
    temperature T; the policy trained is softmax(logits / T), the distribution the samples came from.

    The agent's buffer = samples carried over from earlier cycles + the samples routed to it now. When it holds
    at least ``train.train_batch`` samples the agent takes one step on all of them (computing their log-probs
    itself) and the buffer empties; otherwise the record points at the previous weights and keeps the buffer.
    An update whose previous optimizer state was pruned (``train.keep_optimizer_states``) fails saying so.
    """
    owner = member.name
    # pools mode: the flow's machine checked only the config
    check_machine([member], stage=f"update/{owner}", gpu_memory_gb=ctx.gpu_memory_gb)

    def produce(out: Path) -> dict:
        from transformers import AutoTokenizer

        from mars2.io import write_parquet
        from mars2.rl.tables import buffer_metrics
        from mars2.train import Sample, update_hparams
        from mars2.train.checkpoints import complete_model_folder, optimizer_state_in_use, require_optimizer_state

        current = weight_record.weights_of(owner)
        new = pd.read_parquet(routed.path(f"routed/{owner}.parquet"))
        table = pd.concat([pd.read_parquet(current.buffer), new], ignore_index=True) if current.buffer else new
        if len(table) < train.train_batch:
            write_parquet(out / "buffer.parquet", table)
            return {"metrics": {"skipped": 1.0, "buffered": len(table)},
                    "weights": {owner: AgentWeights(model_dir=current.model_dir, tokenizer_dir=current.tokenizer_dir,
                                                    optimizer_dir=current.optimizer_dir, buffer="buffer.parquet")}}
        samples = [Sample(list(r.prompt_ids), list(r.response_ids), list(r.logprobs), float(r.advantage))
                   for r in table.itertuples()]
        hp = update_hparams(train, member.optimizer, cycle=cycle, dtype=member.dtype, temperature=temperature)
        reference = agents.weights_of(owner)
        pad_id = AutoTokenizer.from_pretrained(reference.tokenizer_dir, local_files_only=True).pad_token_id
        args = dict(model_dir=current.model_dir, ref_model_dir=reference.model_dir, prev_ds_dir=current.optimizer_dir,
                    samples=samples, profile=profile, hp=hp, pad_id=pad_id,
                    device=member.device if member.processes > 1 else in_process_device(member))
        with optimizer_state_in_use(current.optimizer_dir):  # a sweep sharing the cache must not prune it now
            require_optimizer_state(current.optimizer_dir)
            metrics = policy_step(ctx, member, out, f"update/{owner} c{cycle}", args)
        complete_model_folder(out / "model", current.tokenizer_dir, source_model_dir=current.model_dir)
        return {"metrics": {**metrics, **buffer_metrics(table, len(new))},
                "weights": {owner: AgentWeights(model_dir="model", tokenizer_dir=current.tokenizer_dir,
                                                optimizer_dir="ds")}}

    return run_declared(DECLARATION, ctx, current_parameters(), produce)


def policy_step(ctx: StageContext, member: AgentConfig, out: Path, label: str, args: dict[str, Any]) -> dict:
    """One update of ``member`` into ``out`` (``args``: :func:`mars2.train.update_agent`'s); its metrics. With
    ``member.processes > 1`` it runs data parallel over torchrun ranks (one per GPU), whose job folder goes
    afterwards; otherwise in this process, with a progress line per ``ctx.progress_every_s``."""
    from mars2.train import update_agent
    from mars2.train.launch import launch_update

    if member.processes > 1:
        check_processes(member)
        metrics = launch_update(member.processes, out / "job", out_dir=str(out),
                                cuda_visible_devices=update_devices(member),
                                threads_per_rank=ctx.cpu_shares(update_ranks=node_ranks(ctx, member)).update_rank, **args)
        shutil.rmtree(out / "job")
        return metrics
    with stage_progress(label, "samples", every_s=ctx.progress_every_s) as advance:
        return update_agent(out_dir=out, progress=advance, **args)


def node_ranks(ctx: StageContext, member: AgentConfig) -> int:
    """The ranks this worker's cores are shared among: those of every update running on the node at the same time
    (pools mode: a cycle's updates run at once, ``ctx.node_update_ranks``), else the update's own."""
    return max(member.processes, ctx.node_update_ranks.get(member.name, 0))


def update_devices(member: AgentConfig) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` of a multi-process update: the GPUs the plan placed the agent on (``gpu_ids``), as
    this worker sees them; None where it was not placed (its ranks take this worker's first GPUs)."""
    return visible_devices(list(member.gpu_ids), os.environ.get("CUDA_VISIBLE_DEVICES")) if member.gpu_ids else None


def check_processes(member: AgentConfig) -> None:
    """A multi-process update on CUDA needs one visible GPU per rank (one placed GPU per rank, where placed)."""
    import torch

    visible = len(member.gpu_ids) if member.gpu_ids else torch.cuda.device_count()
    if member.device.startswith("cuda") and visible < member.processes:
        raise ConfigError(f"agent {member.name!r}: its update needs {member.processes} GPUs (gpus/update_procs) but "
                          f"this worker sees {visible}; run the update stage on a worker with enough GPUs "
                          "(orchestration=pools) or lower agents.members.N.gpus")
