"""Engines on other nodes (orchestration.node_pools): a generation stage reaches an owner's engine that runs as a
node service elsewhere, over TCP. "Another node" here is another process with its own ``MARS2_NODE_NAME`` running
the real ``pipeline.dispatch.serve_engine`` (what a ``serve_engine`` flow run on that node's pool runs); the
Prefect round trip is in tests/flows/test_deploy.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mars2.backends import SamplingParams
from mars2.backends.engine import NODE_ADDRESS, NODE_NAME, EngineClient, EngineError, EngineSpec
from mars2.backends.transformers_backend import load_transformers_backend
from mars2.config import BackendConfig
from pipeline.dispatch import encode_args
from stagekit.engines import EnginePool
from stagekit.stage import StageContext
from tests.pids import alive, gone_within

PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=0)
SERVE = """
import json, sys
from pipeline.dispatch import decode_args, serve_engine
print(serve_engine(**decode_args(serve_engine, json.loads(sys.argv[1]))))
"""


def serve_on(node: str, ctx: StageContext, backend: BackendConfig, spec: EngineSpec) -> str:
    """What a ``serve_engine`` flow run on ``node``'s pool does: the real ``serve_engine``, in a process of its own
    whose node name is ``node``; returns its registration folder."""
    args = json.dumps(encode_args({"ctx": ctx, "spec": spec, "backend": backend}))
    out = subprocess.run([sys.executable, "-c", SERVE, args], env={**os.environ, NODE_NAME: node},
                         capture_output=True, text=True, timeout=backend.start_timeout_s + 60)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
def two_nodes(tmp_path, monkeypatch):
    """This process is node-a; ``provide`` serves an owner's engine on node-b (a process of its own), as the
    ``serve_engine`` flow run on node-b's pool does. Both nodes are reached at 127.0.0.1."""
    monkeypatch.setenv(NODE_NAME, "node-a")
    monkeypatch.setenv(NODE_ADDRESS, "127.0.0.1")
    ctx = StageContext(root=str(tmp_path), flow_run_id="run-1", engine_pools={"qwen_tiny": "gpu-node-b"})
    backend = BackendConfig(start_timeout_s=120, service_idle_exit_s=60)
    calls = []

    def provide(spec: EngineSpec):
        calls.append(spec.version)
        return serve_on("node-b", ctx, backend, spec)

    yield ctx, provide, calls
    (tmp_path / "engines" / "run-1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "engines" / "run-1" / "STOP").write_text("")  # the run's end stops node-b's service


def _ids(out):
    return [[g.response_ids for g in gens] for gens in out]


def test_an_engine_on_another_node_serves_over_tcp_and_is_restarted_by_its_node(tiny_model_dir, tmp_path,
                                                                                  two_nodes):
    """The stage's pool hands out the owner's engine from node-b: registered there on TCP, answering as the model in
    this process does; after it dies, node-b serves it again at the version the stage had loaded, and closing the
    stage only disconnects (the run's STOP file ends the service)."""
    ctx, provide, calls = two_nodes
    _, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    prompts = ["sum two numbers", "x"]
    pool = EnginePool(True, start_timeout_s=120, service_dir=tmp_path / "engines" / "run-1" / "node-a",
                      remote={"qwen_tiny": provide}, listen_tcp=True)
    engine = pool.engine("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), "v1", device="cpu",
                         dtype="float32", batch_size=8)
    try:
        record = json.loads((tmp_path / "engines" / "run-1" / "node-b" / "qwen_tiny.json").read_text())
        assert record["family"] == "AF_INET" and record["node"] == "node-b" and record["address"][0] == "127.0.0.1"
        assert oct((tmp_path / "engines" / "run-1" / "node-b" / "qwen_tiny.json").stat().st_mode & 0o777) == "0o600"
        assert engine.pid == record["pid"] and calls == ["v1"]
        assert not (tmp_path / "engines" / "run-1" / "node-a").exists()  # nothing was started on this node
        here, _ = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
        assert _ids(engine.generate(prompts, PARAMS, [3, 4])) == _ids(here.generate(prompts, PARAMS, [3, 4]))
        v1 = _ids(engine.generate(prompts, PARAMS, [3, 4]))
        engine.sleep()  # over TCP too: the update's GPUs are freed on node-b
        assert engine.health()["asleep"]

        first = engine.pid
        os.kill(first, signal.SIGKILL)
        assert _ids(engine.generate(prompts, PARAMS, [3, 4])) == v1  # restarted by node-b, not here
        assert calls == ["v1", "v1"] and engine.pid != first and engine.starts == 0
        starts = (tmp_path / "engines" / "run-1" / "starts").read_text().split("\n")
        assert [line.split()[:2] for line in starts if line] == [["qwen_tiny", "node-b"]] * 2
        flows_count = EnginePool(True, start_timeout_s=1, run_dir=tmp_path / "engines" / "run-1").starts
        assert flows_count == 2  # the run's engine_starts counts node-b's starts once, from the run's starts file
    finally:
        pool.close()
    assert alive(engine_pid := json.loads(
        (tmp_path / "engines" / "run-1" / "node-b" / "qwen_tiny.json").read_text())["pid"])
    (tmp_path / "engines" / "run-1" / "STOP").write_text("")
    assert gone_within(engine_pid, 15), "node-b's service outlived the run's STOP file"


def test_a_remote_engine_the_stage_cannot_reach_is_a_clear_error(tiny_model_dir, tmp_path, two_nodes, monkeypatch):
    """node-b advertises an address this node cannot connect to: the stage fails naming the agent and the setting."""
    ctx, provide, _ = two_nodes

    def unreachable(spec):
        folder = provide(spec)
        path = os.path.join(folder, "qwen_tiny.json")
        record = json.loads(open(path).read())
        with open(path, "w") as f:
            json.dump({**record, "address": ["127.0.0.1", 9]}, f)  # the discard port: nothing listens
        return folder

    with pytest.raises(EngineError, match=r"qwen_tiny.*provided on its node twice but cannot be reached.*"
                                          r"MARS2_NODE_ADDRESS"):
        EngineClient(EngineSpec("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), version="v1"),
                     provide=unreachable, start_timeout_s=60)


def test_a_service_that_ends_between_its_provide_and_the_attach_is_provided_again(tiny_model_dir, tmp_path,
                                                                                 two_nodes):
    """node-b's service may end right after ``provide`` returned (its idle exit, a crash): the stage asks node-b
    once more, which starts it again, instead of failing on an address that no longer answers."""
    ctx, provide, calls = two_nodes

    def ends_once(spec):
        folder = provide(spec)
        if len(calls) == 1:
            pid = json.loads((Path(folder) / "qwen_tiny.json").read_text())["pid"]
            os.kill(pid, signal.SIGKILL)
            assert gone_within(pid, 15)
        return folder

    engine = EngineClient(EngineSpec("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), version="v1"),
                          provide=ends_once, start_timeout_s=60)
    try:
        assert calls == ["v1", "v1"] and engine.generate(["x"], PARAMS, [1])
    finally:
        engine.close()


def test_a_remote_owners_gpus_are_mapped_by_its_own_node(monkeypatch):
    """The plan's GPU indices travel as they are to the owner's node, which maps them through its own
    CUDA_VISIBLE_DEVICES (the stage's node may see other GPUs)."""
    from stagekit.runners import engine_placement
    from mars2.config import AgentConfig

    member = AgentConfig(name="a", device="cuda", backend="vllm", gpu_ids=[4, 5, 6, 7])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "8,9,10,11,12,13,14,15")
    assert engine_placement(member) == ("cuda", "12,13,14,15")
    assert engine_placement(member, remote=True) == ("cuda", "4,5,6,7")


def test_a_peer_that_never_proves_the_key_holds_up_no_other(tiny_model_dir, tmp_path, monkeypatch):
    """A TCP service listens where other machines can reach it: a peer that connects and stays silent (a port
    scanner, a client whose node died mid-handshake) must not stop the next stage from attaching, and a client
    whose peer never answers the handshake gives up instead of waiting forever."""
    import socket

    from mars2.backends.engine import connect

    monkeypatch.setenv(NODE_ADDRESS, "127.0.0.1")
    service_dir = tmp_path / "engines" / "run-1" / "node-a"
    first = EngineClient(EngineSpec("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), version="v1"),
                         service_dir=service_dir, listen_tcp=True)
    silent = socket.create_connection(tuple(json.loads((service_dir / "qwen_tiny.json").read_text())["address"]))
    try:
        first.close()
        started = time.monotonic()
        second = EngineClient(EngineSpec("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), version="v1"),
                              service_dir=service_dir, start_timeout_s=60)
        try:
            assert second.starts == 0 and second.generate(["x"], PARAMS, [1])
            assert time.monotonic() - started < 20  # not behind the silent peer's 30 s handshake limit
        finally:
            second.close()
        mute = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and never answers
        started = time.monotonic()
        with pytest.raises((EOFError, OSError)):
            connect(mute.getsockname(), b"k" * 16, timeout_s=1.0)
        assert time.monotonic() - started < 10
        mute.close()
    finally:
        silent.close()
        (service_dir.parent / "STOP").write_text("")


def test_a_start_that_fails_on_the_owners_node_still_counts_in_engine_starts(tmp_path, monkeypatch):
    """serve_engine pays for a start that fails (here an interpreter that exits at once): the run's starts file
    says so, as it does for a start that failed on the flow's own machine."""
    import stat

    from pipeline.dispatch import serve_engine

    monkeypatch.setenv(NODE_NAME, "node-b")
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    ctx = StageContext(root=str(tmp_path), flow_run_id="run-1", engine_pools={"qwen_tiny": "gpu-node-b"})
    with pytest.raises(EngineError, match="exited with code 3"):
        serve_engine(ctx, EngineSpec("qwen_tiny", str(tmp_path), str(tmp_path), "v1", python=str(fake)),
                     BackendConfig(start_timeout_s=30))
    assert (tmp_path / "engines" / "run-1" / "starts").read_text() == "qwen_tiny node-b failed\n"
    assert EnginePool(True, start_timeout_s=1, run_dir=tmp_path / "engines" / "run-1").starts == 1


def test_a_connect_to_an_address_that_never_answers_gives_up_after_its_timeout():
    """A node gone or firewalled drops the connection's packets: the connect itself gives up after the timeout, not
    after the kernel's minutes of retries (here a listener whose backlog is full: the kernel drops the next SYN)."""
    import socket

    from mars2.backends.engine import connect

    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = socket.create_connection(full.getsockname())  # fills the backlog
    try:
        started = time.monotonic()
        with pytest.raises(OSError):
            connect(full.getsockname(), b"k" * 16, timeout_s=1.0)
        assert time.monotonic() - started < 5
    finally:
        queued.close()
        full.close()


def test_connections_between_nodes_keep_alive_and_unix_ones_are_left_as_they_are(tmp_path):
    """A node that dies without closing leaves a TCP peer that only reads waiting forever unless the connection
    probes it: both ends of a TCP engine connection turn keepalive on, with the project's timings."""
    import socket
    from multiprocessing.connection import Client, Listener

    from mars2.backends.base import KEEPALIVE, keep_alive

    with Listener(("127.0.0.1", 0), family="AF_INET") as listener:
        client = Client(listener.address, family="AF_INET")
        server = listener.accept()
        keep_alive(client)
        probe = socket.socket(fileno=os.dup(client.fileno()))
        assert probe.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE[0]
        assert probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEPALIVE[2]
        probe.close()
        unprobed = socket.socket(fileno=os.dup(server.fileno()))
        assert unprobed.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0  # what keep_alive changed
        unprobed.close()
        client.close()
        server.close()
    with Listener(str(tmp_path / "s"), family="AF_UNIX") as listener:
        client = Client(str(tmp_path / "s"), family="AF_UNIX")
        keep_alive(client)  # nothing to do, and no error
        client.send("still works")
        assert listener.accept().recv() == "still works"
        client.close()


def test_a_burst_of_silent_peers_is_cut_to_a_few_handshakes_and_the_service_still_accepts(monkeypatch):
    """Peers past ``HANDSHAKES_AT_ONCE`` still proving the key are closed on arrival (a burst of port scanners
    cannot take every descriptor); once the silent ones go, a new peer gets its handshake again."""
    import socket
    import threading
    from multiprocessing.connection import Listener

    from mars2.backends import engine_server

    monkeypatch.setattr(engine_server, "HANDSHAKES_AT_ONCE", 2)
    monkeypatch.setattr(engine_server, "stop", lambda state: None)  # a failed loop would end this process
    listener = Listener(("127.0.0.1", 0), family="AF_INET")  # left open: the loop's thread waits in accept()
    threading.Thread(target=engine_server.accept_forever, args=(listener, None, b"k" * 16), daemon=True).start()

    def closed_on_arrival() -> bool:
        peer = socket.create_connection(listener.address, timeout=10)
        try:
            peer.settimeout(1.0)
            try:
                first = peer.recv(1)  # a served peer gets the key challenge at once; a refused one, EOF
            except TimeoutError:
                return False
            return first == b""
        finally:
            peer.close()

    silent = [socket.create_connection(listener.address) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10  # once both silent peers are accepted (a loaded machine takes its time)
        while not closed_on_arrival():
            assert time.monotonic() < deadline, "a peer beyond the handshake limit was served"
    finally:
        for peer in silent:
            peer.close()
    deadline = time.monotonic() + 10
    while closed_on_arrival():  # their handshakes end with their EOF
        assert time.monotonic() < deadline, "the handshake places were never given back"
    engine_server._stopping.set()  # an engine on its way out serves no one, even within the limit
    try:
        assert closed_on_arrival()
    finally:
        engine_server._stopping.clear()


def test_an_error_about_a_remote_engine_points_at_its_nodes_log_and_reads_no_local_file(tmp_path):
    """The log path of an engine on another node is that machine's: the message names the node, and no file that
    happens to sit at the same path here is shown as its tail."""
    here = tmp_path / "engine.log"
    here.write_text("a local file, not the engine's log\n")
    client = EngineClient.__new__(EngineClient)
    client._log, client._local, client._node = here, False, "node-b"
    assert client._log_where() == f"{here} on node node-b" and client._log_tail() == ""
    client._local, client._node = True, "node-a"
    assert client._log_where() == str(here) and client._log_tail() == "a local file, not the engine's log"


def test_a_cpu_engine_on_another_node_is_sized_by_the_runs_budget_there(tiny_model_dir, two_nodes):
    """The asking stage's thread count is its own machine's share; the owner's node sizes the engine it starts from
    the run's budget there (here cpus=3, against the stage's 5)."""
    import dataclasses

    ctx, _, _ = two_nodes
    there = dataclasses.replace(ctx, cpus=3)
    backend = BackendConfig(start_timeout_s=120, service_idle_exit_s=60)
    engine = EngineClient(EngineSpec("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), version="v1", threads=5),
                          provide=lambda spec: serve_on("node-b", there, backend, spec), start_timeout_s=60)
    try:
        assert engine.health()["threads"]["torch"] == 3
    finally:
        engine.close()


def _free_port_run(n: int) -> int:
    """The first of ``n`` consecutive ports free on 127.0.0.1 right now."""
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n > 65535:
            continue
        try:
            socks = []
            for p in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no run of free ports")


def _listening_on(port: int) -> str:
    """The IPv4 address a socket listening on ``port`` is bound to, from the kernel's table (/proc/net/tcp)."""
    import socket
    import struct

    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
            return socket.inet_ntoa(struct.pack("<I", int(host, 16)))
    raise AssertionError(f"nothing listens on port {port}")


def test_a_node_service_in_a_container_listens_on_all_interfaces_at_a_published_port(tiny_model_dir, tmp_path,
                                                                                      two_nodes, monkeypatch):
    """A GPU worker in a container (docker-compose.yml, worker-gpu): its services listen on 0.0.0.0 inside it, on the
    ports the host publishes ($MARS2_ENGINE_PORTS), and register the node's own address, which other nodes reach."""
    from mars2.backends.engine import BIND_ADDRESS
    from mars2.backends.engine_server import ENGINE_PORTS

    ctx, provide, _ = two_nodes
    first = _free_port_run(3)
    monkeypatch.setenv(BIND_ADDRESS, "0.0.0.0")
    monkeypatch.setenv(ENGINE_PORTS, f"{first}-{first + 2}")
    pool = EnginePool(True, start_timeout_s=120, service_dir=tmp_path / "engines" / "run-1" / "node-a",
                      remote={"qwen_tiny": provide}, listen_tcp=True)
    try:
        engine = pool.engine("qwen_tiny", str(tiny_model_dir), str(tiny_model_dir), "v1", device="cpu",
                             dtype="float32", batch_size=8)
        record = json.loads((tmp_path / "engines" / "run-1" / "node-b" / "qwen_tiny.json").read_text())
        host, port = record["address"]
        assert host == "127.0.0.1" and first <= port <= first + 2  # the node's address, a published port
        assert _listening_on(port) == "0.0.0.0"
        assert engine.generate(["x"], PARAMS, [1])[0]
    finally:
        pool.close()


def test_engine_ports_take_a_range_and_say_when_it_is_used_up():
    from mars2.backends.engine_server import engine_ports, tcp_listener

    assert engine_ports("29600-29602") == range(29600, 29603) and engine_ports("29600") == range(29600, 29601)
    for bad in ("", "a-b", "29602-29600", "0-3", "65530-70000"):
        with pytest.raises(ValueError, match="MARS2_ENGINE_PORTS"):
            engine_ports(bad)
    first = _free_port_run(2)
    a = tcp_listener("127.0.0.1", f"{first}-{first + 1}")
    b = tcp_listener("127.0.0.1", f"{first}-{first + 1}")
    try:
        assert (a.address[1], b.address[1]) == (first, first + 1)
        with pytest.raises(OSError, match="every port of \\$MARS2_ENGINE_PORTS"):
            tcp_listener("127.0.0.1", f"{first}-{first + 1}")
    finally:
        a.close()
        b.close()
    any_port = tcp_listener("127.0.0.1", None)
    assert any_port.address[1] > 0
    any_port.close()


def test_an_engine_that_fails_to_sleep_does_not_cost_the_stage_its_trees(caplog):
    """vLLM's sleep can raise (its freed-bytes assertion reads device-wide memory); the stage called it before
    writing its trees, so hours of rollout were lost to it. Releasing logs the failure and sleeps the other
    engines; the stage's work stands."""
    from types import SimpleNamespace

    from stagekit.engines import release

    class Engine:
        def __init__(self, fails):
            self.fails, self.slept = fails, False

        def sleep(self):
            if self.fails:
                raise AssertionError("freed_bytes >= 0")
            self.slept = True

    broken, fine = Engine(True), Engine(False)
    release({"a": SimpleNamespace(backend=broken), "b": SimpleNamespace(backend=fine),
             "c": SimpleNamespace(backend=fine)})
    assert fine.slept and "failed to sleep" in caplog.text


def test_an_engine_node_whose_driver_is_too_old_for_cuda_13_says_so_before_starting(tmp_path, monkeypatch):
    """The engine node of a multi-node run checks torch's CUDA before the start (before: only the GPU count and
    memory, which NVML reports even on a driver older than CUDA 13, so vLLM's start failed in its engine core with a
    log tail); the message names the driver and what to do, and nothing is started."""
    import torch

    import mars2.config
    from mars2.config import ConfigError
    from pipeline.dispatch import serve_engine

    monkeypatch.setenv(NODE_NAME, "node-b")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(mars2.config, "nvidia_driver", lambda: "535.104.05")
    ctx = StageContext(root=str(tmp_path), flow_run_id="run-1")
    spec = EngineSpec("qwen", str(tmp_path), str(tmp_path), version="v1", device="cuda:0", kind="vllm")
    with pytest.raises(ConfigError, match=r"engine of agent 'qwen' needs GPUs \(cuda:0\) but node node-b has none: "
                                          r"its NVIDIA driver 535.104.05 is older than CUDA 13 needs"):
        serve_engine(ctx, spec, BackendConfig())
    assert not (tmp_path / "engines").exists()
