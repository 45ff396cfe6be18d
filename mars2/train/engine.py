"""One policy update of one agent through its own DeepSpeed engine (DESIGN.md §2.4).

Each agent (or each set of shared weights, for homogeneous multi-role) owns a model, an optimizer with
a warmup+cosine schedule, a frozen reference model and a DeepSpeed checkpoint that carries optimizer
and scheduler state from one update to the next. Log-probs of a sample are computed only by the agent
that wrote it.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mars2.rl.losses import grpo_loss, gspo_loss

DS_ONLY_KEYS = ("gradient_checkpointing",)


@dataclass(frozen=True)
class Sample:
    """One response routed to the agent that wrote it."""

    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    advantage: float


@dataclass(frozen=True)
class UpdateHParams:
    loss: str = "gspo"
    clip_eps: float = 0.2
    tis_threshold: float = 2.0
    tis_veto: float = 1e-4
    kl_coef: float = 1e-3
    micro_batch: int = 8
    lr: float = 1e-6
    min_lr: float = 1e-7
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    grad_clip: float = 1.0
    total_steps: int = 100
    dtype: str = "float32"
    seed: int = 0
    step_batch: int | None = None  # samples per optimizer step; None = one step on all samples
    temperature: float = 1.0  # rollout sampling temperature T: the trained policy is softmax(logits / T)


def init_distributed() -> tuple[int, int]:
    """(rank, world size) of this process, with torch.distributed ready for DeepSpeed (gloo on CPU, nccl on GPU).

    Under ``torchrun`` (RANK/WORLD_SIZE/MASTER_* set by the launcher) it joins the launcher's group; alone, it makes
    a one-process group on an in-memory store, so DeepSpeed runs without its launcher and no port is taken (a free
    port picked here could be taken by another process before the group binds it). Idempotent.
    """
    import torch.distributed as dist

    launched = "WORLD_SIZE" in os.environ
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # DeepSpeed falls back to MPI discovery unless all of these are set; alone, nothing listens on MASTER_PORT
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500"}.items():
        os.environ.setdefault(k, v)
    if not dist.is_initialized():
        import deepspeed

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if not launched:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
    return dist.get_rank(), dist.get_world_size()


def rank_device(device: str, world: int) -> str:
    """This rank's device: ``cuda`` becomes ``cuda:<LOCAL_RANK>`` when several processes share a node."""
    if world > 1 and device.startswith("cuda"):
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    return device


def deepspeed_config(profile: dict[str, Any], *, micro_batch: int, grad_accum: int, grad_clip: float) -> dict[str, Any]:
    """A DeepSpeed config from a profile of ``conf/deepspeed/`` plus this update's batch geometry."""
    cfg = {k: v for k, v in profile.items() if k not in DS_ONLY_KEYS}
    cfg.update(
        train_micro_batch_size_per_gpu=micro_batch,
        gradient_accumulation_steps=grad_accum,
        gradient_clipping=grad_clip,
        steps_per_print=10**9,
        wall_clock_breakdown=False,
    )
    cfg.setdefault("zero_optimization", {"stage": 0})
    return cfg


def warmup_cosine(step: int, *, total_steps: int, warmup_ratio: float, lr: float, min_lr: float) -> float:
    """lr(step): linear warmup over ⌈warmup_ratio·total⌉ steps, then cosine from ``lr`` to ``min_lr``."""
    warmup = max(1, math.ceil(warmup_ratio * total_steps))
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def pack_batch(samples: list[Sample], pad_id: int, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Right-pad prompt+response sequences into tensors aligned with next-token log-probs.

    Returns input_ids, attention_mask [B, L] and, over the L−1 predicted positions, response ``mask``,
    ``rollout_logp`` [B, L−1] and ``advantages`` [B]. Position t predicts token t+1, so response token j
    of a sample with prompt length P sits at position P−1+j.
    """
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    L = max(lengths)
    B = len(samples)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L - 1))
    rollout = torch.zeros((B, L - 1))
    for b, s in enumerate(samples):
        seq = s.prompt_ids + s.response_ids
        input_ids[b, : len(seq)] = torch.tensor(seq)
        attention[b, : len(seq)] = 1
        p, r = len(s.prompt_ids), len(s.response_ids)
        mask[b, p - 1 : p - 1 + r] = 1
        rollout[b, p - 1 : p - 1 + r] = torch.tensor(s.rollout_logprobs[:r])
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return {k: v.to(device) for k, v in dict(input_ids=input_ids, attention_mask=attention, mask=mask,
                                                rollout_logp=rollout, advantages=adv).items()}


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """log π_T(x_{t+1} | x_{≤t}) for every position, π_T = softmax(logits / T): [B, L] ids → [B, L−1] (float32).

    The policy that is trained is the one the rollouts sampled from: at rollout temperature T that is π_T (as in
    verl), so the rollout log-probs, π_old and π_ref are all log π_T and the ratios start at 1.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def _load_model(path: str, dtype: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)


def update_agent(*, model_dir: str, ref_model_dir: str, prev_ds_dir: str | None, samples: list[Sample],
                 out_dir: str | Path, profile: dict[str, Any], hp: UpdateHParams, pad_id: int,
                 device: str = "cpu") -> dict[str, float]:
    """Optimizer step(s) of one agent on its routed samples; writes ``out_dir/model`` (HF safetensors)
    and ``out_dir/ds`` (DeepSpeed checkpoint with optimizer + scheduler state). Returns metrics.

    ``hp.step_batch=None``: one step on all samples (π_old = the policy before the step). Otherwise the samples,
    in a seeded order, form ⌊n/step_batch⌋ near-equal batches and each takes one step; π_old is the policy
    before the first step for all of them (PPO-style), so later steps' ratios see how far the policy moved.

    Under torchrun (:mod:`mars2.train.launch`) every rank calls this with all samples and trains on its shard of
    each step (:func:`rank_micro_batches`); DeepSpeed all-reduces the gradients, metrics are summed over ranks, and
    rank 0 writes ``model/`` while every rank writes its part of ``ds/``.
    """
    import deepspeed
    import torch.distributed as dist

    rank, world = init_distributed()
    device = rank_device(device, world)
    torch.manual_seed(hp.seed)
    out_dir = Path(out_dir)
    model = _load_model(model_dir, hp.dtype, device)
    if profile.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable()
    ref = _load_model(ref_model_dir, hp.dtype, device).eval().requires_grad_(False)
    groups = step_groups(len(samples), hp.step_batch, hp.seed)
    steps = rank_micro_batches(groups, hp.micro_batch, world, rank)
    n_micro = len(steps[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, total_steps=hp.total_steps, warmup_ratio=hp.warmup_ratio,
                                              lr=hp.lr, min_lr=hp.min_lr) / hp.lr)
    ds_cfg = deepspeed_config(profile, micro_batch=hp.micro_batch, grad_accum=n_micro, grad_clip=hp.grad_clip)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_cfg)
    step = 0
    if prev_ds_dir is not None:
        _, client = engine.load_checkpoint(prev_ds_dir, tag="ckpt")
        step = int((client or {}).get("update_step", 0))
        if client and "torch_rng" in client:
            torch.set_rng_state(client["torch_rng"])
    engine.train()
    start = time.perf_counter()
    chunks = [[samples[i] for i in idx] for micro in steps for idx in micro]
    old_logps = None
    if len(steps) > 1:
        with torch.no_grad():
            old_logps = [token_logprobs(engine, b["input_ids"], b["attention_mask"], hp.temperature)
                         for b in (pack_batch(c, pad_id, engine.device) for c in chunks)]
    keys = ("loss", "pg_loss", "kl", "clip_frac", "tis_vetoed")
    totals = torch.zeros(len(keys), dtype=torch.float64)
    grad_norm = None
    k = 0
    for micro, group in zip(steps, groups, strict=True):
        for i, idx in enumerate(micro):
            chunk = chunks[k]
            batch = pack_batch(chunk, pad_id, engine.device)
            logp = token_logprobs(engine, batch["input_ids"], batch["attention_mask"], hp.temperature)
            with torch.no_grad():
                ref_logp = token_logprobs(ref, batch["input_ids"], batch["attention_mask"], hp.temperature)
            old_logp = logp.detach() if old_logps is None else old_logps[k]
            if hp.loss == "gspo":
                out = gspo_loss(logp, old_logp, batch["rollout_logp"], ref_logp, batch["advantages"], batch["mask"],
                                clip_eps=hp.clip_eps, tis_threshold=hp.tis_threshold, tis_veto=hp.tis_veto,
                                kl_coef=hp.kl_coef)
            else:
                out = grpo_loss(logp, old_logp, ref_logp, batch["advantages"], batch["mask"], clip_eps=hp.clip_eps,
                                kl_coef=hp.kl_coef)
            # DeepSpeed divides by the accumulation count and averages over ranks; weight each micro-batch by its
            # share of the step's samples so the gradient is the mean over all of them, whatever the split
            engine.backward(out.loss * (len(chunk) * n_micro * world / len(group)))
            if i == n_micro - 1:
                grad_norm = _grad_norm(engine)
            engine.step()
            totals += torch.tensor([float(out.loss.item() if key == "loss" else getattr(out, key)) for key in keys],
                                   dtype=torch.float64) * len(chunk)
            k += 1
    tokens = float(sum(len(samples[i].prompt_ids) + len(samples[i].response_ids)
                       for micro in steps for idx in micro for i in idx))
    totals = _sum_over_ranks(torch.cat([totals, torch.tensor([tokens], dtype=torch.float64)]), engine.device, world)
    seconds = time.perf_counter() - start
    lr = scheduler.get_last_lr()[0]
    engine.save_checkpoint(str(out_dir / "ds"), tag="ckpt",
                           client_state={"update_step": step + len(steps), "torch_rng": torch.get_rng_state()})
    _save_hf(engine, out_dir / "model", profile, rank)
    if world > 1:
        dist.barrier()
    means = {key: float(totals[j]) / len(samples) for j, key in enumerate(keys)}
    extra = {} if grad_norm is None else {"grad_norm": grad_norm}
    return {**means, **extra, "lr": float(lr), "n_samples": float(len(samples)), "update_step": float(step + len(steps)),
            "optimizer_steps": float(len(steps)), "processes": float(world),
            "tokens_per_s": float(totals[-1]) / max(seconds, 1e-9), "step_seconds": seconds}


def _sum_over_ranks(values: torch.Tensor, device, world: int) -> torch.Tensor:
    if world == 1:
        return values
    import torch.distributed as dist

    on = values.to(device)
    dist.all_reduce(on)
    return on.cpu()


def step_groups(n: int, step_batch: int | None, seed: int) -> list[list[int]]:
    """Sample indices of each optimizer step: ``step_batch=None`` → one step over ``range(n)`` in order; else
    ⌊n/step_batch⌋ (≥ 1) near-equal steps over a seeded permutation of ``range(n)``."""
    if n < 1:
        raise ValueError("update needs at least one sample")
    if step_batch is None:
        return [list(range(n))]
    order = [int(i) for i in np.random.default_rng(seed).permutation(n)]
    n_steps = max(1, n // step_batch)
    return [order[i * n // n_steps : (i + 1) * n // n_steps] for i in range(n_steps)]


def rank_micro_batches(groups: list[list[int]], micro_batch: int, world: int = 1, rank: int = 0) -> list[list[list[int]]]:
    """This rank's micro-batches of each step: step s's samples are cut into ``world`` near-equal contiguous shards
    and shard ``rank`` into micro-batches of at most ``micro_batch``. Every step on every rank has the same number
    of micro-batches (DeepSpeed's gradient-accumulation count is fixed per engine, and ranks step together) and
    none is empty, so every step needs at least ``world`` samples.
    """
    if min(len(g) for g in groups) < world:
        raise ValueError(f"an optimizer step has {min(len(g) for g in groups)} samples for {world} processes; "
                         "use fewer processes or a larger step_batch")
    shards = [[g[r * len(g) // world : (r + 1) * len(g) // world] for r in range(world)] for g in groups]
    sizes = [len(s) for per_step in shards for s in per_step]
    n_micro = min(math.ceil(max(sizes) / micro_batch), min(sizes))
    return [[s[j * len(s) // n_micro : (j + 1) * len(s) // n_micro] for j in range(n_micro)]
            for s in (per_step[rank] for per_step in shards)]


def step_batches(n: int, step_batch: int | None, micro_batch: int, seed: int) -> list[list[list[int]]]:
    """Sample indices per optimizer step, per micro-batch, in one process (see :func:`rank_micro_batches`)."""
    return rank_micro_batches(step_groups(n, step_batch, seed), micro_batch)


def _grad_norm(engine) -> float | None:
    """L2 norm of the accumulated gradient before clipping (full gradients exist only without ZeRO partitioning)."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        norm = engine.get_global_grad_norm()
        return None if norm is None else float(norm)
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


def _save_hf(engine, path: Path, profile: dict[str, Any], rank: int) -> None:
    """HF safetensors of the updated model, written by rank 0 (ZeRO-3 gathers the shards from every rank first)."""
    stage = int(profile.get("zero_optimization", {}).get("stage", 0))
    state = engine._zero3_consolidated_16bit_state_dict() if stage == 3 else None
    if rank == 0:
        engine.module.save_pretrained(str(path), state_dict=state, safe_serialization=True)
