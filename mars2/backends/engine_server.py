"""An engine's process: ``python -m mars2.backends.engine_server ADDRESS SPEC_JSON`` (started by
:class:`mars2.backends.engine.EngineClient`; protocol in that module, spec = :class:`~mars2.backends.engine.EngineSpec`
as JSON, plus the node-service fields ``stop_file`` and ``idle_exit_s``, or a child engine's ``parent_pid``).

It loads the model once, listens on ``ADDRESS``: a Unix socket's path, or ``tcp:HOST`` for a node service other
nodes reach (a free TCP port at HOST; the port goes to the spec's ``port_file`` once it listens). Each connection
gets a thread of its own, where its peer first proves the key (``MARS2_ENGINE_AUTHKEY``;
:func:`~mars2.backends.base.authenticate`) and its requests are then read: every "sample" request goes to the
engine, which batches whatever is in flight, answering each when it finishes. Two engines speak it:

- "transformers" (:class:`TransformersEngine`, this environment): the backend's
  :class:`~mars2.backends.continuous.ContinuousBatcher`; a load copies the new tensors into the model's parameters
  (:func:`load_weights_in_place`), so the process keeps its memory and its model object across versions;
- "vllm" (:class:`mars2.backends.vllm_engine.VLLMEngine`, the GPU worker's vLLM environment): ``AsyncLLM``.

A load or sleep waits until every request sent before it has finished. An engine that can serve nothing more
(:attr:`VLLMEngine.dead <mars2.backends.vllm_engine.VLLMEngine.dead>`) ends this process without answering what is in
flight (:func:`died`): its client sees the connection close, restarts it and sends those requests again.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from mars2.backends.base import CheckpointRefused, EngineDied, authenticate, checkpoint_files, keep_alive

TCP = "tcp:"  # ADDRESS of a service listening on TCP: "tcp:<interface>"


class TransformersEngine:
    """The engine operations :func:`handle` needs, on a continuously batched transformers model."""

    def __init__(self, model_dir: str, tokenizer_dir: str, device: str, dtype: str, batch_size: int):
        from mars2.backends.transformers_backend import load_transformers_backend

        self.backend, _ = load_transformers_backend(model_dir, tokenizer_dir, device=device, dtype=dtype,
                                                    batch_size=batch_size)
        self.device = device

    def submit(self, prompt: str, params, seed: int):
        return self.backend.submit_samples([(prompt, seed)], params)[0]

    def drained(self):
        return self.backend.batcher.drained()

    def check(self, model_dir: str) -> None:
        """:class:`CheckpointRefused` unless ``model_dir`` has safetensors files (the tensors are checked by
        :meth:`load`, before it copies anything)."""
        checkpoint_files(model_dir)

    def load(self, model_dir: str) -> None:
        load_weights_in_place(self.backend.model, model_dir)

    def sleep(self) -> None:
        """Weights to host memory and the accelerator's cache emptied (nothing moves on a CPU engine)."""
        import torch

        if not self.device.startswith("cpu"):
            self.backend.model.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def wake(self, restore: bool = True) -> None:
        """Weights back on the device (``restore`` is vLLM's: a sleeping transformers engine kept them in memory)."""
        self.backend.model.to(self.device)

    @property
    def dead(self) -> bool:
        """Never: a failed forward pass fails its requests, and the batcher goes on."""
        return False

    def counters(self) -> dict:
        """The batcher's counters and the CPU seconds this engine process has used (``cpu_s``: all its threads)."""
        b = self.backend.batcher
        return {"steps": b.steps, "rows_stepped": b.rows_stepped, "waiting_stepped": b.waiting_stepped,
                "columns_stepped": b.columns_stepped, "context_stepped": b.context_stepped,
                "prefills": b.prefills, "prefill_tokens": b.prefill_tokens, "prefill_s": b.prefill_s,
                "decode_s": b.decode_s, "cpu_s": time.process_time()}

    def shutdown(self) -> None:
        self.backend.batcher.close()


@dataclass
class EngineState:
    engine: object
    model_dir: str
    version: str | None  # None: a load failed part-way, the weights are no version
    lock: threading.RLock = field(default_factory=threading.RLock)  # versions change only between requests
    asleep: bool = False
    connections: int = 0
    connections_lock: threading.Lock = field(default_factory=threading.Lock)


def load_weights_in_place(model, model_dir: str) -> None:
    """Copy every tensor of ``model_dir``'s safetensors files into ``model``'s parameters and buffers.

    Everything is checked before anything is copied (:class:`CheckpointRefused` leaves the model as it was): every
    tensor in the files must be a parameter or buffer of the model, with the same shape; every parameter must be in
    the files, where weights tied together (``lm_head`` ↔ embeddings) need one of their names. Anything else is a
    different architecture."""
    import torch
    from safetensors.torch import load_file

    state = {}
    for f in checkpoint_files(model_dir):
        try:
            state.update(load_file(str(f)))
        except Exception as e:  # a truncated or foreign file
            raise CheckpointRefused(f"{f} cannot be read: {type(e).__name__}: {e}") from e
    own = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise CheckpointRefused(f"{model_dir} holds tensors this model does not have: {unknown[:5]}")
    names_of: dict[int, list[str]] = {}  # one entry per parameter tensor, listing every name tied to it
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    missing = sorted(" = ".join(names) for names in names_of.values() if not set(names) & set(state))
    if missing:
        raise CheckpointRefused(f"{model_dir} lacks weights of this model: {missing[:5]}")
    wrong = [f"{name}: {tuple(t.shape)} in {model_dir}, {tuple(own[name].shape)} in the model"
             for name, t in state.items() if t.shape != own[name].shape]
    if wrong:
        raise CheckpointRefused("; ".join(wrong[:5]))
    with torch.no_grad():
        for name, tensor in state.items():
            target = own[name]
            target.copy_(tensor.to(dtype=target.dtype, device=target.device))


def handle(state: EngineState, message: tuple, reply) -> None:
    """One request; ``reply(status, value)`` answers it now or, for a sample, when it finishes."""
    from mars2.backends.base import SamplingParams

    kind = message[0]
    try:
        if kind == "sample":
            _, version, prompt, params, seed = message
            with state.lock:  # the check and the queueing happen before any later load
                if state.version is None:
                    reply("error", f"a load into it failed part-way, so its weights are no version; the request "
                                   f"wants {version!r}: load a version again")
                    return
                if version != state.version:
                    reply("error", f"it holds weights version {state.version!r}, the request wants {version!r}")
                    return
                if state.asleep:
                    state.engine.wake()
                    state.asleep = False
                future = state.engine.submit(prompt, SamplingParams(**params), seed)
            future.add_done_callback(lambda f: answered(state, f, reply))
        elif kind == "load":
            _, model_dir, version = message
            with state.lock, state.engine.drained():
                # refused before anything moves: a sleeping vLLM engine (level 2 kept no weights) stays asleep and
                # reloads the folder it holds when a request wakes it, instead of serving discarded memory
                state.engine.check(model_dir)
                # woken without its weights (vLLM's level 2): any failed load leaves it serving nothing
                discarded = state.asleep and getattr(state.engine, "sleep_discards_weights", False)
                if state.asleep:  # vLLM cannot reload into a sleeping engine; the folder it held is replaced at once
                    state.engine.wake(restore=False)
                    state.asleep = False
                started = time.monotonic()
                try:
                    state.engine.load(model_dir)
                except CheckpointRefused:
                    if discarded:  # refused on a second look (a folder that went unreadable since the check)
                        state.version = None
                    raise  # else nothing was copied: it keeps serving the version it holds
                except BaseException as e:
                    state.version = None  # some weights may be new, some old: it serves nothing until a load works
                    if is_death(state, e):  # before the lock goes: no request is answered "no version" meanwhile
                        died(state, e)
                    raise
                state.model_dir, state.version = model_dir, version
            print(f"loaded {model_dir} in place in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
            reply("ok", version)
        elif kind == "sleep":
            with state.lock, state.engine.drained():
                if not state.asleep:
                    state.engine.sleep()
                    state.asleep = True
            reply("ok", None)
        elif kind == "health":
            reply("ok", {"version": state.version, "pid": os.getpid(), "model_dir": state.model_dir,
                         "asleep": state.asleep, "dead": state.engine.dead, "threads": thread_settings(),
                         **state.engine.counters()})
        else:
            reply("error", f"unknown request {kind!r}")
    except Exception as e:
        if is_death(state, e):
            died(state, e)  # unanswered: the client sends it again to the engine it restarts
        else:  # the engine stays up; the client raises with this message
            reply("error", f"{type(e).__name__}: {e}")


def is_death(state: EngineState, error: BaseException) -> bool:
    """Whether ``error`` came of the engine's death (then its request goes unanswered)."""
    return isinstance(error, EngineDied) or state.engine.dead


def answered(state: EngineState, future, reply) -> None:
    """A finished sample request's answer: its generation, or the error; none when the engine died with it."""
    error = future.exception()
    if error is None:
        reply("ok", future.result())
    elif is_death(state, error):
        died(state, error)
    else:
        reply("error", f"{type(error).__name__}: {error}")


DIED_EXIT = 70  # the exit code of an engine server whose engine died (EX_SOFTWARE)


def died(state: EngineState, error: BaseException | None = None) -> None:
    """The engine can serve nothing more: the process ends (:func:`stop`, exit code :data:`DIED_EXIT`) on a thread
    of its own (this may be vLLM's event loop, which the shutdown needs); from this call on, nothing is answered
    (:data:`_dying`: an error answered meanwhile would fail a request the restarted engine can serve)."""
    with _dying_lock:
        if _stopping.is_set() or _dying.is_set():
            return
        _dying.set()
    print(f"the engine died ({type(error).__name__ + ': ' + str(error) if error else 'found by the watch'}); "
          "exiting, so that its client restarts it", file=sys.stderr, flush=True)
    threading.Thread(target=stop, args=(state,), kwargs={"code": DIED_EXIT}, daemon=True, name="died").start()


def serve(conn, state: EngineState) -> None:
    send_lock = threading.Lock()  # answers come from this thread and from the engine's threads

    def answer(request_id: int, *, closing: bool = False):
        def reply(status: str, value) -> None:
            if _dying.is_set() and not closing:
                return  # the client sends it again to the engine it restarts
            with send_lock:
                try:
                    conn.send((request_id, status, value))
                except OSError:
                    pass  # the client is gone
                except Exception as e:  # an answer that does not pickle: the client still gets one, an error
                    with contextlib.suppress(OSError):
                        conn.send((request_id, "error", f"its answer could not be sent: {type(e).__name__}: {e}"))

        return reply

    with state.connections_lock:  # connections come and go on their own threads
        state.connections += 1
    with conn:
        while True:
            try:
                request_id, *message = conn.recv()
            except (EOFError, OSError):
                with state.connections_lock:
                    state.connections -= 1
                return
            if message[0] == "shutdown":
                _stopping.set()  # vLLM's shutdown marks its engine dead and fails what is in flight: not a death
                with contextlib.suppress(Exception):
                    state.engine.shutdown()
                answer(request_id, closing=True)("ok", None)  # also while dying: its client closes it
                os._exit(0)  # the listener's accept() does not wake up on its own
            if not _dying.is_set():
                handle(state, tuple(message), answer(request_id))


def terminated(signum, frame) -> None:
    """The SIGTERM handler (a child engine's parent-death signal): it only records the signal, and the watch
    (:func:`supervise`, within its half-second poll) stops the engine. It takes no lock: it runs on the main thread,
    possibly inside a :func:`stop` already under way there, holding a lock that stop() takes (``_stopping``'s)."""
    global _terminated
    _terminated = True


def stop(state: EngineState | None, grace_s: float = 30.0, code: int = 0) -> None:
    """Exit, having shut the engine down (vLLM stops its engine-core and worker processes): first the socket goes,
    so no stage attaches to a service on its way out (a TCP service's port file goes, and the connections it
    accepts from then on are closed unserved); a shutdown that hangs for ``grace_s`` gives way to SIGKILL of the
    engine's process group (its children with it). The process exits with ``code``. The listener's accept() does
    not wake up on its own, hence ``os._exit``. Called by the watch (:func:`supervise`: also after SIGTERM) and,
    when the engine died, by a thread of its own."""
    _stopping.set()  # a TCP service's listener stays open until the exit: connections from now on are closed
    if _address:
        with contextlib.suppress(OSError):
            os.unlink(_address)
    # its group is the engine's alone when it was started in a session of its own: by the client (``own_group``;
    # an interpreter wrapper that does not exec leads it then), or by hand as a group leader
    leader = _own_group or os.getpgid(0) == os.getpid()
    if state is None and leader:  # still loading: nothing to shut down politely
        os.killpg(0, signal.SIGKILL)
    if leader:
        killer = threading.Timer(grace_s, os.killpg, (0, signal.SIGKILL))
        killer.daemon = True
        killer.start()
    if state is not None:
        with contextlib.suppress(Exception):
            state.engine.shutdown()
    os._exit(code)


_address = ""  # the engine's socket, or a TCP service's port file (set by main)
_stopping = threading.Event()  # set by stop(): no connection is served from then on
_terminated = False  # set by the SIGTERM handler (terminated), without a lock: the watch stops the engine
_dying = threading.Event()  # set by died(): no request is answered from then on
_dying_lock = threading.Lock()  # died() is called from the serve threads, vLLM's event loop and the watch
_own_group = False  # the client started it in a session of its own (set by main)


def thread_settings() -> dict:
    """This process's thread settings: torch's intra-op threads (where torch is loaded) and its thread variables
    (:func:`mars2.cpu.thread_environment`)."""
    from mars2.cpu import thread_environment

    torch = sys.modules.get("torch")
    return {"torch": torch.get_num_threads() if torch is not None else None,
            **{k: os.environ.get(k) for k in thread_environment(1)}}


def start_engine(spec: dict):
    """The engine a spec names (kind "transformers" or "vllm")."""
    if spec["kind"] == "vllm":
        from mars2.backends.vllm_engine import VLLMEngine

        return VLLMEngine(spec["vllm"], spec.get("stop_token_ids") or [])
    if spec.get("threads"):
        import torch

        torch.set_num_threads(int(spec["threads"]))
    return TransformersEngine(spec["model_dir"], spec["tokenizer_dir"], spec["device"], spec["dtype"],
                              int(spec["batch_size"]))


def main(address: str, spec_json: str) -> None:
    from multiprocessing.connection import Listener

    parent_at_start = os.getppid()  # the client, or an interpreter wrapper that did not exec
    global _address, _own_group
    spec = json.loads(spec_json)
    _address = spec["port_file"] if address.startswith(TCP) else address
    _own_group = bool(spec.get("own_group"))
    ends = {"client_pid": int(spec.get("parent_pid") or 0), "parent_at_start": parent_at_start,
            "stop_file": spec.get("stop_file") or ""}
    signal.signal(signal.SIGTERM, terminated)
    loaded = threading.Event()
    # the main thread is inside the load (minutes for a large vLLM model): another thread watches meanwhile
    threading.Thread(target=supervise, args=(None,), kwargs={**ends, "until": loaded}, daemon=True,
                     name="load-watch").start()
    state = EngineState(start_engine(spec), spec["model_dir"], spec["version"])
    loaded.set()
    if _terminated:  # SIGTERM came at the end of the load, which the load-watch may have missed: no one attaches
        stop(state)
    authkey = bytes.fromhex(os.environ.pop("MARS2_ENGINE_AUTHKEY"))
    if address.startswith(TCP):  # no key here: each connection proves it in its own thread (accept_forever)
        listener = tcp_listener(address[len(TCP):], os.environ.get(ENGINE_PORTS))
        write_port(spec["port_file"], listener.address[1])
    else:
        listener = Listener(address, family="AF_UNIX")
    threading.Thread(target=accept_forever, args=(listener, state, authkey), daemon=True).start()
    supervise(state, **ends, idle_exit_s=float(spec.get("idle_exit_s") or 0))


ENGINE_PORTS = "MARS2_ENGINE_PORTS"  # "first-last": the ports TCP services may listen on (a container publishes them)


def engine_ports(text: str) -> range:
    """``"first-last"`` (or one port) as the range of ports a TCP service may listen on."""
    first, _, last = text.strip().partition("-")
    try:
        ports = range(int(first), int(last or first) + 1)
    except ValueError:
        ports = range(0)
    if not ports or ports.start < 1 or ports.stop > 65536:
        raise ValueError(f"${ENGINE_PORTS}={text!r}: write a port range as first-last, e.g. 29600-29615")
    return ports


def tcp_listener(host: str, ports: str | None):
    """A TCP ``Listener`` at ``host``: on the first free port of ``ports`` (``$MARS2_ENGINE_PORTS``), else on any free
    port. A node whose services other nodes reach through published ports (a container) names the range."""
    from multiprocessing.connection import Listener

    if not ports:
        return Listener((host, 0), family="AF_INET")
    for port in engine_ports(ports):
        try:
            return Listener((host, port), family="AF_INET")
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"every port of ${ENGINE_PORTS}={ports} is in use at {host}: one engine service "
                                    "listens on each; widen the range (and the ports the node publishes)")


def write_port(path: str, port: int) -> None:
    """The port, written whole (temp file + rename; mars2.io would bring pandas into vLLM's environment)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


HANDSHAKES_AT_ONCE = 32  # connections still proving the key; more are closed at once (a burst of silent peers)


def accept_forever(listener, state: EngineState, authkey: bytes) -> None:
    """Serve each connection in a thread of its own, which first checks its key: a peer that never finishes the
    handshake holds up no other, and at most :data:`HANDSHAKES_AT_ONCE` wait in theirs (a burst of silent peers
    cannot take every file descriptor). A failed accept is retried after a pause (out of descriptors, it would
    fail again at once). If this loop itself fails, the engine stops (a live engine that no longer accepts would
    leave its clients waiting)."""
    handshakes = threading.BoundedSemaphore(HANDSHAKES_AT_ONCE)
    try:
        while True:
            try:
                conn = listener.accept()
            except OSError:
                time.sleep(0.05)  # a peer that went away before it was accepted, or no descriptor left
                continue
            if _stopping.is_set() or not handshakes.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=authenticated_serve, args=(conn, state, authkey, handshakes), daemon=True).start()
    except BaseException:
        stop(state)


def authenticated_serve(conn, state: EngineState, authkey: bytes, handshakes: threading.BoundedSemaphore) -> None:
    """Serve ``conn`` once its peer has proved the key (a TCP one kept alive: a peer node gone without closing ends
    the connection, so an idle service still sees that no stage is connected); a peer that fails or stalls is
    dropped. The handshake's place in ``handshakes`` is given back either way."""
    from multiprocessing import AuthenticationError

    try:
        keep_alive(conn)
        authenticate(conn, authkey, serving=True)
    except (AuthenticationError, EOFError, OSError):
        conn.close()
        return
    finally:
        handshakes.release()
    if _stopping.is_set():  # proved its key while the engine was on its way out
        conn.close()
        return
    serve(conn, state)


def supervise(state: EngineState | None, *, client_pid: int = 0, parent_at_start: int = 0, stop_file: str = "",
              idle_exit_s: float = 0.0, poll_s: float = 0.5, until: threading.Event | None = None) -> None:
    """The main thread's loop: it sleeps until the engine's end has come, then stops it. While the model loads
    (``state`` None), the same watch runs on a thread of its own until ``until`` is set, and an end kills the
    process group (the load's children with it).

    - A child engine (``client_pid`` ≠ 0): its client has exited, or it has been re-parented. The parent is
      compared with the one at start, not with the client: an interpreter wrapper that does not exec (``conda
      run``) sits between them.
    - A node service (``stop_file``; it outlives the stage that started it): its run's STOP file appears, or no
      stage has been connected for ``idle_exit_s``.
    - Any engine: SIGTERM came (:func:`terminated` records it; the parent-death signal of a child engine).
    - Any loaded engine: it died (:func:`died`), also while no request was in flight, and while a control call
      (reload, sleep, wake) waits: vLLM never answers one in flight when its engine core dies.

    The main thread only sleeps here, for signals that could otherwise be lost: Python runs a handler only on the
    main thread, and only once it runs bytecode, so a main thread blocked in ``accept()`` never ran the SIGTERM
    handler when the kernel delivered the signal to another thread (gVisor may pick any thread). And where the
    parent-death signal is not honoured at all, the client's exit still shows here."""
    idle_since = time.monotonic()
    while True:
        if until is None:
            time.sleep(poll_s)
        elif until.wait(poll_s):
            return  # loaded: the main thread watches from here on, and stops the engine politely
        if _terminated:
            stop(state)
        if client_pid and (os.getppid() != parent_at_start or not alive(client_pid)):
            stop(state)
        if stop_file and os.path.exists(stop_file):
            stop(state)
        if state is None:
            continue
        if state.engine.dead:
            died(state)
        if state.connections:
            idle_since = time.monotonic()
        elif stop_file and idle_exit_s > 0 and time.monotonic() - idle_since > idle_exit_s:
            stop(state)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


if __name__ == "__main__":
    main(*sys.argv[1:])
