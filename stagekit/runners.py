"""The weights stages hand each other (:class:`AgentWeights` per weight owner) and the helpers that load them."""

from __future__ import annotations

import dataclasses
import os


from mars2.backends.base import visible_devices
from mars2.backends.engine import EngineClient
from mars2.config import AgentConfig, BackendConfig, check_machine
from stagekit.engines import EnginePool
from stagekit.stage import AgentWeights, StageContext, StageRecord

# an agent's fields that say how it trains, not how it generates: a stage that only generates does not read them
TRAINING_FIELDS = ("optimizer", "bootstrap", "deepspeed", "update_procs")
GENERATION_FIELDS = tuple(f.name for f in dataclasses.fields(AgentConfig) if f.name not in TRAINING_FIELDS)


def model_dir(record: StageRecord, owner: str) -> str:
    """The model folder of ``owner`` in an agents, bootstrap, checkpoints or update record."""
    return record.weights_of(owner).model_dir


def tokenizer_dir(record: StageRecord, owner: str) -> str:
    return record.weights_of(owner).tokenizer_dir


def engine_placement(member: AgentConfig, *, remote: bool = False) -> tuple[str, str | None]:
    """(device, ``CUDA_VISIBLE_DEVICES``) of ``member``'s engine process. Placed by the plan (``gpu_ids``): a vLLM
    engine sees all the agent's GPUs, a transformers engine the first, as ``cuda`` (index 0 up) inside; unplaced: the
    member's device, this process's GPUs. The indices go through this worker's ``CUDA_VISIBLE_DEVICES``, except for
    an engine on another node (``remote``): its node maps them through its own (``pipeline.dispatch.serve_engine``)."""
    if not member.gpu_ids:
        return member.device, None
    ids = list(member.gpu_ids) if member.backend == "vllm" else list(member.gpu_ids[:1])
    return "cuda", visible_devices(ids, None if remote else os.environ.get("CUDA_VISIBLE_DEVICES"))


def in_process_device(member: AgentConfig) -> str:
    """The device of ``member``'s model loaded in this process (a rollout without engines, a one-process update): its
    first placed GPU, else its device."""
    return f"cuda:{member.gpu_ids[0]}" if member.gpu_ids else member.device


def load_backend(member: AgentConfig, weight_records: dict[str, StageRecord], agents: StageRecord, *, batch_size: int,
                 backend: BackendConfig | None = None, threads: int = 0, pool: EnginePool | None = None,
                 gpu_memory_gb: float | None = None):
    """(generation backend, tokenizer) for an agent, on the device its config names, with the weights of its owner in
    ``weight_records[owner]`` (each owner's latest record that hands on weights); ``backend``: the engine
    settings (vLLM's, and whether the run's engine pool serves it); ``threads``: torch threads of a CPU engine
    process (0: torch's default); ``pool``: the run's engines (None: a fresh backend, not counted).

    Checks this worker first (model folder, CUDA, GPUs of the plan's ``gpu_memory_gb``) for an engine of its own: in
    ``orchestration=pools`` the flow's machine did not."""
    owner = member.owner
    if pool is None or owner not in pool.remote:  # an engine on another node: that node's engine start checks it
        check_machine([member], stage="rollout/evaluation", gpu_memory_gb=gpu_memory_gb)
    generator, tok = _load_backend(member, owner, weight_records, agents, batch_size=batch_size, backend=backend,
                                   pool=pool, threads=threads)
    if pool is not None and not isinstance(generator, EngineClient):
        pool.count(generator, owner)
    return generator, tok


def _load_backend(member: AgentConfig, owner: str, weight_records: dict[str, StageRecord], agents: StageRecord, *,
                  batch_size: int, backend: BackendConfig | None, pool: EnginePool | None,
                  threads: int):
    device, visible = engine_placement(member, remote=pool is not None and owner in pool.remote)
    if member.backend == "vllm":
        from transformers import AutoTokenizer

        from mars2.backends.base import end_token_ids, generation_config_eos
        from mars2.backends.vllm_backend import VLLMBackend, vllm_engine_args
        from mars2.backends.vllm_env import find_python

        python = find_python() or "python"  # $MARS2_VLLM_PYTHON, or the CPU build's cached environment

        folder = model_dir(weight_records[owner], owner)
        tok = AutoTokenizer.from_pretrained(tokenizer_dir(agents, owner), local_files_only=True)
        args = vllm_engine_args(folder, member, backend or BackendConfig())
        stops = end_token_ids(generation_config_eos(folder), tok.eos_token_id)
        if pool is not None and pool.persistent:  # one AsyncLLM for the run, new weights reloaded in place
            from dataclasses import asdict

            return pool.engine(owner, folder, tokenizer_dir(agents, owner), version=folder, device=device,
                               dtype=member.dtype, batch_size=batch_size, threads=threads, kind="vllm",
                               python=python, vllm=asdict(args), stop_token_ids=tuple(stops),
                               cuda_visible_devices=visible), tok
        return VLLMBackend(args, python=python, stop_token_ids=stops, visible=visible), tok
    if pool is not None and pool.persistent:  # the owner's engine for the whole run, these weights loaded in place
        from transformers import AutoTokenizer

        folder = model_dir(weight_records[owner], owner)
        tok = AutoTokenizer.from_pretrained(tokenizer_dir(agents, owner), local_files_only=True)
        return pool.engine(owner, folder, tokenizer_dir(agents, owner), version=folder, device=device,
                           dtype=member.dtype, batch_size=batch_size, threads=threads,
                           cuda_visible_devices=visible), tok
    from mars2.backends.transformers_backend import load_transformers_backend

    return load_transformers_backend(model_dir(weight_records[owner], owner), tokenizer_dir(agents, owner),
                                     device=in_process_device(member),
                                     dtype=member.dtype, batch_size=batch_size)


def agent_runners(members: list[AgentConfig], weight_records: dict[str, StageRecord], agents: StageRecord, *,
                  batch_size: int, backend: BackendConfig | None = None, ctx: StageContext | None = None) -> dict:
    """Each agent's backend (one per set of weights, shared by its roles), tokenizer, role prompt and chat switches.

    The owners' engines come from ``ctx.engines``, the run's pool (no ``ctx`` or no pool: fresh backends). The CPU
    engines of the owners on this node generate side by side: each gets its share of the run's CPU budget (``ctx``'s;
    without one, this machine's usable cores) as threads (:func:`mars2.cpu.split_cpus`); an owner's engine on another
    node is sized there (:func:`pipeline.dispatch.serve_engine`)."""
    from mars2.search.scheduler import AgentRunner

    loaded: dict[str, tuple] = {}
    runners = {}
    ctx = ctx or StageContext(root="")
    remote = getattr(ctx.engines, "remote", {})
    cpu_owners = {m.owner for m in members if m.device.startswith("cpu") and m.owner not in remote}
    threads = ctx.cpu_shares(engines=len(cpu_owners)).engine
    for m in members:
        owner = m.owner
        if owner not in loaded:
            loaded[owner] = load_backend(next(x for x in members if x.name == owner), weight_records, agents,
                                         batch_size=batch_size, backend=backend, pool=ctx.engines,
                                         threads=threads if m.device.startswith("cpu") else 0,
                                         gpu_memory_gb=ctx.gpu_memory_gb)
        generator, tok = loaded[owner]
        runners[m.name] = AgentRunner(backend=generator, tokenizer=tok, role_prompt=m.role_prompt,
                                      chat_kwargs=dict(m.chat_template_kwargs))
    return runners


__all__ = ["AgentWeights", "agent_runners", "engine_placement", "in_process_device", "load_backend", "model_dir",
           "tokenizer_dir"]
