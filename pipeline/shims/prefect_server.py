"""Prefect's temporary API server, launched the way Prefect launches its own ephemeral one (Prefect 3.8's
``SubprocessASGIServer``): uvicorn on the app factory ``prefect.server.api.server:create_app`` with the private
settings ``PREFECT__SERVER_EPHEMERAL`` and ``PREFECT__SERVER_FINAL`` set. We start it ourselves so that the start
overlaps the process's imports (pipeline/runtime.py)."""

from __future__ import annotations

import sys

from mars2.shims import check_version

PACKAGE, WRITTEN_FOR = "prefect", "3.8."
APP_FACTORY = "prefect.server.api.server:create_app"
PRIVATE_SETTINGS = {"PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}


def server_command(port: int) -> tuple[list[str], dict[str, str]]:
    """(argv, environment additions) of a Prefect API server on 127.0.0.1:``port`` without its UI."""
    check_version(PACKAGE, WRITTEN_FOR)
    argv = [sys.executable, "-m", "uvicorn", "--factory", APP_FACTORY, "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]
    return argv, {"PREFECT_UI_ENABLED": "0", **PRIVATE_SETTINGS}
