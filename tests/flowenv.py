"""The environment of a flow a test starts as a subprocess, and the one Prefect server such flows report to.

With no ``PREFECT_API_URL`` every flow process starts Prefect's temporary server and stops it when it ends: ~8 s
of a flow run's ~25 s when everything comes from cache (server import, start-up, health wait). The README's
default path keeps exactly that, and the tests of it (``tests/flows/test_train_cycle.py``, the SIGTERM test) still
start flows that way (``embedded=True``). Every other flow a test starts talks to one ``prefect server start`` per test
process, started on first use and stopped at the end of the session (``conftest.py``), as a team's flows talk
to the stack's server. Stage caches live in each run folder, never in the server, so tests still share nothing
but run history.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

_server: dict = {}

# The random-initialised tiny team: flow tests run the machinery, not the method, and need no warm-start (the default
# team, tiny_cpu_warm, spends ~2 minutes on it). A test picking another preset replaces this.
RANDOM_TEAM = ["agents=tiny_cpu", "data=toy"]


# What this server never needs (no deployments, workers, schedules or automations): each service's loop costs CPU
# all session long, which the flows beside it on two cores need. Flow, task run and log records stay.
IDLE_SERVICES = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "REPOSSESSOR", "TRIGGERS", "PAUSE_EXPIRATIONS",
                 "CANCELLATION_CLEANUP", "DB_VACUUM", "CLEANUP_RECONCILER")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefect_api_url() -> str:
    """The shared test server's API URL; the server starts on the first call, with its own SQLite database (next to
    this process's ``PREFECT_HOME``, whose database the temporary servers of embedded flows use)."""
    if "url" in _server:
        return _server["url"]
    home = Path(os.environ["PREFECT_HOME"]).with_name("prefect-test-server")
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           **{f"PREFECT_SERVER_SERVICES_{s}_ENABLED": "false" for s in IDLE_SERVICES}}
    env.pop("PREFECT_API_URL", None)
    log = (home / "test-server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port), "--no-ui"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the test Prefect server exited: {(home / 'test-server.log').read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline:
            stop_server()
            raise RuntimeError("the test Prefect server did not answer /health in 120 s")
        time.sleep(0.5)
    _server.update(url=url, proc=proc)
    return url


def stop_server() -> None:
    """Stop the shared server (and its process group) if it was started."""
    proc = _server.pop("proc", None)
    _server.pop("url", None)
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def flow_env(home: Path | str | None, *, embedded: bool = False) -> dict[str, str]:
    """Environment for ``flows/<script>.py`` run in ``home`` (``None``: leave ``MARS2_HOME`` unset), offline, with
    no tracking server from the environment; ``embedded``: Prefect's temporary server, as a user's default run."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if home is None:
        env.pop("MARS2_HOME", None)
    else:
        env["MARS2_HOME"] = str(home)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_API_URL", None)
    if not embedded:
        env["PREFECT_API_URL"] = prefect_api_url()
    return env
