"""The run's generation engines: one per weight owner, kept across waves, stages and cycles of a flow run.

A flow opens :func:`engine_pool` around its stages; :func:`tasks.weights.load_backend` then hands out the owner's
engine, loading the stage's weights into it in place (the model folder, content-addressed, is the version), instead of a
fresh backend. ``engine_starts`` counts every engine (or in-process model load, or vLLM worker) started during the
run: the figure a GPU cluster pays for in minutes per start. Without an open pool (a stage on a pool worker, a
test calling a stage) every backend is loaded fresh, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from mars2.backends.engine import EngineClient, EngineSpec

_pool: EnginePool | None = None


class EnginePool:
    def __init__(self, persistent: bool):
        self.persistent = persistent
        self.engines: dict[str, EngineClient] = {}
        self.handed_out: list = []  # every backend of the run, for engine_starts

    def engine(self, owner: str, model_dir: str, tokenizer_dir: str, version: str, *, device: str, dtype: str,
               batch_size: int, threads: int = 0) -> EngineClient:
        """``owner``'s engine holding ``version`` (started on first use, else loaded in place)."""
        engine = self.engines.get(owner)
        if engine is None:
            engine = EngineClient(EngineSpec(owner, model_dir, tokenizer_dir, version, device=device, dtype=dtype,
                                             batch_size=batch_size, threads=threads))
            self.engines[owner] = engine
            self.handed_out.append(engine)
        else:
            engine.load(model_dir, version)
        return engine

    def count(self, backend) -> None:
        """A backend started outside the pool's engines (in-process, vLLM workers): its starts count too."""
        self.handed_out.append(backend)

    @property
    def starts(self) -> int:
        return sum(getattr(b, "starts", 1) for b in self.handed_out)

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()


@contextlib.contextmanager
def engine_pool(persistent: bool) -> Iterator[EnginePool]:
    """The run's engines, stopped when the block ends (normally, on an error, on SIGTERM/SIGINT)."""
    global _pool
    _pool = EnginePool(persistent)
    try:
        yield _pool
    finally:
        pool, _pool = _pool, None
        pool.close()


def current_pool() -> EnginePool | None:
    return _pool
