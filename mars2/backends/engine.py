"""A long-lived generation engine per weight owner, and its client.

The engine is a process that loads an agent's model once and then serves generation requests; after an update it
loads the new weights *in place* (same process, same memory), tagged with a version. Every request names the
version it wants, and an engine holding another version refuses it: a request for version V is never answered by
V−1. The protocol (pickled tuples over an authenticated ``multiprocessing.connection`` socket; every message carries
an id, every answer names the id it answers, and answers come back in the order requests finish):

    (id, "sample", version, prompt, sampling_params_dict, sample_seed) → (id, "ok", Generation)
    (id, "load", model_dir, version)                                   → (id, "ok", version)
    (id, "sleep")                                                      → (id, "ok", None)
    (id, "health")                   → (id, "ok", {"version", "pid", "model_dir", "asleep", "dead", "threads",
                                                    engine counters})
    (id, "shutdown")                                                   → (id, "ok", None), then the process exits
    any request that fails                                             → (id, "error", message)
    any request once the engine died                 → no answer: the process exits (code 70), the client restarts it

A "sample" request joins the engine's running batch at its next decode step (transformers: continuous batching,
:mod:`mars2.backends.continuous`; vLLM: ``AsyncLLM``), so many requests are in flight at once and each is answered
when it finishes. A "load" or "sleep" waits until no request is waiting or running; a load copies the new weights
in, a sleep moves them off the accelerator until the next request. A request that names another version than the
engine holds is refused.

:class:`EngineClient` implements :class:`~mars2.backends.base.GenerationBackend` (``generate(prompts, params,
seeds)``) and the streaming ``submit(prompt, params, seed) → Future[Generation]`` the tree search uses. It starts
the engine (``python -m mars2.backends.engine_server``: transformers on CPU or one GPU, or vLLM in its own
environment), restarts it once if it crashes or its engine dies (with the latest weights, sending again every
request not yet answered; one that crashed asleep, at the next request; a second crash is an :class:`EngineError`
naming the agent), and stops it on :meth:`close`, at exit, and — through ``PR_SET_PDEATHSIG`` — when the client's
process dies, so no engine outlives its run. With ``service_dir`` the engine is instead a node service shared by the
stages of a run on one node, and with ``provide`` one on another node, reached over TCP (see :class:`EngineClient`).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from multiprocessing import AuthenticationError
from pathlib import Path

from mars2.backends.base import (HANDSHAKE_S, SERVICE_IDLE_EXIT_S, Generation, SamplingParams, authenticate,
                                 call_seeds, disconnect, keep_alive, request_seed)
from mars2.backends.vllm_env import engine_environment
from mars2.io import atomic_write_text
from mars2.procs import exit_code, kill_group, popen_bound, wait_exit, wait_group_gone

STOP_FILE = "STOP"  # in a run's engine folder: every node service of the run stops
# how long a killed local engine's processes are waited for to be gone (their memory free): before a sleep that was in
# flight counts as done, and before the engine is started again
GROUP_GONE_S = 10.0
STARTS_FILE = "starts"  # a run's engine folder: a line per start on a worker ("<agent> <node> <pid>|fresh|failed")
NODE_NAME = "MARS2_NODE_NAME"  # the node's name in a run's engine folder (default: its host name)
NODE_ADDRESS = "MARS2_NODE_ADDRESS"  # the address other nodes reach this one's TCP services at (default: its FQDN)
BIND_ADDRESS = "MARS2_ENGINE_BIND_ADDRESS"  # the interface TCP services listen on (default: the node address)


def node_name() -> str:
    """This machine's name among the run's nodes: ``$MARS2_NODE_NAME``, else its host name."""
    return os.environ.get(NODE_NAME) or socket.gethostname()


def boot_id() -> str:
    """This machine's kernel boot id: the same in every container on one host, different across hosts; a record
    with another one is never this node's, whatever the two nodes are called."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's pid namespace (``/proc/self/ns/pid``): a pid in a record means a process here only when the
    record was written in this namespace (two containers of one host, even given one node name, have two)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def node_address() -> str:
    """Where other nodes reach this node's TCP services: ``$MARS2_NODE_ADDRESS``, else the host's FQDN."""
    return os.environ.get(NODE_ADDRESS) or socket.getfqdn()


def bind_address() -> str:
    """The interface this node's TCP services listen on: ``$MARS2_ENGINE_BIND_ADDRESS``, else :func:`node_address`.
    In a container on a bridge network the node's address is the host's, not an interface of the container: there
    the services listen on ``0.0.0.0`` and the host publishes their ports (``$MARS2_ENGINE_PORTS``)."""
    return os.environ.get(BIND_ADDRESS) or node_address()


class EngineError(RuntimeError):
    """An engine failed in a way the client cannot repair (named agent, what happened). Raised while a client is
    being made, ``starts`` is the number of engine processes it had started: a failed start costs its time too."""

    starts: int = 0


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
    threads: int = 0  # the engine's CPU threads (transformers: torch's intra-op; vLLM on a CPU: OpenMP); 0: default
    kind: str = "transformers"  # or "vllm": AsyncLLM in the GPU worker's vLLM environment
    python: str = ""  # the interpreter of the engine's environment ("" = this one; vLLM: $MARS2_VLLM_PYTHON)
    vllm: dict | None = None  # vLLM engine arguments (kind "vllm"; "model" follows model_dir)
    stop_token_ids: tuple[int, ...] = ()  # every end token of the model (kind "vllm")
    cuda_visible_devices: str | None = None  # the GPUs the engine process sees (the plan's placement); None: inherited


def connect(address: str | tuple[str, int], authkey: bytes, timeout_s: float):
    """A ``Client`` connection to an engine (a Unix socket's path, or (host, port)) whose connect and key handshake
    each give up after ``timeout_s`` (:func:`~mars2.backends.base.authenticate`): an address whose packets are
    dropped fails then, not after the kernel's minutes of retries. A TCP connection keeps alive
    (:func:`~mars2.backends.base.keep_alive`)."""
    from multiprocessing.connection import Connection

    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(timeout_s)
        s.connect(tuple(address) if family == socket.AF_INET else address)
        s.settimeout(None)
        conn = Connection(s.detach())
    try:
        keep_alive(conn)
        authenticate(conn, authkey, serving=False, timeout_s=timeout_s)
    except BaseException:
        conn.close()
        raise
    return conn


class EngineClient:
    """The client side of one engine (see the module docstring); ``starts`` counts engine processes started.

    ``service_dir`` (``orchestration=pools``: ``<root>/engines/<flow run id>/<node>``): attach to the node's running
    engine of this agent if ``<agent>.json`` there names a live one, else start one detached (its own session, no
    parent-death signal) and register it; :meth:`close` then only disconnects. The service exits when
    ``<service_dir>/../STOP`` appears or after ``idle_exit_s`` with no client connected. ``listen_tcp``: a service
    this client starts listens on TCP (at :func:`node_address`, a free port) and registers ``[node_address(), port]``,
    so that stages on other nodes reach it; else it listens on a Unix socket, for this node only.

    ``provide`` (an engine on another node): ``provide(spec)`` makes that node run this agent's service holding
    ``spec.version`` and returns its registration folder; the client attaches to it over TCP, and after a crash
    calls ``provide`` again (the service is restarted there) instead of starting one here."""

    def __init__(self, spec: EngineSpec, *, start_timeout_s: float = 300.0, restarts: int = 1,
                 service_dir: str | Path | None = None, idle_exit_s: float = SERVICE_IDLE_EXIT_S,
                 listen_tcp: bool = False, provide: Callable[[EngineSpec], Path] | None = None):
        self.spec = spec
        self.provide = provide
        self.listen_tcp = listen_tcp
        self.service_dir = Path(service_dir) if service_dir else None
        self.idle_exit_s = idle_exit_s
        self.start_timeout_s = start_timeout_s
        self.restarts_left = restarts
        self.starts = 0
        self._proc: subprocess.Popen | None = None
        self._pid: int | None = None
        self._pidfd: int | None = None  # an attached local service's (a process another stage started)
        self._conn = None
        self._lock = threading.RLock()  # the connection, the pending table, restarts
        self._send_lock = threading.Lock()  # writes on the connection (a restart's resends come first)
        self._pending: dict[int, tuple[tuple, Future]] = {}
        self._ids = itertools.count()
        self._failed: EngineError | None = None
        self._closing = False
        self._asleep = False  # after sleep(), until a request or load wakes it: a restart puts it back to sleep
        self._lost = False  # it died asleep (nothing in flight but sleeps): the next request restarts it
        self._folder = Path(tempfile.mkdtemp(prefix=f"mars2-engine-{spec.agent}-"))  # node-local: the socket
        self._log = self._folder / "engine.log"
        self._authkey = os.urandom(16)
        self._local = True  # the engine runs on this node (its pid is one of this node's processes)
        self._node = node_name()  # the node it runs on
        try:
            if provide is not None:
                self._attach_remote()
            else:
                with self._service_lock():  # no reader thread runs before the handshake is done (see _attach)
                    if not self._attach():
                        self._start()
        except EngineError as e:
            e.starts = self.starts
            raise
        atexit.register(self.close)

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def pid(self) -> int | None:
        return self._pid

    def _attach_remote(self, *, keep_version: bool = False) -> None:
        """Have the agent's node run its service (``provide``), then attach to it over TCP; once more if the attach
        fails (the service may have ended between the two: its idle exit, a crash), and that failing too is an
        error."""
        for _ in range(2):
            try:
                self.service_dir = Path(self.provide(self.spec))
            except Exception as e:
                raise EngineError(f"the engine of agent {self.spec.agent!r} on its node could not be provided: "
                                  f"{type(e).__name__}: {e}") from e
            if self._attach(keep_version=keep_version):
                return
        raise EngineError(f"the engine of agent {self.spec.agent!r} was provided on its node twice but cannot be "
                          f"reached from {node_name()}: {self.service_dir / (self.spec.agent + '.json')}; is "
                          f"${NODE_ADDRESS} on that node an address this one can connect to?")

    @contextlib.contextmanager
    def _service_lock(self):
        """A node service's start or attach is one at a time per agent on the node (stages may run side by side)."""
        if self.service_dir is None:
            yield
            return
        import fcntl

        self.service_dir.mkdir(parents=True, exist_ok=True)
        with open(self.service_dir / f"{self.spec.agent}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _attach(self, *, keep_version: bool = False) -> bool:
        """Connect to the node's running service for this agent, if there is one. Its weights stay as they are
        (``load`` moves them to the version a stage wants), unless ``keep_version`` (a restart after the service
        crashed, which another stage may have restarted already): then it loads this client's version first.

        The handshake (health, and that load) is answered here, before the reader thread starts: a service that
        dies meanwhile is an EOF here, not a reader that waits for the service lock this thread holds. A service
        whose engine died (its health says ``dead``; it is ending) counts as none."""
        if self.service_dir is None:
            return False
        info = self.service_dir / f"{self.spec.agent}.json"
        if not info.exists():
            return False
        record = json.loads(info.read_text())
        local = (record.get("node", node_name()) == node_name() and record.get("boot_id", boot_id()) == boot_id()
                 and record.get("pidns", pid_namespace()) == pid_namespace())
        address = tuple(record["address"]) if record.get("family") == "AF_INET" else record["address"]
        pidfd = None
        try:
            if local:  # held while attached: _kill signals the service's group only while this names it
                pidfd = os.pidfd_open(record["pid"])
            conn = connect(address, bytes.fromhex(record["authkey"]), min(HANDSHAKE_S, self.start_timeout_s))
        except (OSError, EOFError, AuthenticationError):
            if pidfd is not None:
                os.close(pidfd)
            return False  # gone (or going): start one
        try:
            held = self._handshake(conn, "health")
            if held.get("dead"):  # on its way out (engine_server.died): as good as gone
                raise EOFError
            if held["version"] is None or (keep_version and held["version"] != self.spec.version):
                # no time limit: a load waits for the requests other stages have in flight, as load() does
                self._handshake(conn, "load", self.spec.model_dir, self.spec.version, limited=False)
            else:
                self.spec = replace(self.spec, model_dir=held["model_dir"], version=held["version"])
        except (OSError, EOFError):
            conn.close()  # it died during the handshake (no reader runs yet): start one
            self._close_pidfd(pidfd)
            return False
        except EngineError:
            conn.close()  # alive but unusable: a second copy of the weights on the node would not help
            self._close_pidfd(pidfd)
            raise
        self._close_pidfd(self._pidfd)
        self._conn, self._pid, self._authkey = conn, record["pid"], bytes.fromhex(record["authkey"])
        self._pidfd = pidfd
        self._proc = None  # another process's child: _kill signals it by pid (on this node only)
        self._local, self._node = local, record.get("node", node_name())
        self._log = Path(record["log"])
        threading.Thread(target=self._read, args=(conn,), name=f"engine-{self.spec.agent}", daemon=True).start()
        return True

    def _handshake(self, conn, *message, limited: bool = True):
        """One request answered on ``conn`` before its reader thread runs (nothing else is in flight on it), within
        ``start_timeout_s`` if ``limited``."""
        request_id = next(self._ids)
        conn.send((request_id, *message))
        if not conn.poll(self.start_timeout_s if limited else None):
            raise EngineError(f"the node service of agent {self.spec.agent!r} did not answer {message[0]!r} in "
                              f"{self.start_timeout_s:.0f} s; its log: {self._log_where()}")
        answer_id, status, value = conn.recv()
        if answer_id != request_id or status != "ok":
            raise EngineError(f"the engine of agent {self.spec.agent!r}: {value}")
        return value

    def _start(self) -> None:
        socket_path = str(self._folder / f"engine-{self.starts}.sock")
        port_file = self._folder / f"engine-{self.starts}.port"
        address = f"tcp:{bind_address()}" if self.listen_tcp else socket_path
        placed = {"CUDA_VISIBLE_DEVICES": self.spec.cuda_visible_devices} if self.spec.cuda_visible_devices else {}
        on_cpu = self.spec.device.startswith("cpu")
        env = engine_environment(self.spec.python, {**os.environ, "MARS2_ENGINE_AUTHKEY": self._authkey.hex(), **placed},
                                 cpu_threads=self.spec.threads if on_cpu else 0)
        spec = asdict(self.spec) | {"own_group": True}  # started in a session of its own, below
        if self.spec.kind == "vllm":  # started (or restarted) from the latest weights
            spec["vllm"] = {**(self.spec.vllm or {}), "model": self.spec.model_dir}
        if self.listen_tcp:
            spec.update(port_file=str(port_file))
        if self.service_dir is not None:
            spec.update(stop_file=str(self.service_dir.parent / STOP_FILE), idle_exit_s=self.idle_exit_s)
        else:  # watched by the engine too: the parent-death signal may be lost (engine_server.supervise)
            spec.update(parent_pid=os.getpid())
        args = [self.spec.python or sys.executable, "-m", "mars2.backends.engine_server", address, json.dumps(spec)]
        log = open(self._log, "ab")  # noqa: SIM115 - the engine's process owns it
        try:
            if self.service_dir is None:  # a child of this process: it dies with it
                # in a session of its own: a signal to the run's process group (Ctrl-C) reaches the run, which
                # closes its engines, instead of killing the engine behind its back (the reader would restart it)
                self._proc = popen_bound(args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)
            else:  # a node service: outlives this stage, stops at the run's STOP file or when idle
                self._proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True)
        except OSError as e:  # e.g. no such interpreter ($MARS2_VLLM_PYTHON)
            raise EngineError(f"the engine of agent {self.spec.agent!r} could not be started with {args[0]!r}: "
                              f"{e}") from e
        finally:
            log.close()
        self._pid = self._proc.pid
        self.starts += 1
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if exit_code(self._proc) is not None:
                code = kill_group(self._proc)  # and what it had started (vLLM's engine core)
                raise EngineError(f"the engine of agent {self.spec.agent!r} exited with code {code} "
                                  f"while starting; its log: {self._log_where()}\n{self._log_tail()}")
            listening = port_file.exists() if self.listen_tcp else os.path.exists(socket_path)
            if listening:
                where = (node_address(), int(port_file.read_text())) if self.listen_tcp else socket_path
                try:
                    self._conn = connect(where, self._authkey, max(1.0, min(HANDSHAKE_S, deadline - time.monotonic())))
                    break
                except (OSError, EOFError, AuthenticationError):
                    pass  # not listening yet, or exiting: the poll above tells
            if time.monotonic() > deadline:
                self._kill()
                reach = f" (or {node_address()} does not reach this node: ${NODE_ADDRESS})" \
                    if self.listen_tcp and port_file.exists() else ""
                raise EngineError(f"the engine of agent {self.spec.agent!r} did not start in "
                                  f"{self.start_timeout_s:.0f} s{reach}")
            time.sleep(0.05)
        threading.Thread(target=self._read, args=(self._conn,), name=f"engine-{self.spec.agent}", daemon=True).start()
        if self.service_dir is not None:  # mode 0600 (atomic_write_text): it holds the authkey
            family = "AF_INET" if self.listen_tcp else "AF_UNIX"
            atomic_write_text(self.service_dir / f"{self.spec.agent}.json", json.dumps(
                {"address": list(where) if self.listen_tcp else where, "family": family, "node": node_name(),
                 "boot_id": boot_id(), "pidns": pid_namespace(), "authkey": self._authkey.hex(), "pid": self._pid,
                 "log": str(self._log)}))
            with open(self.service_dir.parent / STARTS_FILE, "a") as starts:  # one short line: an atomic append
                starts.write(f"{self.spec.agent} {node_name()} {self._pid}\n")

    def _log_where(self) -> str:
        """The engine's log file, and its node when that is another one (the path is that machine's)."""
        return str(self._log) if self._local else f"{self._log} on node {self._node}"

    def _log_tail(self, lines: int = 15) -> str:
        """The end of the engine's log, read here; empty for an engine on another node."""
        path = self._log
        if not self._local or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _send(self, *message) -> Future:
        """Send one request; its answer resolves the returned future (an error answer: :class:`EngineError`)."""
        future: Future = Future()
        with self._lock:
            if self._failed is not None:
                raise self._failed
            if message[0] in ("sample", "load"):
                self._asleep = False
            elif message[0] == "sleep":  # from now on: a death before its answer is read is one while asleep
                self._asleep = True
            if self._lost and message[0] == "sleep":  # asleep it stays, without a start: the next request starts it
                future.set_result(None)
                return future
            if self._lost:  # it died while asleep: started again now, before this request
                resend = self._restart()
                if resend is None:
                    raise self._failed
                with self._send_lock:  # at most a sleep: small, sent under self._lock
                    self._send_all(self._conn, resend)
            request_id = next(self._ids)
            self._pending[request_id] = (message, future)
            conn = self._conn
        with self._send_lock:  # not under self._lock: the reader needs that to take answers off a full socket
            try:
                conn.send((request_id, *message))
            except OSError:
                pass  # the reader sees the engine gone and sends it again after the restart
        return future

    def _read(self, conn) -> None:
        """Resolve each answer's future; when the connection breaks, restart the engine once (or fail)."""
        while True:
            try:
                request_id, status, value = conn.recv()
            except (EOFError, OSError):
                with self._lock:  # disconnect() runs under it: the descriptor is not freed under its feet
                    conn.close()
                break
            with self._lock:
                message, future = self._pending.pop(request_id, (None, None))
                if status == "ok" and message is not None and message[0] == "load":
                    # before its caller learns of it: a restart from here on loads the new version
                    self.spec = replace(self.spec, model_dir=message[1], version=message[2])
            if future is None:
                continue
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(EngineError(f"the engine of agent {self.spec.agent!r}: {value}"))
        with self._lock:
            if self._closing or conn is not self._conn:
                return
            self._kill()
            sleeps = all(message[0] == "sleep" for message, _ in self._pending.values())
            # between stages: restarted by the next request, not now, when the update may hold the accelerator (a
            # start would fail or take its memory); a sleep in flight is done once the engine is gone, which only a
            # local engine is for sure (_kill killed its group; one on another node may have lost only its link)
            lost = self._asleep and (not self._pending or sleeps and self._local)
            if lost:
                sleeping, self._pending = list(self._pending.values()), {}
                self._lost = True
                group = self._pid if sleeping else None
            else:
                resend = self._restart()
                if resend is None:
                    return
                new = self._conn
                self._send_lock.acquire()  # requests sent from now on go after the resent ones
        if lost:
            if group is not None:
                wait_group_gone(group, GROUP_GONE_S)  # its memory freed before the update takes the device
            for _, future in sleeping:
                future.set_result(None)
            return
        try:  # without self._lock: the new reader takes answers off the socket meanwhile (a large resend could fill
            self._send_all(new, resend)  # it while the engine waits for its answers to be read)
        finally:
            self._send_lock.release()

    def _restart(self) -> list | None:
        """Start the engine again (once), from the latest weights, holding ``self._lock``; the requests to send it
        again (and a sleep first, while the engine was asleep), or None when it could not be (the callers waiting
        on it have failed)."""
        self._lost = False
        if self.restarts_left <= 0:
            self._fail(EngineError(f"the engine of agent {self.spec.agent!r} crashed and was already restarted "
                                   f"once; its log: {self._log_where()}\n{self._log_tail()}"))
            return None
        self.restarts_left -= 1
        try:
            if self.provide is not None:  # its node restarts it (or another stage has already)
                self._attach_remote(keep_version=True)
            else:
                with self._service_lock():  # a shared service may have been restarted by another stage already
                    if not self._attach(keep_version=True):
                        if self._local and self._pid is not None:  # what the killed one held is free first
                            wait_group_gone(self._pid, GROUP_GONE_S)
                        self._start()  # from the latest weights (self.spec)
        except BaseException as e:  # whatever it is, the callers waiting on this engine hear of it
            self._fail(e if isinstance(e, EngineError) else EngineError(
                f"the engine of agent {self.spec.agent!r} crashed and its restart failed: {type(e).__name__}: "
                f"{e}; its log: {self._log_where()}"))
            if not isinstance(e, Exception):  # Ctrl-C on the caller restarting it: the run is interrupted, not failed
                raise
            return None
        resend = [(request_id, message) for request_id, (message, _) in sorted(self._pending.items())]
        if self._asleep and not any(message[0] == "sample" for _, message in resend):
            resend.insert(0, (next(self._ids), ("sleep",)))  # it crashed between stages: keep the device free
        return resend

    def _send_all(self, conn, resend: list) -> None:
        """Send ``resend`` (``(request_id, message)`` pairs) on a new engine's connection, ``self._send_lock`` held by
        the caller."""
        try:
            for request_id, message in resend:
                conn.send((request_id, *message))
        except OSError:
            pass  # the new engine is gone too: its reader restarts or fails

    def _fail(self, error: EngineError) -> None:
        self._failed = error
        pending, self._pending = self._pending, {}
        for _, future in pending.values():
            future.set_exception(error)

    def _call(self, *message):
        return self._send(*message).result()

    def submit(self, prompt: str, params: SamplingParams, seed: int) -> Future:
        """One request → ``Future[Generation]``: the first of ``generate([prompt], params, [seed])``'s samples."""
        return self._send("sample", self.spec.version, prompt, vars(params), request_seed(seed, 0))

    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """Generations of the engine's current version (``self.version``) for each prompt: sample j of prompt i is
        the request seeded ``request_seed(seeds[i], j)``, as in-process. Sent shortest prompt first, as in-process:
        the engine admits in arrival order, and rows admitted together then pad less (docs/engines.md)."""
        seeds = call_seeds(params, prompts, seeds)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        futures = {(i, j): self._send("sample", self.spec.version, prompts[i], vars(params), request_seed(seeds[i], j))
                   for i in order for j in range(params.n)}
        return [[futures[i, j].result() for j in range(params.n)] for i in range(len(prompts))]

    def load(self, model_dir: str, version: str) -> None:
        """Load ``model_dir``'s weights into the running engine, in place, as ``version``, once every request sent
        before has been answered; the next requests ask for that version. A restart after a crash starts from this
        folder."""
        if version == self.spec.version:
            return
        self._call("load", str(model_dir), version)  # the reader records the new spec when the answer comes

    def health(self) -> dict:
        return self._call("health")

    def _kill(self) -> None:
        """Disconnect, and kill the engine with its process group (it leads its own session): vLLM's engine-core
        and worker processes go with it."""
        if self._conn is not None:
            disconnect(self._conn)
        if self._proc is not None:  # even when it has exited: its group outlives it (a crashed vLLM's children)
            kill_group(self._proc)
        elif self._pidfd is not None:  # a node service another stage started on this node (on another node: only
            with contextlib.suppress(ProcessLookupError, PermissionError):  # disconnected, its own node restarts it)
                signal.pidfd_send_signal(self._pidfd, 0)  # not yet reaped: its group id is still its own
                os.killpg(self._pid, signal.SIGKILL)
            self._close_pidfd(self._pidfd)

    def _close_pidfd(self, pidfd: int | None) -> None:
        if pidfd is not None:
            os.close(pidfd)
            if pidfd == self._pidfd:
                self._pidfd = None

    def sleep(self) -> None:
        """Free the accelerator for other stages (the update) once the engine's requests are done: a vLLM engine
        discards its weights and caches (sleep level 2), and the next load, or a request, wakes it and loads weights
        again (the new folder, or the one it held); the transformers engine moves its weights to host memory."""
        self._call("sleep")

    def close(self) -> None:
        """Stop the engine (politely, then by force); idempotent. A node service is only disconnected from: the
        next stage on the node attaches to it, and it stops at the run's end (its STOP file) or when idle."""
        with self._lock:
            if self._pid is None:
                return
            self._closing = True
            proc = self._proc
            if self.service_dir is not None:
                if self._conn is not None:
                    disconnect(self._conn)
                self._close_pidfd(self._pidfd)
                self._pid = self._proc = None
                self._fail(EngineError(f"the engine of agent {self.spec.agent!r} was closed"))
                if not self.starts:  # attached only: the folder made for a start was never used
                    shutil.rmtree(self._folder, ignore_errors=True)
                return
        clean = False
        if exit_code(proc) is None and self._failed is None:
            try:
                self._send("shutdown").result(timeout=10)
                clean = wait_exit(proc, 10) == 0
            except (EngineError, OSError, TimeoutError):
                pass
        with self._lock:
            self._kill()
            self._proc = self._pid = None
            troubled = not clean or self.starts > 1  # its log tells what happened: kept
            self._fail(EngineError(f"the engine of agent {self.spec.agent!r} was closed"))
        if not troubled:
            shutil.rmtree(self._folder, ignore_errors=True)  # its socket and log
