"""The command-line side of a flow: this Hydra job's overrides, checked before Prefect starts, then the flow."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable

from mars2.config import ConfigError
from tasks import runtime


def run_flow_from_cli(check: Callable[[list[str]], object], flow: Callable[[list[str]], object], what: str) -> None:
    """Run ``flow(overrides)`` for the overrides of the current ``@hydra.main`` job (one job per ``-m`` combination).

    ``check(overrides)`` composes and validates first: a :class:`ConfigError` (or subclass, which may name itself
    with a ``label`` attribute) exits with one paragraph and no traceback. A failure inside the flow exits saying
    what to do next; its traceback is already in Prefect's log.
    """
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task)
    try:
        check(overrides)
    except ConfigError as e:
        sys.exit(f"mars2: {getattr(e, 'label', 'config error')}: {e}")
    # SIGTERM (a scheduler, `kill`) exits through Python's unwinding, so the temporary server is stopped; the default
    # handler would leave it running with no parent
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with _temporary_server():
            flow(overrides)
    except Exception as e:
        sys.exit(f"mars2: the {what} failed: {type(e).__name__}: {e}\n"
                 "Fix the cause and run the same command again: finished stages come back from cache.")


@contextlib.contextmanager
def _temporary_server():
    """Point Prefect at the temporary server started at the process's first line, if there is one; a Prefect with
    no server configured and none started here starts its own, as usual."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = runtime.temporary_server_url()
    if url is None:
        yield
        return
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def _exit_on_sigterm(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)
