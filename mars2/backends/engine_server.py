"""The transformers engine's process: ``python -m mars2.backends.engine_server ADDRESS MODEL TOKENIZER VERSION DEVICE
DTYPE BATCH_SIZE`` (started by :class:`mars2.backends.engine.EngineClient`; protocol in that module).

It loads the model once, listens on the Unix socket ``ADDRESS`` (authkey from ``MARS2_ENGINE_AUTHKEY``), serves
each connection in its own thread (one request at a time on the model), and replaces the weights in place on
``load``: the parameters' tensors are copied into, not re-allocated, so the process keeps its memory and its
model object across versions.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass
class EngineState:
    backend: object
    model_dir: str
    version: str


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


def handle(state: EngineState, lock: threading.Lock, message: tuple):
    """One request → ("ok", value) or ("error", message)."""
    from mars2.backends.base import SamplingParams

    kind = message[0]
    try:
        if kind == "generate":
            _, version, prompts, params, seeds = message
            with lock:
                if version != state.version:
                    return "error", f"it holds weights version {state.version!r}, the request wants {version!r}"
                return "ok", state.backend.generate(prompts, SamplingParams(**params), seeds)
        if kind == "load":
            _, model_dir, version = message
            with lock:
                load_weights_in_place(state.backend.model, model_dir)
                state.model_dir, state.version = model_dir, version
            return "ok", version
        if kind == "health":
            return "ok", {"version": state.version, "pid": os.getpid(), "model_dir": state.model_dir}
        return "error", f"unknown request {kind!r}"
    except Exception as e:  # the engine stays up; the client raises with this message
        return "error", f"{type(e).__name__}: {e}"


def serve(conn, state: EngineState, lock: threading.Lock, stop: threading.Event) -> None:
    with conn:
        while not stop.is_set():
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if message[0] == "shutdown":
                conn.send(("ok", None))
                stop.set()
                os._exit(0)  # the listener's accept() does not wake up on its own
            conn.send(handle(state, lock, message))


def main(address: str, model_dir: str, tokenizer_dir: str, version: str, device: str, dtype: str,
         batch_size: str) -> None:
    from multiprocessing.connection import Listener

    from mars2.backends.transformers_backend import load_transformers_backend

    backend, _ = load_transformers_backend(model_dir, tokenizer_dir, device=device, dtype=dtype,
                                           batch_size=int(batch_size))
    state, lock, stop = EngineState(backend, model_dir, version), threading.Lock(), threading.Event()
    authkey = bytes.fromhex(os.environ.pop("MARS2_ENGINE_AUTHKEY"))
    with Listener(address, family="AF_UNIX", authkey=authkey) as listener:
        while not stop.is_set():
            conn = listener.accept()
            threading.Thread(target=serve, args=(conn, state, lock, stop), daemon=True).start()


if __name__ == "__main__":
    main(*sys.argv[1:])
