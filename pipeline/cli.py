"""The command-line side of a flow: this Hydra job's overrides, checked before Prefect starts, then the flow."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from mars2.config import ConfigError, RunConfig
from pipeline import runtime

MIN_FREE_MIB = 64  # a run folder with less free space than this is refused before anything starts


def check_command_line(argv: list[str]) -> None:
    """Exit with one paragraph, before Hydra composes anything, when an override names a key or a group option
    that does not exist (:func:`pipeline.config.override_hint`: the closest valid name and the valid ones); Hydra's own
    message has neither, and for a group it adds its search path. Flags (``-m``, ``--cfg``, ...) are Hydra's."""
    from pipeline.config import override_hint

    for arg in argv:
        hint = None if arg.startswith("-") else override_hint(arg)
        if hint is not None:
            sys.exit(f"mars2: config error: {hint}")


def check_first(argv: list[str], then: Callable[[RunConfig], object] | None = None, **compose: object) -> None:
    """The command line's own check, before a flow module imports Prefect, MLflow and torch (seconds on a small
    machine): exit with one paragraph when an override names nothing that exists (:func:`check_command_line`) or
    composes an invalid config (:func:`pipeline.config.compose_run` with ``compose``, e.g. ``config_name``), or when
    ``then(run)`` raises a :class:`ConfigError` (the flow's own light checks, e.g. checkpoint folders). Only a single
    run given by plain overrides is composed here; a multirun, Hydra's flags and ``hydra.*`` overrides are checked by
    each job (:func:`run_flow_from_cli`), as is whatever needs the flow's imports (a server to dispatch to, an
    earlier run's weights in the MLflow store)."""
    what = Path(sys.argv[0]).stem.replace("_", " ")
    print(f"mars2 {what}: {' '.join(argv) or 'the default config'}: checking it, then starting", file=sys.stderr,
          flush=True)  # the first line at once: the imports and a server's start that follow take seconds
    runtime.configure_process()  # offline hub flags before a GPU preset's plan loads transformers
    check_command_line(argv)
    if any(a.startswith(("-", "hydra.")) for a in argv):
        return
    from pipeline.config import compose_run

    try:
        run = compose_run(argv, **compose)
        if then is not None:
            then(run)
    except ConfigError as e:
        sys.exit(f"mars2: {getattr(e, 'label', 'config error')}: {e}")


def run_flow_from_cli(check: Callable[[list[str]], object], flow: Callable[[list[str]], object], what: str) -> None:
    """Run ``flow(overrides)`` for the overrides of the current ``@hydra.main`` job (one job per ``-m`` combination).

    ``check(overrides)`` composes and validates first: a :class:`ConfigError` (or subclass, which may name itself
    with a ``label`` attribute) exits with one paragraph and no traceback. A failure inside the flow exits saying
    what to do next; its traceback is already in Prefect's log.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    varied = swept(sys.argv[1:], overrides) if hydra_cfg.mode == RunMode.MULTIRUN else []
    if varied:  # a -m job: a header above its output, and a run name (Prefect, MLflow) saying what varied
        from rich.console import Console

        Console(stderr=True).rule(f"job {hydra_cfg.job.num}: {' '.join(varied)}")
        flow = flow.with_options(flow_run_name=" ".join(varied))
        from prefect import tags

        from pipeline.config import VARY_TAG, override_key

        varying = tags(*(VARY_TAG + override_key(o) for o in varied))  # the run names itself after these
    else:
        varying = contextlib.nullcontext()
    try:
        check(overrides)
    except ConfigError as e:
        sys.exit(f"mars2: {getattr(e, 'label', 'config error')}: {e}")
    root = runtime.run_root()
    try:
        free = shutil.disk_usage(root if root.exists() else root.parent).free
    except OSError:
        free = None
    if free is not None and free < MIN_FREE_MIB << 20:
        sys.exit(f"mars2: {no_space_left(OSError(errno.ENOSPC, 'No space left on device'), root)}: the {what} needs "
                 f"at least {MIN_FREE_MIB} MiB free in its run folder to start (MARS2_HOME). Free some space, or point "
                 "MARS2_HOME at a larger filesystem.")
    # SIGTERM (a scheduler, `kill`) exits through Python's unwinding, so the temporary server is stopped; the default
    # handler would leave it running with no parent
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    log_file = None
    try:
        with _temporary_server(), _run_log(root) as log_file, varying:
            flow(overrides)
    except BaseException as e:
        if _interrupted:  # whatever the signal's unwinding became on its way out of Prefect (a connection error)
            signum, stages = _interrupted[0]
            during = f" during {', '.join(stages)}" if stages else ""
            print(f"mars2: the {what} was interrupted ({signal.Signals(signum).name}){during}. Run the same command "
                  "again to resume: finished stages come back from cache.", file=sys.stderr)
            raise SystemExit(128 + signum) from None
        if not isinstance(e, Exception):
            raise
        full = no_space_left(e, runtime.run_root())
        if full is not None:
            sys.exit(f"mars2: {full}: the {what} failed: {type(e).__name__}: {e}\n"
                     "Free some space there and run the same command again: finished stages come back from cache.")
        where = f" The traceback is in {log_file}." if log_file else ""
        sys.exit(f"mars2: the {what} failed: {type(e).__name__}: {e}\n"
                 f"Fix the cause and run the same command again: finished stages come back from cache.{where}")


def swept(argv: list[str], overrides: list[str]) -> list[str]:
    """The overrides of a ``-m`` job whose keys the command line sweeps (``a=1,2``, ``range()``, ``choice()``):
    ``["train.kl_coef=0.002"]`` for the job ``[..., "train.kl_coef=0.002"]`` of ``train.kl_coef=0.001,0.002``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    keys = {o.key_or_group for o in parsed if o.is_sweep_override()}
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in keys]


def no_space_left(error: BaseException, root: Path) -> str | None:
    """``"no space left on <mount point> (...)"`` when ``error`` or anything in its chain is a full disk (an
    ``ENOSPC`` OSError, or a database or library error that says so), or when the run folder's filesystem has less
    than 1 MiB free; else None."""
    where, writing = None, False
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack and where is None:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            where, writing = (Path(os.fsdecode(e.filename)), True) if e.filename else (root, False)
        elif "No space left on device" in str(e) or "database or disk is full" in str(e):
            where = root
        stack += [e.__cause__, e.__context__]
    try:
        if where is None and shutil.disk_usage(root).free < 1 << 20:
            where = root
        if where is None:
            return None
        mount = Path(where).resolve()
        while not mount.exists() or not os.path.ismount(mount):
            mount = mount.parent
        free = shutil.disk_usage(mount).free
    except OSError:
        return f"no space left on {where}" if where is not None else None
    what = f"writing {where}" if writing else f"the run folder {root}"
    return f"no space left on {mount} ({what}; {free / (1 << 20):.1f} MiB free)"


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


RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")  # Prefect's run loggers: states, errors with tracebacks


@contextlib.contextmanager
def _run_log(root: Path):
    """Everything this run logs at INFO and above — Prefect's task and flow run states, their tracebacks, mars2's
    warnings — goes to ``<root>/logs/<time>-<pid>.log``; the console keeps warnings, and leaves a failed stage's
    tracebacks to that file (the run ends with one paragraph naming it). ``PREFECT_LOGGING_LEVEL`` set by the user
    (e.g. ``INFO``) keeps Prefect's own console output as it is. Yields the file (None if it cannot be written)."""
    import logging
    import time

    try:
        (root / "logs").mkdir(parents=True, exist_ok=True)
        path = root / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        handler = logging.FileHandler(path, delay=True)
    except OSError:
        yield None
        return
    handler.setLevel(logging.INFO)
    handler.setFormatter(RunLogFormatter("%(asctime)s | %(levelname)-7s | %(name)s - %(run)s%(message)s"))
    top = logging.getLogger()
    quiet = _quiet_run_errors if "PREFECT_LOGGING_LEVEL" not in os.environ else None
    consoles = [h for h in top.handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    top.addHandler(handler)
    for h in consoles if quiet else ():
        h.addFilter(quiet)
    try:
        yield path
    finally:
        top.removeHandler(handler)
        handler.close()
        for h in consoles if quiet else ():
            h.removeFilter(quiet)


class RunLogFormatter(logging.Formatter):
    """Names the task or flow run a record of Prefect's run loggers is about (``rollout-c0: Finished in state
    Completed()``), which Prefect keeps in the record's ``task_run_name`` / ``flow_run_name``; other records as
    they are."""

    def format(self, record: logging.LogRecord) -> str:
        run = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None)
        record.run = f"{run}: " if run else ""
        return super().format(record)


def _quiet_run_errors(record) -> bool:
    """Console filter: not a Prefect run's error records (the traceback of a failed stage, twice)."""
    import logging

    return not (record.name.startswith(RUN_LOGGERS) and record.levelno >= logging.ERROR)


_interrupted: list[tuple[int, list[str]]] = []  # (signal, the stages it stopped)


def _exit_on_sigterm(signum: int, _frame) -> None:
    stages = sys.modules.get("stagekit.stage")  # loaded once a stage has run; not imported in a signal handler
    _interrupted.append((signum, stages.unfinished_stages() if stages is not None else []))
    raise SystemExit(128 + signum)
