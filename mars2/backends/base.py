"""The generation interface every backend implements: a batch of prompts in, sampled responses out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy decoding."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0


@dataclass(frozen=True)
class Generation:
    """One sampled response.

    ``logprobs[t]`` is log π_rollout(response_ids[t] | prompt, response_ids[:t]) under the sampling
    distribution actually used (temperature applied); ``len(logprobs) == len(response_ids)``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS) | "length" (max_new_tokens reached)


class GenerationBackend(Protocol):
    """A batch of prompts in, generations with token ids and sampled-token log-probs out.

    A backend that generates on the host's CPU sets ``uses_host_cpu = True``; the tree search then grades in turn
    with generation instead of beside it (the sandbox pool needs the same cores).
    """

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        """For each prompt (already chat-formatted text), ``params.n`` generations."""
        ...
