"""vLLM generation for GPU workers, across a process boundary.

vLLM pins its own torch/transformers/fastapi and cannot share an environment with Prefect 3.8, so the
rollout task never imports it. :class:`VLLMBackend` writes a JSON request file, runs
``<vllm python> -m mars2.backends.vllm_worker request.json response.jsonl`` in the GPU worker's own
environment, and reads one JSON line per prompt back. Each call starts the engine from the agent's
current checkpoint folder, so the weights of the last update are always the ones sampled from (weight
reload = a new worker on the new folder). Log-probs are vLLM's *processed* log-probs of the sampled tokens
(after temperature/top-p), which truncated importance sampling compares against the trainer's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mars2.backends.base import Generation, SamplingParams


@dataclass(frozen=True)
class VLLMEngineArgs:
    """Keyword arguments of ``vllm.LLM`` (names as vLLM's ``EngineArgs``); ``data_parallel_size`` > 1 runs that many
    engine replicas of ``tensor_parallel_size`` GPUs each."""

    model: str
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_model_len: int = 32768
    enforce_eager: bool = False
    enable_prefix_caching: bool = False
    dtype: str = "bfloat16"
    seed: int = 0


def vllm_engine_args(model_dir: str, member, backend) -> VLLMEngineArgs:
    """An agent's engine from the ``backend`` group (:class:`mars2.config.BackendConfig`): TP size, replicas (default:
    the agent's GPUs // TP), memory share, context length, eager mode, prefix caching; dtype from the agent."""
    replicas = backend.data_parallel_size or max(1, max(1, member.gpus) // backend.tensor_parallel_size)
    return VLLMEngineArgs(model=model_dir, tensor_parallel_size=backend.tensor_parallel_size,
                          data_parallel_size=replicas, gpu_memory_utilization=backend.gpu_memory_utilization,
                          max_model_len=backend.max_model_len, enforce_eager=backend.enforce_eager,
                          enable_prefix_caching=backend.enable_prefix_caching, dtype=member.dtype)


def build_request(prompts: list[str], params: SamplingParams, engine: VLLMEngineArgs,
                  stop_token_ids: list[int] | None = None) -> dict[str, Any]:
    """The JSON request the worker reads: engine arguments, sampling parameters, prompts.

    ``stop_token_ids``: every end token the model's generation config lists (vLLM would otherwise stop at the
    tokenizer's EOS only when the model folder's generation config is not read)."""
    stops = {"stop_token_ids": list(stop_token_ids)} if stop_token_ids else {}
    return {
        "engine": asdict(engine),
        "sampling": {
            **stops,
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p if params.temperature > 0 else 1.0,
            "max_tokens": params.max_new_tokens,
            "seed": params.seed,
            "logprobs": 0,  # the sampled token's log-prob only
        },
        "prompts": prompts,
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
                 stop_token_ids: list[int] | None = None):
        self.engine = engine
        self.python = python
        self.timeout_s = timeout_s
        self.stop_token_ids = stop_token_ids

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        with tempfile.TemporaryDirectory(prefix="mars2-vllm-") as tmp:
            req, resp = Path(tmp) / "request.json", Path(tmp) / "response.jsonl"
            req.write_text(json.dumps(build_request(prompts, params, self.engine, self.stop_token_ids)))
            done = subprocess.run([self.python, "-m", "mars2.backends.vllm_worker", str(req), str(resp)],
                                  capture_output=True, text=True, timeout=self.timeout_s)
            if done.returncode != 0:
                raise RuntimeError(f"vLLM worker failed (exit {done.returncode}) with {self.python}: "
                                   f"{done.stderr.strip()[-2000:]}")
            lines = resp.read_text().splitlines()
        if len(lines) != len(prompts):
            raise RuntimeError(f"vLLM worker answered {len(lines)} of {len(prompts)} prompts")
        return [parse_response_line(line) for line in lines]
