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
    model: str
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_model_len: int = 32768
    dtype: str = "bfloat16"
    seed: int = 0


def build_request(prompts: list[str], params: SamplingParams, engine: VLLMEngineArgs) -> dict[str, Any]:
    """The JSON request the worker reads: engine arguments, sampling parameters, prompts."""
    return {
        "engine": asdict(engine),
        "sampling": {
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

    def __init__(self, engine: VLLMEngineArgs, *, python: str = "python", timeout_s: float = 6 * 3600):
        self.engine = engine
        self.python = python
        self.timeout_s = timeout_s

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        with tempfile.TemporaryDirectory(prefix="mars2-vllm-") as tmp:
            req, resp = Path(tmp) / "request.json", Path(tmp) / "response.jsonl"
            req.write_text(json.dumps(build_request(prompts, params, self.engine)))
            done = subprocess.run([self.python, "-m", "mars2.backends.vllm_worker", str(req), str(resp)],
                                  capture_output=True, text=True, timeout=self.timeout_s)
            if done.returncode != 0:
                raise RuntimeError(f"vLLM worker failed (exit {done.returncode}) with {self.python}: "
                                   f"{done.stderr.strip()[-2000:]}")
            lines = resp.read_text().splitlines()
        if len(lines) != len(prompts):
            raise RuntimeError(f"vLLM worker answered {len(lines)} of {len(prompts)} prompts")
        return [parse_response_line(line) for line in lines]
