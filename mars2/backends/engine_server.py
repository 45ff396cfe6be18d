"""The transformers engine's process: ``python -m mars2.backends.engine_server ADDRESS MODEL TOKENIZER VERSION DEVICE
DTYPE BATCH_SIZE [THREADS [STOP_FILE IDLE_EXIT_S]]`` (started by :class:`mars2.backends.engine.EngineClient`; protocol in that module).

It loads the model once, listens on the Unix socket ``ADDRESS`` (authkey from ``MARS2_ENGINE_AUTHKEY``), reads
each connection in its own thread and queues every "sample" request into one continuous batch (the backend's
:class:`~mars2.backends.continuous.ContinuousBatcher`), answering each when it finishes. On ``load`` it waits for
the batch to drain and replaces the weights in place: the parameters' tensors are copied into, not re-allocated,
so the process keeps its memory and its model object across versions.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class EngineState:
    backend: object
    model_dir: str
    version: str
    device: str = "cpu"
    lock: threading.RLock = field(default_factory=threading.RLock)  # versions change only between requests
    asleep: bool = False
    connections: int = 0


def wake(state: EngineState) -> None:
    """Weights back on the engine's device after a sleep (under ``state.lock``)."""
    if state.asleep:
        state.backend.model.to(state.device)
        state.asleep = False


def sleep(state: EngineState) -> None:
    """Weights to host memory and the accelerator's cache emptied, once the running requests are done."""
    import torch

    with state.lock, state.backend.batcher.drained():
        if not state.device.startswith("cpu"):
            state.backend.model.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        state.asleep = True


def load_weights_in_place(model, model_dir: str) -> None:
    """Copy every tensor of ``model_dir``'s safetensors files into ``model``'s parameters and buffers.

    Every parameter must be in the files, but weights tied to another (``lm_head`` ↔ embeddings), and every tensor
    in the files must be a parameter or buffer of the model, with the same shape: anything else is a different
    architecture, refused rather than half-loaded."""
    import torch
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    own = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise ValueError(f"{model_dir} holds tensors this model does not have: {unknown[:5]}")
    tied = {name for name, p in own.items() if any(p is q for other, q in own.items() if other != name)}
    missing = sorted(set(own) - set(state) - tied - {n for n, _ in model.named_buffers()})
    if missing:
        raise ValueError(f"{model_dir} lacks weights of this model: {missing[:5]}")
    with torch.no_grad():
        for name, tensor in state.items():
            target = own[name]
            if target.shape != tensor.shape:
                raise ValueError(f"{name}: {tuple(tensor.shape)} in {model_dir}, {tuple(target.shape)} in the model")
            target.copy_(tensor.to(dtype=target.dtype, device=target.device))


def handle(state: EngineState, message: tuple, reply) -> None:
    """One request; ``reply(status, value)`` answers it now or, for a sample, when it finishes."""
    from mars2.backends.base import SamplingParams

    kind = message[0]
    try:
        if kind == "sample":
            _, version, prompt, params, seed = message
            with state.lock:  # the check and the queueing happen before any later load
                if version != state.version:
                    reply("error", f"it holds weights version {state.version!r}, the request wants {version!r}")
                    return
                wake(state)
                future = state.backend.submit_samples([(prompt, seed)], SamplingParams(**params))[0]
            future.add_done_callback(lambda f: reply("ok", f.result()) if f.exception() is None
                                     else reply("error", f"{type(f.exception()).__name__}: {f.exception()}"))
        elif kind == "load":
            _, model_dir, version = message
            with state.lock, state.backend.batcher.drained():
                load_weights_in_place(state.backend.model, model_dir)  # into host memory while asleep
                state.model_dir, state.version = model_dir, version
            reply("ok", version)
        elif kind == "sleep":
            sleep(state)
            reply("ok", None)
        elif kind == "health":
            batcher = state.backend.batcher
            reply("ok", {"version": state.version, "pid": os.getpid(), "model_dir": state.model_dir, "asleep": state.asleep,
                         "steps": batcher.steps, "rows_stepped": batcher.rows_stepped, "prefills": batcher.prefills})
        else:
            reply("error", f"unknown request {kind!r}")
    except Exception as e:  # the engine stays up; the client raises with this message
        reply("error", f"{type(e).__name__}: {e}")


def serve(conn, state: EngineState) -> None:
    send_lock = threading.Lock()  # answers come from this thread and from the decode thread

    def answer(request_id: int):
        def reply(status: str, value) -> None:
            with send_lock:
                try:
                    conn.send((request_id, status, value))
                except OSError:
                    pass  # the client is gone

        return reply

    state.connections += 1
    with conn:
        while True:
            try:
                request_id, *message = conn.recv()
            except (EOFError, OSError):
                state.connections -= 1
                return
            if message[0] == "shutdown":
                answer(request_id)("ok", None)
                os._exit(0)  # the listener's accept() does not wake up on its own
            handle(state, tuple(message), answer(request_id))


def watch(state: EngineState, stop_file: str, idle_exit_s: float) -> None:
    """A node service's end: its run's STOP file appears, or no stage has been connected for ``idle_exit_s``."""
    import time

    idle_since = time.monotonic()
    while True:
        time.sleep(1.0)
        if os.path.exists(stop_file):
            os._exit(0)
        if state.connections:
            idle_since = time.monotonic()
        elif idle_exit_s > 0 and time.monotonic() - idle_since > idle_exit_s:
            os._exit(0)


def main(address: str, model_dir: str, tokenizer_dir: str, version: str, device: str, dtype: str,
         batch_size: str, threads: str = "0", stop_file: str = "", idle_exit_s: str = "0") -> None:
    from multiprocessing.connection import Listener

    import torch

    from mars2.backends.transformers_backend import load_transformers_backend

    if int(threads) > 0:
        torch.set_num_threads(int(threads))
    backend, _ = load_transformers_backend(model_dir, tokenizer_dir, device=device, dtype=dtype,
                                           batch_size=int(batch_size))
    state = EngineState(backend, model_dir, version, device=device)
    if stop_file:
        threading.Thread(target=watch, args=(state, stop_file, float(idle_exit_s)), daemon=True).start()
    authkey = bytes.fromhex(os.environ.pop("MARS2_ENGINE_AUTHKEY"))
    with Listener(address, family="AF_UNIX", authkey=authkey) as listener:
        while True:
            conn = listener.accept()
            threading.Thread(target=serve, args=(conn, state), daemon=True).start()


if __name__ == "__main__":
    main(*sys.argv[1:])
