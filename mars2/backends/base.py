"""The generation interface every backend implements: a batch of prompts in, sampled responses out."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


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


SERVICE_IDLE_EXIT_S = 4 * 3600.0  # a node's engine service exits after this long with no stage connected


class CheckpointRefused(ValueError):
    """A checkpoint that does not fit an engine's model, found before any weight was copied: the engine is unchanged
    (here rather than in the engine server, which runs as ``__main__``: one class for every module that raises it)."""


class EngineDied(RuntimeError):
    """The engine can answer nothing more (vLLM's engine core exited: ``EngineDeadError``): its server ends without
    answering, and its client restarts it and sends the unanswered requests again."""


@runtime_checkable
class GenerationBackend(Protocol):
    """A batch of prompts in, generations with token ids and sampled-token log-probs out.

    Every prompt is a request with its own seed (``seeds[i]``, default :func:`prompt_seeds`): its generations depend
    on the prompt, the seed and the weights, not on which other prompts share the call or the batch.
    """

    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """For each prompt (already chat-formatted text), ``params.n`` generations."""
        ...


@runtime_checkable
class StreamingBackend(GenerationBackend, Protocol):
    """A backend that takes single requests as they come and batches whatever is in flight (continuous batching):
    the tree search sends each expansion when its tree asks for it, instead of one ``generate`` call per wave."""

    def submit(self, prompt: str, params: SamplingParams, seed: int) -> Future:
        """One request → ``Future[Generation]`` (``params.n`` is ignored: one generation)."""
        ...


@runtime_checkable
class SleepingBackend(Protocol):
    """An engine that can free its accelerator between stages; its next request wakes it."""

    def sleep(self) -> None:
        ...


@runtime_checkable
class CountedBackend(Protocol):
    """A backend that counts the engine processes (or in-process model loads) it started, for ``engine_starts``."""

    starts: int


def request_seed(seed: int, *key: object) -> int:
    """A request's sampling seed: a 63-bit digest of (run seed, key...), e.g. ``(seed, problem_id, node_index)``.

    Stable across processes and Python versions (no ``hash()``), so a node's text is reproducible from its place in
    its tree whatever the batching or timing."""
    import hashlib

    digest = hashlib.sha256(repr((int(seed), *map(str, key))).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def call_seeds(params: SamplingParams, prompts: list[str], seeds: list[int] | None) -> list[int]:
    """The seed of each prompt of a ``generate`` call: ``seeds`` (one per prompt), or :func:`prompt_seeds`."""
    seeds = list(seeds) if seeds is not None else prompt_seeds(params, len(prompts))
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    return seeds


def checkpoint_files(model_dir) -> list:
    """A model folder's safetensors files: the shards ``model.safetensors.index.json`` names when there is one, else
    every ``*.safetensors``, sorted (:class:`CheckpointRefused` when there are none)."""
    import json
    from pathlib import Path

    path = Path(model_dir)
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = [path / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointRefused(f"no *.safetensors in {model_dir}")
    return files


def prompt_seeds(params: SamplingParams, n_prompts: int) -> list[int]:
    """Seeds of a call that names none: prompt i of the call gets ``request_seed(params.seed, "prompt", i)``."""
    return [request_seed(params.seed, "prompt", i) for i in range(n_prompts)]


def end_token_ids(generation_config_eos, tokenizer_eos: int | None) -> list[int]:
    """Every token that ends a response: the model's generation config ``eos_token_id`` (an id or a list: Qwen3 lists
    ``<|im_end|>`` and ``<|endoftext|>``) and the tokenizer's EOS, in that order, without repeats."""
    ids = generation_config_eos if isinstance(generation_config_eos, (list, tuple)) else [generation_config_eos]
    out: list[int] = []
    for i in [*ids, tokenizer_eos]:
        if i is not None and int(i) not in out:
            out.append(int(i))
    return out


def generation_config_eos(model_dir: str):
    """``eos_token_id`` of ``<model_dir>/generation_config.json`` (else ``config.json``), or None."""
    import json
    from pathlib import Path

    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                return value
    return None


def cache_columns(width: int, extra: int = 1) -> int:
    """Columns the transformers engine's KV buffers get when a window of ``width`` columns needs ``extra`` more
    (``SlackLayer.reserve``): a quarter of the width spare, at least 16, so the buffers move once every many steps.
    The rollout planner sizes that engine's KV cache with it."""
    return width + max(extra, 16, width // 4)


def visible_devices(gpu_ids: list[int], parent_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` of a child process that uses GPUs ``gpu_ids`` of those its parent sees (the parent's
    own ``CUDA_VISIBLE_DEVICES``, else 0, 1, ...): GPUs [0, 1] of a parent that sees "2,3,4" are "2,3"."""
    seen = [d.strip() for d in parent_visible.split(",") if d.strip()] if parent_visible else None
    if seen is not None and max(gpu_ids, default=-1) >= len(seen):
        raise ValueError(f"GPUs {list(gpu_ids)} are placed here, but CUDA_VISIBLE_DEVICES={parent_visible!r} shows "
                         f"{len(seen)}")
    return ",".join(seen[i] if seen is not None else str(i) for i in gpu_ids)


HANDSHAKE_S = 30.0  # an engine connection's peer must have proved the key by then, or it is cut off
# TCP keepalive of an engine connection between nodes (idle s, s between probes, probes): a peer gone without closing
# (a node powered off, a cut link) is noticed within ~1 min by a side that only waits to read
KEEPALIVE = (30, 10, 3)


def keep_alive(conn) -> None:
    """Turn on TCP keepalive (:data:`KEEPALIVE`) on a connection to or from another node; a Unix socket needs none
    (its peer's end is always seen)."""
    probe = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        if probe.family == socket.AF_INET:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE, strict=True):
                if hasattr(socket, option):
                    probe.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    finally:
        probe.close()


def disconnect(conn) -> None:
    """Shut a connection down so that both sides see it closed now; its reader thread, woken by the EOF, closes it.
    Closing it here instead would free its file descriptor while the reader may be about to read it, and the next
    connection this process opens could get the same number: the old reader would then eat the new one's answers."""
    with contextlib.suppress(OSError, ValueError):
        socket.socket(fileno=os.dup(conn.fileno())).shutdown(socket.SHUT_RDWR)


def authenticate(conn, authkey: bytes, *, serving: bool, timeout_s: float = HANDSHAKE_S) -> None:
    """``multiprocessing.connection``'s key challenge in both directions, in the order a ``Listener`` (``serving``)
    or a ``Client`` runs it, on a connection opened without one. Nothing the peer sends is unpickled before it has
    proved the key, and a peer that has not within ``timeout_s`` (a port scanner, a peer that died mid-handshake, a
    stale address now held by something else) is cut off: EOFError or OSError here, instead of a wait forever."""
    from multiprocessing.connection import answer_challenge, deliver_challenge

    watchdog = threading.Timer(timeout_s, disconnect, (conn,))
    watchdog.daemon = True
    watchdog.start()
    try:
        for step in (deliver_challenge, answer_challenge) if serving else (answer_challenge, deliver_challenge):
            step(conn, authkey)
    finally:
        watchdog.cancel()
