"""Memory arithmetic of the planner (docs/plan.md).

Exact or DeepSpeed's own:
- ZeRO-2 / ZeRO-3 model states (parameters, gradients, optimizer states) per GPU and host memory per node:
  DeepSpeed's estimators ``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
  (the functions behind the ``*_all_cold`` printers, which print both offload variants instead of returning one).
- ZeRO-0 (and ZeRO-1) model states: the plain mixed-precision Adam formula (DeepSpeed has no estimator).
- KV cache bytes per token, weights bytes: exact from the config.

Estimates (documented as such): activations during the update, the per-GPU reserve.
All byte counts are ints; ``GB`` = 2**30 bytes, as DeepSpeed's estimators print them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mars2.shims.deepspeed_import import import_deepspeed

GB = 2**30
ADAM_MIXED_PRECISION_BYTES = 16  # 2 (16-bit params) + 2 (16-bit grads) + 4 (fp32 master) + 8 (Adam m, v)


@dataclass(frozen=True)
class ModelStates:
    """Parameters + gradients + optimizer states of one agent's training engine."""

    gpu_bytes: int  # per GPU
    cpu_bytes: int  # per node (host memory), as DeepSpeed's estimators report it
    source: str  # "deepspeed.estimate_zero3_model_states_mem_needs(...)" or "formula: ..."


def zero_model_states(stage: int, params: int, largest_layer: int, *, gpus_per_node: int, nodes: int = 1,
                      offload_optimizer: bool = False, offload_param: bool = False, zero_init: bool = True,
                      buffer_factor: float = 1.5) -> ModelStates:
    """Model-state memory of one engine with ``gpus_per_node × nodes`` data-parallel ranks.

    ``gpus_per_node`` is this engine's ranks per node (not the node's size). ZeRO-2/3 call DeepSpeed's own
    estimators; ZeRO-0 is ``16 · params`` on every GPU (each rank also loads an fp32 copy on the host);
    ZeRO-1 shards only the optimizer (``4 · params + 12 · params / ranks``).
    """
    total = gpus_per_node * nodes
    if stage == 2 or (stage == 1 and offload_optimizer):
        import_deepspeed()
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        cpu, gpu = estimate_zero2_model_states_mem_needs(
            total_params=params, num_gpus_per_node=gpus_per_node, num_nodes=nodes, cpu_offload=offload_optimizer,
            additional_buffer_factor=buffer_factor)
        return ModelStates(int(gpu), int(cpu), f"deepspeed estimate_zero2_model_states_mem_needs"
                                               f"(cpu_offload={offload_optimizer})")
    if stage == 3:
        import_deepspeed()
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            total_params=params, largest_layer_params=largest_layer, num_gpus_per_node=gpus_per_node,
            num_nodes=nodes, cpu_offload=offload_optimizer, cpu_offload_params=offload_param, zero_init=zero_init,
            additional_buffer_factor=buffer_factor)
        return ModelStates(int(gpu), int(cpu), f"deepspeed estimate_zero3_model_states_mem_needs(cpu_offload="
                                               f"{offload_optimizer}, cpu_offload_params={offload_param}, "
                                               f"zero_init={zero_init})")
    host = int(params * 4 * gpus_per_node * buffer_factor)  # every rank loads an fp32 copy first
    if stage == 1:
        return ModelStates(4 * params + (12 * params) // total, host, "formula: 4·P + 12·P/ranks (ZeRO-1)")
    if stage == 0:
        return ModelStates(ADAM_MIXED_PRECISION_BYTES * params, host, "formula: 16·P (ZeRO-0, Adam)")
    raise ValueError(f"ZeRO stage {stage} is unknown (0, 1, 2, 3)")


ZERO_OPTIONS = (  # (label, stage, offload_optimizer, offload_param) compared side by side in the plan
    ("Z0", 0, False, False),
    ("Z2", 2, False, False),
    ("Z2+opt→cpu", 2, True, False),
    ("Z3", 3, False, False),
    ("Z3+opt→cpu", 3, True, False),
    ("Z3+all→cpu", 3, True, True),
)


def reference_model_bytes(params: int, dtype_bytes: int, *, ranks: int, sharded: bool) -> int:
    """Frozen reference policy (no gradients, no optimizer): sharded over the engine's ranks under ZeRO-3."""
    return -(-params * dtype_bytes // ranks) if sharded else params * dtype_bytes


def activation_bytes(*, tokens: int, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
                     head_dim: int, vocab: int, dtype_bytes: int, checkpointing: bool, logprob_chunk: int) -> int:
    """Estimated peak activation memory of one micro-batch of ``tokens`` (padded) tokens, forward + backward, on one
    GPU (an estimate, not measured).

    Per token and layer a Llama/Qwen block keeps ≈ ``4h + 2·heads·hd + 2·kv·hd + 4·I`` values (norm inputs and
    outputs, q/k/v, attention output, gate/up/act/product of the SwiGLU MLP; flash/SDPA attention keeps no
    s×s scores). With gradient checkpointing only each layer's input (``h`` values) is kept, plus one layer
    recomputed at a time. The vocabulary projection runs on ``logprob_chunk`` positions at a time under its own
    checkpoint (``mars2.train.update.chunked_token_logprobs``): ≈ 5 fp32 copies of a [chunk × V] block at its peak
    (logits, the max-shifted copy, exp, log-softmax and its gradient; measured 4–5 on CPU, docs/training.md).
    """
    per_layer = dtype_bytes * (4 * hidden + 2 * heads * head_dim + 2 * kv_heads * head_dim + 4 * intermediate)
    if checkpointing:
        body = tokens * (layers * hidden * dtype_bytes + per_layer)
    else:
        body = tokens * layers * per_layer
    logits = min(tokens, logprob_chunk) * vocab * 4 * 5
    return body + logits


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, *, tp: int = 1) -> int:
    """KV-cache bytes one token occupies: ``2 (K and V) × layers × kv_heads × head_dim × dtype bytes``.

    With tensor parallelism ``tp`` each GPU holds ``kv_heads / tp`` heads (at least one: vLLM replicates KV
    heads when ``tp > kv_heads``); the result is then per GPU.
    """
    heads_here = max(1, kv_heads // tp) if tp > 1 else kv_heads
    return 2 * layers * heads_here * head_dim * dtype_bytes


@dataclass(frozen=True)
class KVBudget:
    per_gpu_bytes: int  # gpu_memory_utilization × GPU memory − weights / tp
    bytes_per_token_gpu: int  # per GPU (see kv_bytes_per_token)
    tokens: int  # tokens the cache holds (every GPU of the TP group holds its share of every token)
    seq_len: int  # prompt + max_new_tokens at the configured lengths
    max_seqs: int  # sequences of seq_len that fit at once
    needed_seqs: int  # sequences the rollout keeps in flight (search.batch_size)
    needed_bytes_per_gpu: int  # needed_seqs × seq_len × bytes_per_token_gpu


def vllm_kv_budget(*, weights_bytes: int, gpu_bytes: int, utilization: float, tp: int, layers: int, kv_heads: int,
                   head_dim: int, dtype_bytes: int, seq_len: int, concurrent: int) -> KVBudget:
    """vLLM's KV-cache budget per GPU (``utilization × GPU − weights/tp``; vLLM also subtracts its profiled
    activation peak, so the real budget is somewhat smaller) and what it holds at the configured lengths."""
    budget = int(utilization * gpu_bytes - weights_bytes / tp)
    per_token = kv_bytes_per_token(layers, kv_heads, head_dim, dtype_bytes, tp=tp)
    tokens = max(0, budget) // per_token
    return KVBudget(per_gpu_bytes=budget, bytes_per_token_gpu=per_token, tokens=tokens, seq_len=seq_len,
                    max_seqs=tokens // seq_len, needed_seqs=concurrent,
                    needed_bytes_per_gpu=concurrent * seq_len * per_token)
