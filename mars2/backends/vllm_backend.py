"""vLLM generation for GPU workers, across a process boundary.

vLLM pins its own torch/transformers/fastapi and cannot share an environment with Prefect 3.8, so the
rollout task never imports it. :class:`VLLMBackend` writes a JSON request file, runs
``<vllm python> -m mars2.backends.vllm_worker request.json response.jsonl`` in the GPU worker's own
environment, and reads one JSON line per prompt back. Each call starts the engine from the agent's
current checkpoint folder, so the weights of the last update are always the ones sampled from (weight
reload = a new worker on the new folder). Log-probs are vLLM's *processed* log-probs of the sampled tokens, which
truncated importance sampling compares against the trainer's: after temperature and top-p, renormalised over the
nucleus the token was drawn from, by both of vLLM 0.32's model runners (V1, which its CPU build runs, and V2, its
default on CUDA), as by :func:`mars2.backends.sampler.next_tokens`.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mars2.backends.base import Generation, SamplingParams, prompt_seeds, visible_devices
from mars2.backends.vllm_env import engine_environment


@dataclass(frozen=True)
class VLLMEngineArgs:
    """Keyword arguments of ``vllm.LLM`` (names as vLLM's ``EngineArgs``), but ``data_parallel_size``: the number of
    engine replicas of ``tensor_parallel_size`` GPUs each. Offline ``vllm.LLM`` runs one engine per process, so
    :class:`VLLMBackend` starts one worker per replica on its own GPUs (``CUDA_VISIBLE_DEVICES``) and splits the
    prompts between them; ``data_parallel_size`` never reaches ``vllm.LLM``."""

    model: str
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_model_len: int = 32768
    enforce_eager: bool = False
    enable_prefix_caching: bool = False
    dtype: str = "bfloat16"
    seed: int = 0


def engine_tp(member, backend) -> int:
    """An agent's tensor-parallel size: the config's (:func:`mars2.config.fixed_tp`: the plan's, set at the flow's
    entry), else 1 (an unplanned agent: on the CPU, or a model only the workers have)."""
    from mars2.config import fixed_tp

    return fixed_tp(member, backend) or 1


def vllm_engine_args(model_dir: str, member, backend) -> VLLMEngineArgs:
    """An agent's engine from the ``backend`` group (:class:`mars2.config.BackendConfig`): TP size
    (:func:`engine_tp`), replicas (default: the agent's GPUs // TP), memory share, context length, eager mode, prefix
    caching; dtype from the agent."""
    tp = engine_tp(member, backend)
    replicas = backend.data_parallel_size or max(1, max(1, member.gpus) // tp)
    return VLLMEngineArgs(model=model_dir, tensor_parallel_size=tp,
                          data_parallel_size=replicas, gpu_memory_utilization=backend.gpu_memory_utilization,
                          max_model_len=backend.max_model_len, enforce_eager=backend.enforce_eager,
                          enable_prefix_caching=backend.enable_prefix_caching, dtype=member.dtype)


def build_request(prompts: list[str], params: SamplingParams, engine: VLLMEngineArgs,
                  stop_token_ids: list[int] | None = None, seeds: list[int] | None = None) -> dict[str, Any]:
    """The JSON request the worker reads: engine arguments, sampling parameters, prompts and each prompt's seed
    (vLLM's per-request ``SamplingParams.seed``: its samples do not depend on the rest of the batch).

    ``stop_token_ids``: every end token the model's generation config lists (vLLM would otherwise stop at the
    tokenizer's EOS only when the model folder's generation config is not read)."""
    stops = {"stop_token_ids": list(stop_token_ids)} if stop_token_ids else {}
    engine_args = {k: v for k, v in asdict(engine).items() if k != "data_parallel_size"}
    return {
        "engine": engine_args,
        "sampling": {
            **stops,
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p if params.temperature > 0 else 1.0,
            "max_tokens": params.max_new_tokens,
            "logprobs": 0,  # the sampled token's log-prob only
        },
        "prompts": prompts,
        "seeds": list(seeds) if seeds is not None else prompt_seeds(params, len(prompts)),
    }


def generation_from_vllm(prompt_token_ids: list[int], output: Any) -> Generation:
    """Map one vLLM ``CompletionOutput`` (token_ids, logprobs: list[{token_id: Logprob}], text, finish_reason)."""
    ids = list(output.token_ids)
    if output.logprobs is None or len(output.logprobs) != len(ids):
        raise ValueError("vLLM returned no per-token log-probs: request SamplingParams(logprobs=0)")
    logprobs = [float(step[tok].logprob) for tok, step in zip(ids, output.logprobs, strict=True)]
    finish = "stop" if output.finish_reason == "stop" else "length"
    return Generation(prompt_ids=list(prompt_token_ids), response_ids=ids, logprobs=logprobs, text=output.text,
                      finish_reason=finish)


def parse_response_line(line: str) -> list[Generation]:
    """One JSON line of the worker's output (one prompt, ``n`` generations) → Generations."""
    row = json.loads(line)
    return [Generation(**g) for g in row["generations"]]


class VLLMBackend:
    """A :class:`~mars2.backends.base.GenerationBackend` that runs vLLM in another Python environment."""

    def __init__(self, engine: VLLMEngineArgs, *, python: str = "python", timeout_s: float = 6 * 3600,
                 stop_token_ids: list[int] | None = None, visible: str | None = None):
        self.engine = engine
        self.visible = visible  # the GPUs its replicas share out (the plan's placement); None: this process's
        self.python = python
        self.timeout_s = timeout_s
        self.stop_token_ids = stop_token_ids
        self.starts = 0  # engine processes started (one per replica per call): the cold starts of this backend

    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """Prompt i goes to replica i mod R (R = ``data_parallel_size``, at most one per prompt); the R workers run at
        once, each on its own ``tensor_parallel_size`` GPUs; the answers come back in prompt order."""
        replicas = max(1, min(self.engine.data_parallel_size, len(prompts)))
        devices = replica_devices(replicas, self.engine.tensor_parallel_size,
                                  self.visible or os.environ.get("CUDA_VISIBLE_DEVICES"))
        shards = [list(range(r, len(prompts), replicas)) for r in range(replicas)]
        seeds = list(seeds) if seeds is not None else prompt_seeds(params, len(prompts))
        out: list[list[Generation] | None] = [None] * len(prompts)
        with tempfile.TemporaryDirectory(prefix="mars2-vllm-") as tmp:
            workers = []
            for r, shard in enumerate(shards):
                req, resp = Path(tmp) / f"request{r}.json", Path(tmp) / f"response{r}.jsonl"
                req.write_text(json.dumps(build_request([prompts[i] for i in shard], params, self.engine,
                                                        self.stop_token_ids, [seeds[i] for i in shard])))
                env = engine_environment(self.python, {**os.environ, "CUDA_VISIBLE_DEVICES": devices[r]})
                self.starts += 1
                workers.append((shard, resp, subprocess.Popen(
                    [self.python, "-m", "mars2.backends.vllm_worker", str(req), str(resp)], env=env,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
            for r, (shard, resp, proc) in enumerate(workers):
                try:
                    _, err = proc.communicate(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    for _, _, other in workers:
                        other.kill()
                    raise
                if proc.returncode != 0:
                    raise RuntimeError(f"vLLM worker {r} (GPUs {devices[r]}) failed (exit {proc.returncode}) with "
                                       f"{self.python}: {err.strip()[-2000:]}")
                lines = resp.read_text().splitlines()
                if len(lines) != len(shard):
                    raise RuntimeError(f"vLLM worker {r} answered {len(lines)} of {len(shard)} prompts")
                for i, line in zip(shard, lines, strict=True):
                    out[i] = parse_response_line(line)
        return out  # type: ignore[return-value]


def replica_devices(replicas: int, tp: int, visible: str | None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each engine replica: consecutive groups of ``tp`` of the GPUs this process sees
    (its own ``CUDA_VISIBLE_DEVICES``, else 0, 1, ...)."""
    try:
        ids = visible_devices(list(range(replicas * tp)), visible).split(",")
    except ValueError:
        seen = sum(1 for d in (visible or "").split(",") if d.strip())
        raise ValueError(f"{replicas} vLLM engine(s) of {tp} GPU(s) need {replicas * tp} GPUs but "
                         f"CUDA_VISIBLE_DEVICES={visible!r} shows {seen}") from None
    return [",".join(ids[r * tp : (r + 1) * tp]) for r in range(replicas)]
