"""A long-lived generation engine per weight owner, and its client.

The engine is a process that loads an agent's model once and then serves generation requests; after an update it
loads the new weights *in place* (same process, same memory), tagged with a version. Every request names the
version it wants, and an engine holding another version refuses it: a request for version V is never answered by
V−1. The protocol (pickled tuples over an authenticated ``multiprocessing.connection`` socket):

    ("generate", version, prompts, sampling_params_dict, seeds) → ("ok", [[Generation, ...] per prompt])
    ("load", model_dir, version)                                → ("ok", version)
    ("health",)                                                 → ("ok", {"version", "pid", "model_dir"})
    ("shutdown",)                                               → ("ok", None), then the process exits
    any request that fails                                      → ("error", message)

:class:`EngineClient` implements :class:`~mars2.backends.base.GenerationBackend` (``generate(prompts, params,
seeds)``), so the search uses it like an in-process backend. It starts the engine (``python -m
mars2.backends.engine_server``: transformers, CPU or one GPU), restarts it once if it crashes (with the latest
weights; a second crash is an :class:`EngineError` naming the agent), and stops it on :meth:`close`, at exit, and
— through ``PR_SET_PDEATHSIG`` — when the client's process dies, so no engine outlives its run.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mars2.backends.base import Generation, SamplingParams, prompt_seeds


class EngineError(RuntimeError):
    """An engine failed in a way the client cannot repair (named agent, what happened)."""


@dataclass(frozen=True)
class EngineSpec:
    """What an engine serves: one weight owner's model, where, and how it batches."""

    agent: str
    model_dir: str
    tokenizer_dir: str
    version: str
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 32


def die_with_parent() -> None:
    """``preexec_fn`` of a child process bound to its parent: the kernel sends it SIGTERM when the parent dies, even
    by ``kill -9`` (Linux ``PR_SET_PDEATHSIG``; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class EngineClient:
    """The client side of one engine (see the module docstring); ``starts`` counts engine processes started."""

    uses_host_cpu: bool

    def __init__(self, spec: EngineSpec, *, start_timeout_s: float = 300.0, restarts: int = 1):
        self.spec = spec
        self.uses_host_cpu = spec.device.startswith("cpu")  # see tree_search.grading_overlaps_generation
        self.start_timeout_s = start_timeout_s
        self.restarts_left = restarts
        self.starts = 0
        self._proc: subprocess.Popen | None = None
        self._conn = None
        self._folder = Path(tempfile.mkdtemp(prefix=f"mars2-engine-{spec.agent}-"))
        self._authkey = os.urandom(16)
        self._start()
        atexit.register(self.close)

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        from multiprocessing.connection import Client

        address = str(self._folder / f"engine-{self.starts}.sock")
        env = {**os.environ, "MARS2_ENGINE_AUTHKEY": self._authkey.hex()}
        log = open(self._folder / "engine.log", "ab")  # noqa: SIM115 - the engine's process owns it
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mars2.backends.engine_server", address, self.spec.model_dir,
             self.spec.tokenizer_dir, self.spec.version, self.spec.device, self.spec.dtype, str(self.spec.batch_size)],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=die_with_parent)
        log.close()
        self.starts += 1
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise EngineError(f"the engine of agent {self.spec.agent!r} exited with code {self._proc.returncode} "
                                  f"while starting; its log: {self._folder / 'engine.log'}\n{self._log_tail()}")
            if os.path.exists(address):
                try:
                    self._conn = Client(address, family="AF_UNIX", authkey=self._authkey)
                    return
                except (ConnectionRefusedError, FileNotFoundError):
                    pass
            if time.monotonic() > deadline:
                self._kill()
                raise EngineError(f"the engine of agent {self.spec.agent!r} did not start in {self.start_timeout_s:.0f} s")
            time.sleep(0.05)

    def _log_tail(self, lines: int = 15) -> str:
        path = self._folder / "engine.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _call(self, message: tuple):
        """Send one request and return its answer; a dead engine is restarted once (with the latest weights) and
        the request sent again."""
        for attempt in range(2):
            try:
                self._conn.send(message)
                status, value = self._conn.recv()
            except (EOFError, OSError) as e:
                self._kill()
                if attempt == 1 or self.restarts_left <= 0:
                    raise EngineError(f"the engine of agent {self.spec.agent!r} crashed ({type(e).__name__}) and "
                                      f"was already restarted once; its log: {self._folder / 'engine.log'}\n"
                                      f"{self._log_tail()}") from None
                self.restarts_left -= 1
                self._start()
                continue
            if status != "ok":
                raise EngineError(f"the engine of agent {self.spec.agent!r}: {value}")
            return value
        raise AssertionError("unreachable")

    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """Generations of the engine's current version (``self.version``) for each prompt, one seed per prompt."""
        seeds = list(seeds) if seeds is not None else prompt_seeds(params, len(prompts))
        return self._call(("generate", self.spec.version, list(prompts), asdict(params), seeds))

    def load(self, model_dir: str, version: str) -> None:
        """Load ``model_dir``'s weights into the running engine, in place, as ``version``; the next requests ask
        for that version. A restart after a crash starts from this folder."""
        if version == self.spec.version:
            return
        self._call(("load", str(model_dir), version))
        from dataclasses import replace

        self.spec = replace(self.spec, model_dir=str(model_dir), version=version)

    def health(self) -> dict:
        return self._call(("health",))

    def _kill(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        """Stop the engine (politely, then by force); idempotent."""
        if self._proc is None:
            return
        if self._proc.poll() is None and self._conn is not None:
            try:
                self._conn.send(("shutdown",))
                self._conn.recv()
                self._proc.wait(timeout=10)
            except (EOFError, OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._proc = None
