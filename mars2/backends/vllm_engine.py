"""The vLLM side of a persistent engine: vLLM's ``AsyncLLM`` behind the engine protocol (:mod:`mars2.backends.engine`).

Runs inside the GPU worker's vLLM environment (``$MARS2_VLLM_PYTHON -m mars2.backends.engine_server``, with an
engine spec of kind "vllm"); nothing here is imported by the pipeline's own environment. Tested at its boundary
with a stand-in ``vllm`` package (``tests/mars2/backends/test_vllm_backend.py``); the calls are those of vLLM 0.16–0.33:

- start: ``AsyncLLM.from_engine_args(AsyncEngineArgs(**engine, logprobs_mode="processed_logprobs",
  enable_sleep_mode=True))`` (vLLM refuses ``sleep`` without it);
- sample: ``AsyncLLM.generate(prompt, SamplingParams(n=1, seed=<request seed>, logprobs=0, ...), request_id)``,
  an async stream whose last output is the finished request; vLLM batches every request in flight;
- load: once no request is in flight and the engine is awake (vLLM cannot reload into a sleeping engine),
  ``collective_rpc("reload_weights", kwargs={"weights_path": folder})`` (every tensor-parallel rank reads every
  file of the folder and keeps its shard, in place) and ``reset_prefix_cache()``, which must return True (cached
  prefixes were computed with the old weights). A folder whose safetensors files do not read, or lack a tensor the
  engine's first folder held, is refused before the reload (:class:`~mars2.backends.base.CheckpointRefused`: an
  awake engine keeps its version; one woken from sleep without its weights holds none); a reload that fails after
  it started leaves no version;
- sleep / wake: ``sleep(level=2)`` (weights and KV cache dropped) / ``wake_up()`` and a reload of the folder it held;
  a load into a sleeping engine checks the new folder before waking it, so a refused folder leaves it asleep;
- death: once ``AsyncLLM.errored`` (its engine core or a worker exited: ``EngineDeadError`` on every call),
  :attr:`VLLMEngine.dead` ends the engine's process, unanswered, so that its client restarts it
  (``engine_server.died``); with worker processes (TP × PP × DP > 1) a control call that failed in vLLM's words for
  a dying worker is such a death too when the engine is dead within :data:`DEATH_GRACE_S`;
- stop: ``shutdown()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future


CPU_MAX_NUM_SEQS = 256  # requests a CPU engine runs at once (vLLM's default)
# With worker processes of their own (TP × PP × DP > 1: vLLM's multiprocess executor) a dying worker fails the
# control call in progress with a plain error before vLLM marks the engine dead: its executor is shut down first,
# and only then does the engine core report itself dead (vLLM 0.32: v1/executor/multiproc_executor.py,
# v1/engine/core.py). Such a call, failed with vLLM's wording for it, waits up to DEATH_GRACE_S seconds to see
# whether the engine died; any other failure (a CUDA out-of-memory on wake, a bad folder) is answered at once.
DEATH_GRACE_S = 5.0
DEATH_WORDING = ("cancelled", "Executor failed")  # shm_broadcast's read cancelled by the shutdown; a failed executor


class VLLMEngine:
    """The engine operations :func:`mars2.backends.engine_server.handle` needs, on one ``AsyncLLM``."""

    def __init__(self, engine_args: dict, stop_token_ids: list[int]):
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        self.stop_token_ids = list(stop_token_ids)
        # worker processes of its own (vLLM's "mp" executor) whenever TP × PP × DP > 1 (``world_size_across_dp``):
        # a data-parallel replica of TP 1 runs its worker in a process of its own too, which can die on its own
        self.workers = int(engine_args.get("tensor_parallel_size") or 1) * int(
            engine_args.get("pipeline_parallel_size") or 1) * int(engine_args.get("data_parallel_size") or 1)
        self.model_dir = self.first_model_dir = engine_args["model"]
        self.tensors: frozenset[str] | None = None  # the first folder's: what every later one must hold (check)
        # sleep mode exists on GPUs only (a CPU build refuses the flag at construction): decided by the device
        self.sleep_mode = bool(current_platform.is_sleep_mode_available())
        self.sleep_discards_weights = self.sleep_mode  # level 2 (sleep)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="vllm-loop", daemon=True).start()
        self.cpu = bool(current_platform.is_cpu())
        # vLLM's CPU build: reloaded weights need re-packing (CpuRepack), and a seeded request whose prefill is split
        # over steps crashes the engine (its CPU generator has no offset to rewind): a step's token budget there holds
        # every running request's whole context, so no prompt is ever split (chunked prefill stays on: prefills and
        # decodes still share steps)
        seqs = CPU_MAX_NUM_SEQS
        cpu = {"worker_extension_cls": f"{__name__}.CpuRepack", "max_num_seqs": seqs,
               "max_num_batched_tokens": seqs * int(engine_args.get("max_model_len") or 8192)} if self.cpu else {}
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(
            **{**engine_args, "enable_sleep_mode": self.sleep_mode}, logprobs_mode="processed_logprobs", **cpu))
        self._cv = threading.Condition()
        self._in_flight = 0
        self._holds = 0
        self.requests = 0
        self.prefix_cache_resets = 0

    @property
    def dead(self) -> bool:
        """vLLM's engine core or one of its workers has exited (``AsyncLLM.errored``): every call from now on
        fails."""
        return bool(self.llm.errored)

    def _run(self, coroutine):
        """A control call (reload, sleep, wake, prefix-cache reset), waited for."""
        grace_s = DEATH_GRACE_S if self.workers > 1 else 0.0
        return asyncio.run_coroutine_threadsafe(self._died_as_ours(coroutine, grace_s), self.loop).result()

    async def _died_as_ours(self, coroutine, grace_s: float = 0.0):
        """``coroutine``, with vLLM's ``EngineDeadError`` raised as :class:`~mars2.backends.base.EngineDied`, and an
        error in :data:`DEATH_WORDING` too when the engine turns out dead (:attr:`dead`) within ``grace_s`` of it."""
        from vllm.v1.engine.exceptions import EngineDeadError

        from mars2.backends.base import EngineDied

        try:
            return await coroutine
        except EngineDeadError as e:
            raise EngineDied(f"vLLM's engine core died: {e}") from e
        except Exception as e:
            deadline = self.loop.time() + (grace_s if any(w in str(e) for w in DEATH_WORDING) else 0.0)
            while not self.dead:
                if self.loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.05)
            raise EngineDied(f"vLLM's engine died during the call: {type(e).__name__}: {e}") from e

    def submit(self, prompt: str, params, seed: int) -> Future:
        """One request → ``Future[Generation]``; it waits while a load or sleep holds the engine."""
        with self._cv:
            self._cv.wait_for(lambda: not self._holds)
            self._in_flight += 1
            self.requests += 1
        done = asyncio.run_coroutine_threadsafe(self._died_as_ours(self._generate(prompt, params, seed)), self.loop)
        done.add_done_callback(lambda _: self._finished())
        return done

    def _finished(self) -> None:
        with self._cv:
            self._in_flight -= 1
            self._cv.notify_all()

    async def _generate(self, prompt: str, params, seed: int):
        from vllm import SamplingParams as VSamplingParams

        from mars2.backends.vllm_backend import generation_from_vllm

        sampling = VSamplingParams(n=1, temperature=params.temperature,
                                   top_p=params.top_p if params.temperature > 0 else 1.0,
                                   max_tokens=params.max_new_tokens, seed=seed, logprobs=0,
                                   **({"stop_token_ids": self.stop_token_ids} if self.stop_token_ids else {}))
        final = None
        async for output in self.llm.generate(prompt, sampling, request_id=uuid.uuid4().hex):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for a request")
        return generation_from_vllm(list(final.prompt_token_ids), final.outputs[0])

    @contextlib.contextmanager
    def drained(self) -> Iterator[None]:
        """Once every request submitted before has finished, hold the engine for the block."""
        with self._cv:
            self._holds += 1
            self._cv.wait_for(lambda: not self._in_flight)
        try:
            yield
        finally:
            with self._cv:
                self._holds -= 1
                self._cv.notify_all()

    def check(self, model_dir: str) -> None:
        """:class:`~mars2.backends.base.CheckpointRefused` unless ``model_dir``'s safetensors files read and hold every
        tensor the engine's first folder held (vLLM's in-place reload only warns about a missing one and keeps that
        layer's old weights)."""
        from mars2.backends.base import CheckpointRefused

        if self.tensors is None:  # read at the first load, so that no start fails on it
            try:
                self.tensors = tensor_names(self.first_model_dir)
            except CheckpointRefused:  # not safetensors (vLLM also loads .bin folders): nothing to compare with
                self.tensors = frozenset()
        check_safetensors(model_dir, self.tensors)

    def load(self, model_dir: str) -> None:
        self.check(model_dir)
        self._reload(model_dir)
        self.model_dir = model_dir

    def _reload(self, model_dir: str) -> None:
        self._run(self.llm.collective_rpc("reload_weights", kwargs={"weights_path": model_dir}))
        if self.cpu:  # vLLM's CPU build keeps load-time packed copies of some weights (CpuRepack)
            self._run(self.llm.collective_rpc("mars2_repack_cpu_gemm"))
        if self._run(self.llm.reset_prefix_cache()) is False:
            raise RuntimeError("vLLM did not reset its prefix cache after the weight reload")
        self.prefix_cache_resets += 1

    def sleep(self) -> None:
        """Free the accelerator for the update: level 2 discards the weights (level 1 would copy them to pinned host
        memory, ~61 GiB for a 32B agent's engine, 15 GiB per GPU at TP 4, only for the next load to overwrite them)
        and the KV cache. A no-op where vLLM has no sleep mode (CPU)."""
        if self.sleep_mode:
            self._run(self.llm.sleep(level=2))

    def wake(self, restore: bool = True) -> None:
        """Back from :meth:`sleep`; ``restore``: reload the folder it held (level 2 discarded it), unless a load of
        another folder follows at once."""
        if self.sleep_mode:
            self._run(self.llm.wake_up())
            if restore:
                self._reload(self.model_dir)

    def counters(self) -> dict:
        return {"requests": self.requests, "prefix_cache_resets": self.prefix_cache_resets,
                "cpu_s": family_cpu_seconds(os.getpid())}

    def shutdown(self) -> None:
        self.llm.shutdown()


class CpuRepack:
    """A vLLM worker extension (``worker_extension_cls``) for its CPU build: there a linear layer multiplies with a
    packed copy of its weight made at load time (``dispatch_cpu_unquantized_gemm``), and ``reload_weights`` does not
    remake it for a layer whose weights the checkpoint does not hold, such as an LM head tied to the embeddings, which
    then goes on computing logits with the first folder's embeddings. Every layer that still holds its weight is
    packed again from it."""

    def mars2_repack_cpu_gemm(self) -> int:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        repacked = 0
        for module in self.model_runner.model.modules():
            weight = getattr(module, "weight", None)
            if hasattr(module, "cpu_linear") and weight is not None and weight.ndim == 2 and weight.numel():
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                repacked += 1
        return repacked


def family_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its live descendants (vLLM's engine core and workers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
            except (OSError, ValueError, IndexError):
                continue
    family, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _) in stats.items():
            if ppid == parent and child not in family:
                family.add(child)
                frontier.append(child)
    return sum(stats[p][1] for p in family if p in stats)


NOT_WEIGHTS = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached", "rotary_pos_emb.inv_freq")
"""Buffers some published folders hold that neither transformers saves nor vLLM loads: never missing."""


def check_safetensors(model_dir: str, expected: frozenset[str] = frozenset()) -> None:
    """The folder holds safetensors files whose headers read and name every tensor of ``expected``
    (:class:`CheckpointRefused` otherwise), checked before vLLM starts overwriting weights. A tied output projection
    (``lm_head.weight`` where the folder's config ties it to the embeddings) may be left out."""
    from mars2.backends.base import CheckpointRefused

    missing = {name for name in expected - tensor_names(model_dir) if not any(b in name for b in NOT_WEIGHTS)}
    if missing and "lm_head.weight" in missing and _ties_embeddings(model_dir):
        missing = missing - {"lm_head.weight"}
    if missing:
        shown = ", ".join(sorted(missing)[:3]) + (", ..." if len(missing) > 3 else "")
        raise CheckpointRefused(f"{model_dir} lacks {len(missing)} tensor(s) of the model the engine serves: {shown}")


def tensor_names(model_dir: str) -> frozenset[str]:
    """The tensors a model folder's safetensors files name (their headers only; :class:`CheckpointRefused` when one
    cannot be read)."""
    from safetensors import safe_open

    from mars2.backends.base import CheckpointRefused, checkpoint_files

    names: set[str] = set()
    for f in checkpoint_files(model_dir):
        try:
            with safe_open(str(f), framework="pt") as handle:
                names.update(handle.keys())
        except Exception as e:
            raise CheckpointRefused(f"{f} cannot be read: {type(e).__name__}: {e}") from e
    return frozenset(names)


def _ties_embeddings(model_dir: str) -> bool:
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", False)))
