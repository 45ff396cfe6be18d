"""Small helpers shared by the stages that load an agent's current weights."""

from __future__ import annotations

import os

from mars2.config import AgentConfig
from tasks.stage import StageRecord


def owner_of(member: AgentConfig) -> str:
    """The agent whose weights ``member`` uses (itself, or the owner in homogeneous multi-role)."""
    return member.shares_weights_with or member.name


def model_dir(record: StageRecord, owner: str) -> str:
    """The weights folder of ``owner`` in an agents or update record."""
    return record.resolve(record.meta["model_dirs"][owner])


def tokenizer_dir(agents: StageRecord, owner: str) -> str:
    return agents.resolve(agents.meta["tokenizer_dirs"][owner])


def load_backend(member: AgentConfig, weights: dict[str, StageRecord], agents: StageRecord, *, batch_size: int,
                 progress: bool = True):
    """(backend, tokenizer) for an agent, on the device its config names."""
    owner = owner_of(member)
    if member.backend == "vllm":
        from transformers import AutoTokenizer

        from mars2.backends.vllm_backend import VLLMBackend, VLLMEngineArgs

        engine = VLLMEngineArgs(model=model_dir(weights[owner], owner), tensor_parallel_size=max(1, member.gpus),
                                dtype=member.dtype)
        tok = AutoTokenizer.from_pretrained(tokenizer_dir(agents, owner), local_files_only=True)
        return VLLMBackend(engine, python=os.environ.get("MARS2_VLLM_PYTHON", "python")), tok
    from mars2.backends.transformers_backend import load_transformers_backend

    return load_transformers_backend(model_dir(weights[owner], owner), tokenizer_dir(agents, owner), device=member.device,
                                     dtype=member.dtype, batch_size=batch_size, progress=progress)
