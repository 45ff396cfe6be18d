"""The weights stages hand each other (:class:`AgentWeights` per weight owner) and the helpers that load them."""

from __future__ import annotations

import os

from mars2.config import AgentConfig
from tasks.stage import AgentWeights, StageRecord


def owner_of(member: AgentConfig) -> str:
    """The agent whose weights ``member`` uses (itself, or the owner in homogeneous multi-role)."""
    return member.shares_weights_with or member.name


def model_dir(record: StageRecord, owner: str) -> str:
    """The model folder of ``owner`` in an agents, bootstrap, checkpoints or update record."""
    return record.weights_of(owner).model_dir


def tokenizer_dir(record: StageRecord, owner: str) -> str:
    return record.weights_of(owner).tokenizer_dir


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


__all__ = ["AgentWeights", "load_backend", "model_dir", "owner_of", "tokenizer_dir"]
