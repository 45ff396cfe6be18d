"""The run's generation engines: one per weight owner, kept across waves, stages and cycles of a flow run.

A flow opens :func:`engine_pool` around its stages (a stage flow run on a pool worker: :func:`node_engines`) and
hands it to them as ``StageContext.engines``; :func:`stagekit.runners.load_backend` then hands out the owner's engine,
loading the stage's weights into it in place (the model folder, content-addressed, is the version), instead of a
fresh backend. ``engine_starts`` counts every engine (or in-process model load, or vLLM worker) started during the
run: the figure a GPU cluster pays for in minutes per start. A stage given no pool (a test calling a stage) loads
every backend fresh.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

from mars2.backends.base import SERVICE_IDLE_EXIT_S, CountedBackend, SleepingBackend
from mars2.backends.engine import STARTS_FILE, STOP_FILE, EngineClient, EngineError, EngineSpec, node_name
from mars2.config import BackendConfig
from mars2.io import atomic_write_text
from stagekit.stage import StageContext

log = logging.getLogger(__name__)


class EnginePool:
    """The engines a process hands out: its own children (``service_dir`` None: the flow's run in local mode) or the
    node's services of the run (``service_dir``: a stage flow run on a pool worker); ``remote``: owner → the
    ``provide`` of an owner whose engine runs on another node (:class:`EngineClient`); ``listen_tcp``: the services
    this process starts are reachable from other nodes."""

    def __init__(self, persistent: bool, *, start_timeout_s: float, run_dir: Path | None = None,
                 service_dir: Path | None = None, idle_exit_s: float = SERVICE_IDLE_EXIT_S,
                 remote: dict[str, Callable[[EngineSpec], Path]] | None = None, listen_tcp: bool = False):
        self.persistent = persistent
        self.start_timeout_s = start_timeout_s
        self.idle_exit_s = idle_exit_s  # a node service's (backend.service_idle_exit_s)
        self.run_dir = run_dir
        self.service_dir = service_dir
        self.remote = remote or {}
        self.listen_tcp = listen_tcp
        self.engines: dict[str, EngineClient] = {}
        self.handed_out: list = []  # (owner, backend): every backend of the run, for engine_starts

    def engine(self, owner: str, model_dir: str, tokenizer_dir: str, version: str, *, device: str, dtype: str,
               batch_size: int, threads: int = 0, **kind) -> EngineClient:
        """``owner``'s engine holding ``version`` (started on first use, else loaded in place); ``kind``: the
        :class:`EngineSpec` fields of a vLLM engine (kind, python, vllm, stop_token_ids)."""
        engine = self.engines.get(owner)
        if engine is None:
            try:
                engine = EngineClient(EngineSpec(owner, model_dir, tokenizer_dir, version, device=device, dtype=dtype,
                                                 batch_size=batch_size, threads=threads, **kind),
                                      service_dir=self.service_dir, start_timeout_s=self.start_timeout_s,
                                      idle_exit_s=self.idle_exit_s, listen_tcp=self.listen_tcp,
                                      provide=self.remote.get(owner))
            except EngineError as e:  # the failed run's engine_starts still counts the start it paid for
                self.handed_out.append((owner, SimpleNamespace(starts=e.starts)))
                raise
            self.engines[owner] = engine
            if self.service_dir is None:  # node services are counted in the run's starts file
                self.handed_out.append((owner, engine))
        engine.load(model_dir, version)  # in place (an attached node service may hold an earlier version)
        return engine

    def count(self, backend, owner: str) -> None:
        """A backend started outside the pool's engines (in-process, vLLM workers): its starts count too."""
        self.handed_out.append((owner, backend))

    @property
    def starts(self) -> int:
        """Engines started for the run: by this process, and on pool workers (node services, and the fresh backends
        of stages run there), from the run's starts file."""
        own = sum(starts_of(b) for _, b in self.handed_out)
        node = self.run_dir / STARTS_FILE if self.run_dir is not None else None
        return own + (len(node.read_text().splitlines()) if node is not None and node.exists() else 0)

    def close(self) -> None:
        """Stop (or, for node services, leave) the engines; a stage on a pool worker adds its fresh backends' starts
        (``backend.persistent=false``: known only now, a vLLM backend starts one worker per call) to the run's
        starts file, one line per start, as node services do."""
        for engine in self.engines.values():
            engine.close()
        if self.service_dir is not None and self.handed_out:
            lines = "".join(f"{owner} {node_name()} fresh\n"
                            for owner, backend in self.handed_out for _ in range(starts_of(backend)))
            self.service_dir.parent.mkdir(parents=True, exist_ok=True)
            with open(self.service_dir.parent / STARTS_FILE, "a") as starts:  # one write: an atomic append
                starts.write(lines)


def run_engines_dir(ctx: StageContext) -> Path:
    """``<root>/engines/<flow run id>``: the run's node services register here, one folder per node
    (:func:`~mars2.backends.engine.node_name`)."""
    return Path(ctx.root) / "engines" / (ctx.flow_run_id or "local")


@contextlib.contextmanager
def engine_pool(backend: BackendConfig, ctx: StageContext | None = None) -> Iterator[EnginePool]:
    """The run's engines (``backend.persistent``, ``start_timeout_s``), stopped when the block ends (normally, on an
    error, on SIGTERM/SIGINT); with ``ctx``, the run's node services on pool workers too (their STOP file is
    written)."""
    run_dir = run_engines_dir(ctx) if ctx is not None else None
    if run_dir is not None:  # a retry of the same flow run: the last attempt's STOP would end this one's services
        (run_dir / STOP_FILE).unlink(missing_ok=True)
    pool = EnginePool(backend.persistent, run_dir=run_dir, start_timeout_s=backend.start_timeout_s)
    try:
        yield pool
    finally:
        pool.close()
        if run_dir is not None and run_dir.exists():
            atomic_write_text(run_dir / STOP_FILE, "the run has ended\n")


@contextlib.contextmanager
def node_engines(backend: BackendConfig, ctx: StageContext,
                 remote: dict[str, Callable[[EngineSpec], Path]] | None = None) -> Iterator[EnginePool]:
    """A stage flow run's engines on a pool worker: the node's services of the run (started by the first stage
    that needs one, attached to by the next; each exits after ``backend.service_idle_exit_s`` with no stage
    connected), disconnected from when the block ends; ``remote``: the owners whose engines run on other nodes.
    A run on several nodes (``ctx.engine_pools``) starts its services on TCP."""
    pool = EnginePool(backend.persistent, service_dir=node_services_dir(ctx),
                      start_timeout_s=backend.start_timeout_s, idle_exit_s=backend.service_idle_exit_s,
                      remote=remote, listen_tcp=bool(ctx.engine_pools))
    try:
        yield pool
    finally:
        pool.close()


def node_services_dir(ctx: StageContext) -> Path:
    """This node's folder of the run's services: ``<root>/engines/<flow run id>/<node name>``."""
    return run_engines_dir(ctx) / node_name()


def release(runners: dict) -> None:
    """After a stage's generation: every engine it used frees its accelerator for the next stage (the update). An
    engine that fails to sleep is logged, not raised: the stage's finished trees are kept (a re-run would generate
    them again), and the update that needs the memory fails on its own if it is still taken."""
    for backend in {id(r.backend): r.backend for r in runners.values()}.values():
        if isinstance(backend, SleepingBackend):
            try:
                backend.sleep()
            except Exception as e:  # noqa: BLE001 - any engine failure: the stage's work stands
                log.warning("an engine failed to sleep after generating (%s: %s); its accelerator memory may still "
                            "be taken", type(e).__name__, e)


def starts_of(backend) -> int:
    """Engine starts a handed-out backend made: its own count, else one (a model loaded once)."""
    return backend.starts if isinstance(backend, CountedBackend) else 1
