"""One policy update of one agent through its own DeepSpeed engine (docs/algorithm.md §13–§14).

Each agent (or each set of shared weights, for homogeneous multi-role) owns a model, an AdamW optimizer whose lr
follows a warmup+cosine schedule over the run's updates, a frozen reference model and a DeepSpeed checkpoint that
carries optimizer state from one update to the next. Log-probs of a sample are computed only by the agent that
wrote it. docs/training.md describes how the update is built to fit long responses.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import dataclasses
import datetime
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.profiler import record_function

from mars2.backends.base import checkpoint_files
from mars2.rl.losses import LOSSES
from mars2.shims.deepspeed_import import import_deepspeed

DS_ONLY_KEYS = ("gradient_checkpointing",)
log = logging.getLogger(__name__)


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
    cycle: int = 0  # index of this update in the run: the lr schedule's step
    cycles: int = 1  # updates in the run (train.cycles): the lr schedule's horizon
    dtype: str = "float32"
    seed: int = 0
    step_batch: int | None = None  # samples per optimizer step; None = one step on all samples
    temperature: float = 1.0  # rollout sampling temperature T: the trained policy is softmax(logits / T)
    micro_batch_tokens: int | None = None  # padded tokens per micro-batch (length-bucketed); None = micro_batch samples
    logprob_chunk_tokens: int = 1024  # response positions per chunk of the [tokens × vocab] log-prob computation
    collective_timeout_s: float = 7200.0  # how long a rank may wait in one collective (saving included)


def update_hparams(train, optimizer, *, cycle: int, dtype: str, temperature: float) -> UpdateHParams:
    """This update's hyper-parameters: every field :class:`UpdateHParams` shares by name with the run's
    :class:`mars2.config.TrainConfig` or the agent's :class:`mars2.config.OptimizerConfig`, plus where it stands in
    the run (``cycle`` of ``train.cycles``: the lr schedule), its seed (``train.seed + cycle``), the agent's dtype and
    the rollout temperature T (the trained policy is softmax(logits / T); T = 0, greedy, trains T = 1)."""
    own = {f.name for f in dataclasses.fields(UpdateHParams)}
    shared = {name: getattr(cfg, name) for cfg in (train, optimizer) for name in (f.name for f in dataclasses.fields(cfg))
              if name in own and name not in ("seed", "cycles")}
    return UpdateHParams(**{**shared, "betas": tuple(optimizer.betas)}, cycle=cycle, cycles=train.cycles, dtype=dtype,
                         seed=train.seed + cycle, temperature=temperature if temperature > 0 else 1.0)


def init_distributed(timeout_s: float = 7200.0) -> tuple[int, int]:
    """(rank, world size) of this process, with torch.distributed ready for DeepSpeed (gloo on CPU, nccl on GPU);
    a rank waits at most ``timeout_s`` in one collective, of the world group and of every group made later without a
    timeout of its own (DeepSpeed's data-parallel groups: ZeRO's reduce-scatter and all-reduce run there).

    Under ``torchrun`` (RANK/WORLD_SIZE/MASTER_* set by the launcher) it joins the launcher's group; alone, it makes
    a one-process group on an in-memory store, so DeepSpeed runs without its launcher and no port is taken (a free
    port picked here could be taken by another process before the group binds it). Idempotent.
    """
    import torch.distributed as dist

    # torchrun sets WORLD_SIZE > 1; a WORLD_SIZE=1 left in the environment by an earlier update in this process (and
    # inherited by its children) must not send a lone process to bind MASTER_PORT, where a concurrent one may sit
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    select_accelerator()
    # DeepSpeed falls back to MPI discovery unless all of these are set; alone, nothing listens on MASTER_PORT
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500"}.items():
        os.environ.setdefault(k, v)
    if not dist.is_initialized():
        deepspeed = import_deepspeed()

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        # torch's default for groups made without a timeout (10 min nccl, 30 gloo): DeepSpeed makes its
        # data-parallel groups that way (utils/groups.py), so the run's timeout would reach the world group only
        c10d = dist.distributed_c10d
        c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
        if not launched:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed prints "... built successfully" for its CPU op
            deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def select_accelerator() -> None:
    """Tell DeepSpeed, before it is imported, that a machine without CUDA trains on the CPU (``DS_ACCELERATOR``), so it
    does not warn that it failed to find an accelerator."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def rank_device(device: str, world: int) -> str:
    """This rank's device: a bare ``cuda`` (and any cuda device when several processes share a node) becomes
    ``cuda:<LOCAL_RANK>``, the index ``torch.cuda.set_device`` needs; ``cuda:N`` alone and ``cpu`` stay."""
    if device == "cuda" or (world > 1 and device.startswith("cuda")):
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


def update_lr(hp: UpdateHParams) -> float:
    """The lr of update ``hp.cycle`` of ``hp.cycles``: warmup_cosine(cycle, total = cycles), one schedule step per
    update (as verl steps its scheduler once per training step), constant over that update's optimizer steps."""
    return warmup_cosine(hp.cycle, total_steps=hp.cycles, warmup_ratio=hp.warmup_ratio, lr=hp.lr, min_lr=hp.min_lr)


def zero_stage(profile: dict[str, Any]) -> int:
    """ZeRO stage of a ``conf/deepspeed/`` profile (0 when it has none)."""
    return int(profile.get("zero_optimization", {}).get("stage", 0))


def offloads_optimizer(profile: dict[str, Any]) -> bool:
    """Whether the profile keeps optimizer states on the host (``zero_optimization.offload_optimizer.device``)."""
    offload = profile.get("zero_optimization", {}).get("offload_optimizer") or {}
    return offload.get("device", "none") in ("cpu", "nvme")


def optimizer_class(profile: dict[str, Any]) -> type:
    """AdamW implementation for a profile: DeepSpeed's ``DeepSpeedCPUAdam`` when the optimizer is offloaded to the host
    (DeepSpeed refuses a torch optimizer there), else ``torch.optim.AdamW``. Importing the class builds nothing; its
    C++ kernel compiles on first construction."""
    if offloads_optimizer(profile):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam
    return torch.optim.AdamW


STALE_BUILD_LOCK_S = 3600.0  # no build of ours takes an hour (CPU Adam: ~3 minutes)


def clear_stale_build_locks(root: str | None = None, older_than_s: float = STALE_BUILD_LOCK_S) -> list[str]:
    """Remove the ``lock`` files of torch extension builds under ``root`` (default: ``TORCH_EXTENSIONS_DIR``, else
    torch's own folder) older than ``older_than_s``: a build killed mid-way (a cancelled update's ranks) leaves its
    lock, and torch's ``FileBaton`` then waits for it for ever in every later update on that host. The paths
    removed."""
    from torch.utils.cpp_extension import get_default_build_root

    root = root or os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    removed = []
    for folder, _, files in os.walk(root):
        if "lock" in files and folder.count(os.sep) - root.count(os.sep) <= 2:
            lock = os.path.join(folder, "lock")
            try:
                if time.time() - os.stat(lock).st_mtime > older_than_s:
                    os.remove(lock)
                    removed.append(lock)
            except OSError:  # another rank removed it first
                pass
    return removed


def build_optimizer(params, profile: dict[str, Any], *, lr: float, betas: tuple[float, float], weight_decay: float):
    """The update's AdamW (decoupled weight decay) over ``params``, of :func:`optimizer_class` (whose C++ kernel may
    be built here: a build lock a killed build left is cleared first, :func:`clear_stale_build_locks`)."""
    cls = optimizer_class(profile)
    if cls is not torch.optim.AdamW:
        for lock in clear_stale_build_locks():
            log.warning("removed the lock of a torch extension build killed over an hour ago: %s", lock)
    extra = {"adamw_mode": True} if cls is not torch.optim.AdamW else {}
    return cls(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, **extra)


def reference_config(ds_cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed config of the frozen reference model: the policy's, without an optimizer to offload."""
    zero = {k: v for k, v in ds_cfg.get("zero_optimization", {}).items() if k != "offload_optimizer"}
    return {**ds_cfg, "zero_optimization": zero}


def release_engine(engine) -> None:
    """Destroy a finished DeepSpeed engine and drop what DeepSpeed's ZeRO-3 keeps of its model at module level
    (:mod:`mars2.shims.deepspeed_zero3`), so that its parameters, gradients and optimizer states are freed once the
    caller's references go. Without this every ZeRO-3 engine stays alive with its model: on a GPU the second update
    in one process (the next agent, the next cycle) runs out of memory."""
    module = getattr(engine, "module", None)
    engine.destroy()
    if module is None or not hasattr(module, "ds_id"):  # not set up by ZeRO-3
        return
    from mars2.shims.deepspeed_zero3 import drop_zero3_references

    drop_zero3_references(module)


def free_accelerator_memory() -> None:
    """Collect the cycles a released engine leaves (hooks refer to their modules) and give cached GPU blocks back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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
    verl), so the rollout log-probs, π_old and π_ref are all log π_T and the ratios start at 1. This full path holds
    [B, L, vocab] fp32 logits (≈ 22 GB for one 36K-token Qwen3 sequence); training uses :func:`chunked_token_logprobs`.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def backbone_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder, lm head) of a causal LM (Qwen2/Qwen3/Llama), also inside a DeepSpeed engine (``engine.module``)."""
    inner = getattr(model, "module", model)
    return inner.get_decoder(), inner.get_output_embeddings()


def final_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """h = the decoder's last hidden states (after the final norm): [B, L] ids → [B, L, H].

    The whole model is called (so DeepSpeed's ZeRO-3 hooks see a normal forward) with no position kept for the head
    (``logits_to_keep`` empty → [B, 0, vocab] logits); h is taken from the decoder's output by a forward hook.
    """
    decoder, _ = backbone_and_head(model)
    captured: list[torch.Tensor] = []
    handle = decoder.register_forward_hook(lambda _m, _a, out: captured.append(out.last_hidden_state))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
              logits_to_keep=torch.zeros(0, dtype=torch.long, device=input_ids.device))
    finally:
        handle.remove()
    return captured[0]


def _sampled_logprob_chunk(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """z = (h·W)/T in fp32; log π_T(x) = z[x] − logsumexp(z): hidden [C, H], targets [C] → [C]."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits.div_(temperature)
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def chunk_count(n_positions: int, chunk_tokens: int, device: torch.device | str = "cpu") -> int:
    """⌈n_positions / chunk_tokens⌉, or, when torch.distributed runs several ranks, the largest count of any rank.

    Under ZeRO-3 every call of a partitioned module all-gathers its parameters on all ranks, so every rank must call
    the output head equally often whatever its own response lengths (a rank with fewer calls leaves the others waiting
    in a gather). Every rank calls this at the same points: it is a collective there."""
    n = -(-n_positions // chunk_tokens)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        most = torch.tensor([n], dtype=torch.long, device=device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        n = int(most.item())
    return n


def sampled_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                     chunk_tokens: int = 1024, n_chunks: int | None = None) -> torch.Tensor:
    """log π_T(targets | hidden) over chunks of ``chunk_tokens`` positions: hidden [N, H], targets [N] → [N] (fp32).

    With gradients on, each chunk runs under non-reentrant ``torch.utils.checkpoint``: its [C, vocab] logits are
    rebuilt in backward instead of kept, so at most one chunk's logits (and their gradient) exist at a time.
    ``n_chunks`` (≥ ⌈N / chunk_tokens⌉): the head runs that many times, on empty chunks after the last one, in forward
    and in backward alike (:func:`chunk_count`).
    """
    needed = -(-hidden.shape[0] // chunk_tokens)
    n_chunks = needed if n_chunks is None else n_chunks
    if n_chunks < needed:
        raise ValueError(f"n_chunks={n_chunks} cannot cover {hidden.shape[0]} positions in chunks of {chunk_tokens}")
    out = []
    for i in range(0, n_chunks * chunk_tokens, chunk_tokens):
        h, x = hidden[i : i + chunk_tokens], targets[i : i + chunk_tokens]
        if torch.is_grad_enabled() and h.requires_grad:
            out.append(torch.utils.checkpoint.checkpoint(_sampled_logprob_chunk, head, h, x, temperature,
                                                         use_reentrant=False))
        else:
            out.append(_sampled_logprob_chunk(head, h, x, temperature))
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


def chunked_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor, *,
                           temperature: float = 1.0, chunk_tokens: int = 1024) -> torch.Tensor:
    """:func:`token_logprobs` at the response positions only, computed in chunks: [B, L] ids, ``mask`` [B, L−1] →
    [B, L−1] fp32, log π_T(x_{t+1} | x_{≤t}) where mask = 1 and 0 elsewhere.

    log π_T(x_{t+1} | x_{≤t}) = (h_t·W)[x_{t+1}]/T − logsumexp(h_t·W/T), h from :func:`final_hidden_states`,
    W the output embedding; see :func:`sampled_logprobs` for the memory bound. With several ranks, every rank runs
    as many chunks as the rank with the most response positions (:func:`chunk_count`).
    """
    _, head = backbone_and_head(model)
    hidden = final_hidden_states(model, input_ids, attention_mask)[:, :-1]
    where = mask.bool()
    n_chunks = chunk_count(int(where.sum()), chunk_tokens, hidden.device)
    values = sampled_logprobs(head, hidden[where], input_ids[:, 1:][where], temperature=temperature,
                              chunk_tokens=chunk_tokens, n_chunks=n_chunks)
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(where, values)


def load_causal_lm(path: str, dtype: str, device: str, ds_cfg: dict[str, Any] | None = None):
    """A causal LM from ``path``. Under a ZeRO-3 ``ds_cfg`` it is built partitioned: constructed inside
    ``deepspeed.zero.Init`` (each of N ranks holds 1/N of every parameter from construction on), then filled from the
    checkpoint one module at a time by :func:`load_into_partitions`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if ds_cfg is None or zero_stage(ds_cfg) != 3:
        return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    deepspeed = import_deepspeed()
    from transformers.initialization import no_init_weights
    from transformers.integrations.deepspeed import prevent_arange_dtype_change
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(path)
    # zero.Init patches torch's tensor constructors, and torch._dynamo refuses to import under that patch: import it
    # and the model's module (transformers imports it lazily, and with it torch._dynamo) before entering
    importlib.import_module("torch._dynamo")
    MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    # RoPE buffers are built with explicit integer/fp32 aranges that zero.Init would otherwise cast to bf16; random
    # initialisation is skipped (the checkpoint overwrites every parameter, and it cannot index empty partitions)
    with prevent_arange_dtype_change(), deepspeed.zero.Init(config_dict_or_path=ds_cfg), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.tie_weights()  # tied embeddings (config.tie_word_embeddings): lm_head shares the embedding's partition
    load_into_partitions(model, path)
    return model


def load_into_partitions(model, path: str | Path) -> None:
    """Copy a checkpoint into a ZeRO-3-partitioned model, one module at a time: the module's parameters are gathered,
    rank 0 copies their values from the safetensors files (mapped tensor by tensor), and leaving the gather
    re-partitions them, so no rank ever holds more than one module's full parameters. A parameter tied to one
    loaded before (tied embeddings) is skipped; a parameter the checkpoint lacks is an error."""
    deepspeed = import_deepspeed()
    import torch.distributed as dist
    from safetensors import safe_open

    where = {}
    for f in checkpoint_files(path):
        with safe_open(str(f), framework="pt") as h:
            where.update(dict.fromkeys(h.keys(), f))
    writer = dist.get_rank() == 0
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        params = {f"{prefix}.{n}" if prefix else n: p for n, p in module.named_parameters(recurse=False)
                  if id(p) not in seen}
        seen.update(id(p) for p in params.values())
        if missing := [k for k in params if k not in where]:
            raise ValueError(f"{path}: the checkpoint has no {missing[0]!r} (and {len(missing) - 1} more)")
        if params:
            with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=0):
                if writer:
                    for key, p in params.items():
                        # one file mapping per tensor: the pages read stay resident only while it is open
                        with safe_open(str(where[key]), framework="pt") as h:
                            p.data.copy_(h.get_tensor(key))


def enable_gradient_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing of every decoder layer; no KV cache in training."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def reference_logprobs(ref_model_dir: str, batches: list[dict[str, torch.Tensor]], ds_cfg: dict[str, Any],
                       hp: UpdateHParams, device: str) -> list[torch.Tensor]:
    """log π_ref of every micro-batch ([B, L−1] each, zeros off the response), computed once before the optimizer
    steps; the reference model is freed before the policy is built, so the two never share memory. Under ZeRO-3 the
    reference is partitioned too (its own DeepSpeed engine, no optimizer)."""
    deepspeed = import_deepspeed()

    ref = load_causal_lm(ref_model_dir, hp.dtype, device, ds_cfg if zero_stage(ds_cfg) == 3 else None)
    engine = None
    if zero_stage(ds_cfg) == 3:
        engine, *_ = deepspeed.initialize(model=ref, config=reference_config(ds_cfg))
        ref = engine
    ref.eval()
    with torch.no_grad():
        out = [chunked_token_logprobs(ref, b["input_ids"], b["attention_mask"], b["mask"],
                                      temperature=hp.temperature, chunk_tokens=hp.logprob_chunk_tokens)
               for b in batches]
    if engine is not None:
        release_engine(engine)
    del ref, engine
    free_accelerator_memory()
    return out


def update_agent(*, model_dir: str, ref_model_dir: str, prev_ds_dir: str | None, samples: list[Sample],
                 out_dir: str | Path, profile: dict[str, Any], hp: UpdateHParams, pad_id: int,
                 device: str = "cpu", progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Optimizer step(s) of one agent on its routed samples; writes ``out_dir/model`` (HF safetensors)
    and ``out_dir/ds`` (DeepSpeed checkpoint with optimizer state). Returns metrics. ``progress`` is told
    ``(samples trained, samples)`` after each optimizer step.

    ``hp.step_batch=None``: one step on all samples (π_old = the policy before the step). Otherwise the samples,
    in a seeded order, form ⌊n/step_batch⌋ near-equal batches and each takes one step; π_old is the policy
    before the first step for all of them (PPO-style), so later steps' ratios see how far the policy moved.
    Every step uses the lr :func:`update_lr` of this update. π_ref is computed first (:func:`reference_logprobs`),
    then the policy is built (partitioned under ZeRO-3) with :func:`build_optimizer`.

    Under torchrun (:mod:`mars2.train.launch`) every rank calls this with all samples and trains on its shard of
    each step (:func:`rank_micro_batches`); DeepSpeed all-reduces the gradients, metrics are summed over ranks, and
    rank 0 writes ``model/`` while every rank writes its part of ``ds/``.

    Under ``torch.profiler`` the phases are named regions: ``mars2.reference_logprobs``, then per micro-batch
    ``mars2.policy_logprobs``, ``mars2.backward`` and ``mars2.optimizer_step``.
    """
    select_accelerator()
    import torch.distributed as dist

    rank, world = init_distributed(hp.collective_timeout_s)
    device = rank_device(device, world)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    torch.manual_seed(hp.seed)
    plan = plan_steps(samples, hp, world, rank, pad_id, device)
    ds_cfg = deepspeed_config(profile, micro_batch=hp.micro_batch, grad_accum=plan.n_micro, grad_clip=hp.grad_clip)
    with record_function("mars2.reference_logprobs"):
        ref_logps = reference_logprobs(ref_model_dir, plan.batches, ds_cfg, hp, device)
    engine, optimizer, lr, step = policy_engine(model_dir, prev_ds_dir, profile, ds_cfg, hp, device)
    start = time.perf_counter()
    totals, grad_norm = optimizer_steps(engine, plan, ref_logps, hp, world, progress)
    seconds = time.perf_counter() - start
    engine.save_checkpoint(str(Path(out_dir) / "ds"), tag="ckpt",
                           client_state={"update_step": step + len(plan.steps), "torch_rng": torch.get_rng_state()})
    _save_hf(engine, Path(out_dir) / "model", profile, rank)
    if world > 1:
        dist.barrier()
    release_engine(engine)
    del engine, optimizer
    free_accelerator_memory()
    return update_metrics(totals, plan, grad_norm=grad_norm, lr=lr, step=step, world=world, seconds=seconds)


@dataclass
class StepPlan:
    """The update's samples cut into optimizer steps (``groups``: sample indices per step), this rank's micro-batches
    of each step (``steps``: per step, per micro-batch, sample indices) and their packed tensors (``batches``, in
    step then micro-batch order); ``n_micro`` micro-batches per step on every rank."""

    samples: list[Sample]
    groups: list[list[int]]
    steps: list[list[list[int]]]
    batches: list[dict[str, torch.Tensor]]
    lengths: list[int]
    n_micro: int


def plan_steps(samples: list[Sample], hp: UpdateHParams, world: int, rank: int, pad_id: int, device: str) -> StepPlan:
    """Trainable samples → ``hp.step_batch`` steps (:func:`step_groups`) → this rank's micro-batches of each
    (:func:`rank_micro_batches`, by ``hp.micro_batch`` samples or ``hp.micro_batch_tokens`` padded tokens)."""
    samples = trainable_samples(samples)
    groups = step_groups(len(samples), hp.step_batch, hp.seed)
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    steps = rank_micro_batches(groups, hp.micro_batch, world, rank, lengths=lengths,
                               micro_batch_tokens=hp.micro_batch_tokens)
    batches = [pack_batch([samples[i] for i in idx], pad_id, device) for micro in steps for idx in micro]
    return StepPlan(samples, groups, steps, batches, lengths, len(steps[0]))


def policy_engine(model_dir: str, prev_ds_dir: str | None, profile: dict[str, Any], ds_cfg: dict[str, Any],
                  hp: UpdateHParams, device: str):
    """The policy's DeepSpeed engine (partitioned under ZeRO-3) with :func:`build_optimizer` at this update's lr
    (:func:`update_lr`), resumed from the previous update's ``ds/`` when there is one (optimizer state, torch RNG,
    the update step). Returns (engine, optimizer, lr, update step reached so far)."""
    deepspeed = import_deepspeed()

    model = load_causal_lm(model_dir, hp.dtype, device, ds_cfg)
    if profile.get("gradient_checkpointing"):
        enable_gradient_checkpointing(model)
    lr = update_lr(hp)
    optimizer = build_optimizer(model.parameters(), profile, lr=lr, betas=hp.betas, weight_decay=hp.weight_decay)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_cfg)
    step = 0
    if prev_ds_dir is not None:
        _, client = engine.load_checkpoint(prev_ds_dir, tag="ckpt", load_lr_scheduler_states=False)
        step = int((client or {}).get("update_step", 0))
        if client and "torch_rng" in client:
            torch.set_rng_state(client["torch_rng"])
    for group in optimizer.param_groups:  # the checkpoint brought back the previous update's lr
        group["lr"] = lr
    engine.train()
    return engine, optimizer, lr, step


SUMMED, WEIGHTED = ("loss", "pg_loss", "kl"), ("clip_frac", "tis_vetoed")  # per step / per sample in the totals


def optimizer_steps(engine, plan: StepPlan, ref_logps: list[torch.Tensor], hp: UpdateHParams, world: int,
                    progress: Callable[[int, int], None] | None) -> tuple[torch.Tensor, float | None]:
    """Every step of ``plan``: the loss ``LOSSES[hp.loss]`` of each micro-batch, backward, and DeepSpeed's step at
    the step's last micro-batch. π_old is the policy before the first step (scored up front when there are several
    steps). Returns the totals (:data:`SUMMED` summed over micro-batches, :data:`WEIGHTED` weighted by samples, then
    the tokens trained and the empty log-prob chunks of a pass, :func:`empty_chunks`), summed over ranks, and the last
    step's gradient norm."""
    samples, steps, batches, n_micro = plan.samples, plan.steps, plan.batches, plan.n_micro

    def logprobs(batch):
        with record_function("mars2.policy_logprobs"):
            return chunked_token_logprobs(engine, batch["input_ids"], batch["attention_mask"], batch["mask"],
                                          temperature=hp.temperature, chunk_tokens=hp.logprob_chunk_tokens)

    old_logps = None
    if len(steps) > 1:
        with torch.no_grad():
            old_logps = [logprobs(b) for b in batches]
    totals = torch.zeros(len(SUMMED) + len(WEIGHTED), dtype=torch.float64)
    grad_norm = None
    k = trained = 0
    for micro, group in zip(steps, plan.groups, strict=True):
        # every micro-batch's means are taken over the whole step's sequences and response tokens (all ranks): the
        # micro-batch losses then add up to the step's loss, so the gradient does not depend on the split
        n_seqs, n_tokens = len(group), sum(len(samples[i].response_ids) for i in group)
        for i, idx in enumerate(micro):
            batch = batches[k]
            logp = logprobs(batch)
            old_logp = logp.detach() if old_logps is None else old_logps[k]
            out = LOSSES[hp.loss](logp, old_logp, batch["rollout_logp"], ref_logps[k], batch["advantages"],
                                  batch["mask"], clip_eps=hp.clip_eps, tis_threshold=hp.tis_threshold,
                                  tis_veto=hp.tis_veto, kl_coef=hp.kl_coef, n_seqs=n_seqs, n_tokens=n_tokens)
            with record_function("mars2.backward"):
                engine.backward(out.loss * (n_micro * world))  # DeepSpeed divides by the accumulation count and ranks
            full_norm = _full_grad_norm(engine) if i == n_micro - 1 else None
            with record_function("mars2.optimizer_step"):
                engine.step()
            if i == n_micro - 1:  # under ZeRO-2/3 DeepSpeed computes the norm during the boundary step
                grad_norm = full_norm if full_norm is not None else _engine_grad_norm(engine)
            totals += torch.tensor([out.loss.item(), out.pg_loss, out.kl,
                                    out.clip_frac * len(idx), out.tis_vetoed * len(idx)], dtype=torch.float64)
            k += 1
        trained += len(group)
        if progress is not None:
            progress(trained, len(samples))
    tokens = float(sum(plan.lengths[i] for micro in steps for idx in micro for i in idx))
    empty = float(empty_chunks(batches, hp.logprob_chunk_tokens, engine.device))
    return _sum_over_ranks(torch.cat([totals, torch.tensor([tokens, empty], dtype=torch.float64)]), engine.device,
                           world), grad_norm


def empty_chunks(batches: list[dict[str, torch.Tensor]], chunk_tokens: int, device) -> int:
    """Head calls on empty log-prob chunks this rank makes in one pass over its micro-batches:
    Σ_k (max over ranks of ⌈n_k / C⌉) − ⌈n_k / C⌉, n_k the response positions of micro-batch k (:func:`chunk_count`).
    Non-zero exactly when the ranks' responses need different numbers of chunks; a collective when several ranks run."""
    own = torch.tensor([-(-int(b["mask"].sum()) // chunk_tokens) for b in batches], dtype=torch.long, device=device)
    most = own.clone()
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return int((most - own).sum())


def update_metrics(totals: torch.Tensor, plan: StepPlan, *, grad_norm: float | None, lr: float, step: int,
                   world: int, seconds: float) -> dict[str, float]:
    """The update's metrics: loss terms averaged over steps, clip and veto shares over samples, throughput, and the
    head calls on empty log-prob chunks one pass made over all ranks (``logprob_empty_chunks``)."""
    n_steps = len(plan.steps)
    means = {key: float(totals[j]) / n_steps for j, key in enumerate(SUMMED)}
    means |= {key: float(totals[len(SUMMED) + j]) / len(plan.samples) for j, key in enumerate(WEIGHTED)}
    extra = {} if grad_norm is None else {"grad_norm": grad_norm}
    return {**means, **extra, "lr": float(lr), "n_samples": float(len(plan.samples)),
            "update_step": float(step + n_steps), "optimizer_steps": float(n_steps), "processes": float(world),
            "micro_batches": float(plan.n_micro), "cpu_threads": float(torch.get_num_threads()),
            "tokens_per_s": float(totals[-2]) / max(seconds, 1e-9), "step_seconds": seconds,
            "logprob_empty_chunks": float(totals[-1])}


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


def rank_micro_batches(groups: list[list[int]], micro_batch: int, world: int = 1, rank: int = 0, *,
                       lengths: list[int] | None = None,
                       micro_batch_tokens: int | None = None) -> list[list[list[int]]]:
    """This rank's micro-batches of each step. Every step on every rank has the same number of micro-batches
    (DeepSpeed's gradient-accumulation count is fixed per engine, and ranks step together) and none is empty, so
    every step needs at least ``world`` samples.

    ``micro_batch_tokens=None``: step s's samples are cut into ``world`` near-equal contiguous shards and shard
    ``rank`` into micro-batches of at most ``micro_batch`` samples. Otherwise see :func:`token_budget_micro_batches`
    (``lengths[i]`` = tokens of sample i).
    """
    if min(len(g) for g in groups) < world:
        raise ValueError(f"an optimizer step has {min(len(g) for g in groups)} samples for {world} processes; "
                         "use fewer processes or a larger step_batch")
    if micro_batch_tokens is not None:
        if lengths is None:
            raise ValueError("micro_batch_tokens needs the samples' lengths")
        return token_budget_micro_batches(groups, lengths, micro_batch_tokens, world, rank)
    shards = [[g[r * len(g) // world : (r + 1) * len(g) // world] for r in range(world)] for g in groups]
    sizes = [len(s) for per_step in shards for s in per_step]
    n_micro = min(math.ceil(max(sizes) / micro_batch), min(sizes))
    return [[s[j * len(s) // n_micro : (j + 1) * len(s) // n_micro] for j in range(n_micro)]
            for s in (per_step[rank] for per_step in shards)]


def padded_tokens(idx: list[int], lengths: list[int]) -> int:
    """Tokens of a right-padded micro-batch: |idx| · max length."""
    return len(idx) * max(lengths[i] for i in idx)


def _cut_by_budget(shard: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Greedy contiguous cut of a longest-first shard: each part grows while |part| · (its first length) ≤ budget
    (a sample longer than the budget goes alone). Fewest parts of any contiguous cut under that budget."""
    parts: list[list[int]] = []
    for i in shard:
        if parts and (len(parts[-1]) + 1) * lengths[parts[-1][0]] <= budget:
            parts[-1].append(i)
        else:
            parts.append([i])
    return parts


def cut_into(shard: list[int], lengths: list[int], n: int) -> list[list[int]]:
    """A longest-first shard cut into exactly n (≤ |shard|) contiguous non-empty micro-batches with the smallest
    largest padded size: the least budget whose greedy cut has ≤ n parts (bisection), then the largest parts
    halved until there are n."""
    lo, hi = max(lengths[i] for i in shard), padded_tokens(shard, lengths)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(_cut_by_budget(shard, lengths, mid)) <= n else (mid + 1, hi)
    parts = _cut_by_budget(shard, lengths, lo)
    while len(parts) < n:
        j = max((j for j, p in enumerate(parts) if len(p) > 1), key=lambda j: padded_tokens(parts[j], lengths))
        parts[j : j + 1] = [parts[j][: len(parts[j]) // 2], parts[j][len(parts[j]) // 2 :]]
    return parts


def token_budget_micro_batches(groups: list[list[int]], lengths: list[int], micro_batch_tokens: int, world: int,
                               rank: int) -> list[list[list[int]]]:
    """This rank's length-bucketed micro-batches of each step under a padded-token budget.

    Step s's samples, longest first, are dealt round-robin to the ranks (so ranks get similar lengths); the
    accumulation count n = the most micro-batches any shard needs to keep |micro| · max length ≤
    ``micro_batch_tokens`` (:func:`_cut_by_budget`), capped at the smallest shard so none is empty; every shard is
    then cut into exactly n micro-batches of neighbouring lengths (:func:`cut_into`). Only when the cap binds can a
    micro-batch exceed the budget (as can a single sample longer than it).
    """
    if micro_batch_tokens < 1:
        raise ValueError(f"micro_batch_tokens={micro_batch_tokens} must be >= 1")
    shards = [[sorted(g, key=lambda i: (-lengths[i], i))[r::world] for r in range(world)] for g in groups]
    flat = [s for per_step in shards for s in per_step]
    n_micro = min(max(len(_cut_by_budget(s, lengths, micro_batch_tokens)) for s in flat), min(len(s) for s in flat))
    return [cut_into(per_step[rank], lengths, n_micro) for per_step in shards]


def step_batches(n: int, step_batch: int | None, micro_batch: int, seed: int) -> list[list[list[int]]]:
    """Sample indices per optimizer step, per micro-batch, in one process (see :func:`rank_micro_batches`)."""
    return rank_micro_batches(step_groups(n, step_batch, seed), micro_batch)


def _full_grad_norm(engine) -> float | None:
    """L2 norm of the accumulated gradient before clipping, when the full gradients exist (no ZeRO partitioning)."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return None
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


def _engine_grad_norm(engine) -> float | None:
    """DeepSpeed's global gradient norm (before clipping) of the step it has just taken (ZeRO-2/3)."""
    norm = engine.get_global_grad_norm()
    return None if norm is None else float(norm)


def trainable_samples(samples: list[Sample]) -> list[Sample]:
    """The samples with at least one response token: an empty response has no token to score (its log-probs would not
    touch the graph, and a micro-batch of only such samples would have nothing to backpropagate)."""
    kept = [s for s in samples if s.response_ids]
    if not kept:
        raise ValueError(f"none of the {len(samples)} samples has a response token: nothing to train on")
    return kept


def _save_hf(engine, path: Path, profile: dict[str, Any], rank: int) -> None:
    """HF safetensors of the updated model, written by rank 0 (ZeRO-3 gathers the shards from every rank first)."""
    state = engine._zero3_consolidated_16bit_state_dict() if zero_stage(profile) == 3 else None
    if rank == 0:
        engine.module.save_pretrained(str(path), state_dict=state, safe_serialization=True)
