"""Process environment for flows, set before Prefect, MLflow or transformers are imported."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path


def run_root() -> Path:
    """The run folder: ``$MARS2_HOME`` or ``./.mars2``."""
    return Path(os.environ.get("MARS2_HOME", ".mars2")).resolve()


def configure_process(temporary_server: bool = False) -> None:
    """Offline hub access, a per-project Prefect home, quiet third-party warnings. Idempotent.

    ``temporary_server=True`` (a flow run from the command line: ``__name__ == "__main__"``) also starts Prefect's
    temporary server now, while this process still imports its modules (:func:`start_temporary_server`)."""
    root = run_root()
    defaults = {
        "PREFECT_HOME": str(root / "prefect"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "DS_BUILD_OPS": "0",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # the embedded server's first start in a run folder registers every block type (~2 s); no stage uses blocks
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
        # the embedded server needs more than Prefect's 20 s to start on a loaded 2-core machine
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "DO_NOT_TRACK": "1",
        # mars2's own warnings (sandbox level, planner, stale stage folders) reach the Prefect run's logs (its UI);
        # records outside a run (a sandbox thread, the command line's checks) stay on the console and in the log file
        "PREFECT_LOGGING_EXTRA_LOGGERS": "mars2,stagekit,tasks,pipeline",
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        # read when torch loads OpenMP, so set here: an idle OpenMP thread sleeps instead of spinning, which on a
        # machine shared by several runs takes the cores their threads need (docs/cpu.md)
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    if "PREFECT_LOGGING_LEVEL" not in os.environ:
        # Prefect's own INFO lines (task/flow run states, the temporary server) stay off the console; they still reach
        # the Prefect server (its UI). PREFECT_LOGGING_LEVEL=INFO, or this variable, brings them back.
        defaults["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] = "WARNING"
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    try:
        Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
        probe = Path(os.environ["PREFECT_HOME"]) / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        home = os.environ.get("MARS2_HOME", "unset: ./.mars2")
        raise SystemExit(f"mars2: the run folder cannot be used: {e.strerror or e} ({e.filename or root}). The run "
                         f"folder is $MARS2_HOME (now {home}) and its Prefect home $PREFECT_HOME; point them at a "
                         "folder this user can create and write, e.g. MARS2_HOME=$HOME/mars2-runs.") from None
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*SQLAlchemy.*")
    if temporary_server and not os.environ.get("PREFECT_API_URL") and not _informational(sys.argv[1:]):
        start_temporary_server()


def use_cpu_budget(cpus: int) -> int:
    """Size this process to the run's CPU budget (``cpus``; 0: the cores it may use) and return the budget: torch's
    threads, and the thread variables every process it starts inherits unless it is given its own share
    (:func:`mars2.cpu.thread_environment`)."""
    import torch

    from mars2.cpu import cpu_budget, split_cpus, thread_environment

    shares = split_cpus(cpu_budget(cpus))
    torch.set_num_threads(shares.flow)
    os.environ.update(thread_environment(shares.flow))
    return shares.budget


def _informational(argv: list[str]) -> bool:
    """Hydra flags that print and exit (``--cfg job``, ``--help``, ...): no flow runs."""
    return any(a.split("=")[0] in ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--resolve",
                                   "--package", "-p", "--shell-completion", "-sc") for a in argv)


_server: dict = {}


def start_temporary_server() -> None:
    """Start Prefect's temporary server (what Prefect runs when no ``PREFECT_API_URL`` is set) in the background.

    Prefect itself starts it at the flow's first API call and waits for it (most of a fully cached run's time),
    having first imported the server's modules in this process only to launch it. Started at the process's first
    line, with the command Prefect uses (``SubprocessASGIServer._run_uvicorn_command``: uvicorn, ``create_app``, no
    UI), its start overlaps this process's own imports and config checks. It is bound to this
    process: stopped at exit (a normal end, an error, SIGTERM/SIGINT), and killed by the kernel if this process dies
    (``PR_SET_PDEATHSIG``), so even ``kill -9`` leaves no server behind. :func:`temporary_server_url` hands it over.

    Flows started at once on one run folder share its Prefect database, and a server migrates it as it starts: one
    server starts at a time (an ``flock`` on ``temporary-server.lock`` in ``PREFECT_HOME``, held until the server
    answers), so a second process launches its own once the first one's migrations are done. Each server logs to a
    file of its own, removed when it stops cleanly.
    """
    import atexit
    import fcntl

    print("mars2: starting a temporary Prefect server for this run (PREFECT_API_URL is not set)", file=sys.stderr,
          flush=True)
    home = Path(os.environ["PREFECT_HOME"])
    lock = os.open(home / "temporary-server.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _server.update(lock=lock, log=home / f"temporary-server-{os.getpid()}.log")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _server["deferred"] = True  # another flow's server is starting on this database: launch once it answers
    else:
        _launch_temporary_server()
    atexit.register(stop_temporary_server)


def _launch_temporary_server() -> None:
    import socket
    import subprocess

    from mars2.procs import popen_bound
    from pipeline.shims.prefect_server import server_command

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv, settings = server_command(port)
    with open(_server["log"], "wb") as out:  # its shutdown chatter stays off the console
        proc = popen_bound(argv, env={**os.environ, **settings}, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    _server.update(proc=proc, url=f"http://127.0.0.1:{port}/api", deferred=False)


def _release_start_lock() -> None:
    lock = _server.pop("lock", None)
    if lock is not None:
        os.close(lock)  # releases the flock


def temporary_server_url(timeout_s: float = 120.0) -> str | None:
    """The URL of the server :func:`start_temporary_server` started, once it answers; None if none was started or
    Prefect is configured with a server of its own (a profile, ``.env``, ``prefect.toml``: the early one is stopped)."""
    import fcntl
    import time

    import httpx
    from prefect.settings import PREFECT_API_URL

    if "log" not in _server:
        return None
    if PREFECT_API_URL.value():
        stop_temporary_server()
        return None
    limit = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", timeout_s))
    deadline = time.monotonic() + limit
    try:
        while _server.get("deferred"):
            try:
                fcntl.flock(_server["lock"], fcntl.LOCK_EX | fcntl.LOCK_NB)
                _launch_temporary_server()
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another flow's Prefect server on {os.environ['PREFECT_HOME']} did not finish "
                                       f"starting within {limit:.0f} s (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
                time.sleep(0.2)
        proc = _server["proc"]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = "\n".join(_server["log"].read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(f"Prefect's temporary server exited with code {proc.returncode} before it answered; "
                                   f"the end of {_server['log']}:\n{tail}\nSet PREFECT_API_URL to use a running server "
                                   "instead")
            try:
                if httpx.get(f"{_server['url']}/health", timeout=2).status_code == 200:
                    return _server["url"]
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        stop_temporary_server()
        raise RuntimeError(f"Prefect's temporary server did not answer within {limit:.0f} s "
                           "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
    finally:
        _release_start_lock()


def prefect_server_outlives_run() -> bool:
    """This process talks to a Prefect server that stays up after the run (``PREFECT_API_URL``), not to the temporary
    one it started or to Prefect's ephemeral one."""
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value()) and "proc" not in _server


def stop_temporary_server() -> None:
    import subprocess

    _release_start_lock()
    proc = _server.pop("proc", None)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        else:
            Path(_server["log"]).unlink(missing_ok=True)
