"""The stage tasks as a flow calls them: placed where the config says they run.

``placed_stages(orchestration)`` gives one callable per stage task (``stage.rollout(...)``, ...), each returning the
stage's :class:`StageRecord`:

- ``orchestration.mode=local`` (default): the Prefect task, run in this process. ``.submit(...)`` runs it now too
  (one stage at a time), so a flow can be written once for both modes.
- ``orchestration.mode=pools``: a stage whose pool (``orchestration.pools[<stage>]``) is not ``flow_pool`` becomes
  a flow run of the ``stage`` deployment on that pool (``stage/<pool>``, see ``flows/deploy.py``), started with
  ``run_deployment`` as a subflow of the calling flow run. Its arguments travel as JSON (configs and records are
  small dataclasses); the worker rebuilds them, runs the *same* task with the *same* stage folder, and writes the
  record to ``<root>/dispatch/<its flow run id>.json``, where this process reads it back. ``.submit(...)``
  starts the flow run in a thread and returns a future: per-agent updates run concurrently on the pool's workers.

A run on several nodes (``orchestration.node_pools``, the plan's node of each owner in ``StageContext.engine_pools``)
sends each owner's update to its node's pool, and a generation stage reaches the engine of an owner on another node
through a ``serve_engine`` flow run on that node's pool (:func:`serve_engine`): it starts (or keeps) the owner's
engine service there, listening on TCP, and the stage attaches to it (``EngineClient(provide=...)``).

Every worker must see the run folder at the same path (``$MARS2_HOME`` on shared storage): the stage folders, the
only cache, live there, not in Prefect.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import json
import typing
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prefect import flow
from prefect.states import State

from mars2.backends.engine import STARTS_FILE, EngineClient, EngineError, EngineSpec, node_name
from mars2.backends.base import visible_devices
from mars2.config import AgentConfig, BackendConfig, ConfigError, OrchestrationConfig
from mars2.io import atomic_write_json
from pipeline.runtime import use_cpu_budget
from pipeline.stages import TASKS, declaration_of, stage_pools
from stagekit.engines import node_engines, node_services_dir
from stagekit.stage import StageContext, StageRecord

ALL = {t.fn.__name__: t for t in TASKS}  # a flow calls stage.<function name>(...)
STAGE_FLOW = "stage"  # flow name of the dispatched stage; its deployments are named after their pool
DISPATCH_DIR = "dispatch"  # <root>/dispatch/<flow run id>.json: records of stages run on other workers
SERVE_ENGINE = "serve_engine"  # not a stage: the `stage` flow's request to start an agent's engine on its node


def placed_stages(orchestration: OrchestrationConfig | None = None) -> SimpleNamespace:
    """Every stage, placed by ``orchestration`` (None or mode ``local``: all in this process)."""
    failed: list[str] = []  # task run names of the stages that raised, e.g. "update-qwen_tiny-c0"
    if orchestration is None or orchestration.mode == "local":
        return SimpleNamespace(failed=failed, **{name: LocalStage(t, failed) for name, t in ALL.items()})
    check_dispatch(orchestration)
    pools = stage_pools(orchestration)
    pool = {name: pools[t.name] for name, t in ALL.items()}
    executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="mars2-dispatch")
    return SimpleNamespace(failed=failed, **{
        name: LocalStage(t, failed) if pool[name] == orchestration.flow_pool
        else PoolStage(name, t, pool[name], orchestration.stage_timeout_s, executor, failed)
        for name, t in ALL.items()})


def all_results(futures: dict[str, Future]) -> dict[str, Any]:
    """Each future's result, once every one is done: a stage that fails waits for its siblings (updates of other
    agents on other GPUs) before its error is raised, so a retry finds their work cached and their GPUs free (Prefect
    cancels the sub-runs of a cancelled flow run, not of a failed one)."""
    wait(futures.values())
    return {name: future.result() for name, future in futures.items()}


def owner_pools(orchestration: OrchestrationConfig, owners: list[AgentConfig]) -> dict[str, str]:
    """Weight owner → the work pool of its node (``orchestration.node_pools[owner.node]``); empty on one node."""
    if orchestration.mode != "pools" or not orchestration.node_pools:
        return {}
    return {m.name: orchestration.node_pools[m.node or 0] for m in owners}


def concurrent_update_ranks(orchestration: OrchestrationConfig, owners: list[AgentConfig]) -> dict[str, int]:
    """Weight owner → the ranks of the cycle's updates on its node (``StageContext.node_update_ranks``): in pools mode
    the updates are submitted together (:func:`all_results`), so owners on one node share its cores; empty in local
    mode, where they run one after another."""
    if orchestration.mode != "pools":
        return {}
    return {m.name: sum(o.processes for o in owners if (o.node or 0) == (m.node or 0)) for m in owners}


def task_run_name(task, arguments: dict[str, Any]) -> str:
    """The name a stage's task run gets for these arguments (``rollout-c0``)."""
    return (task.task_run_name or task.name).format(**arguments)


def bind_arguments(task, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    call = inspect.signature(task.fn).bind(*args, **kwargs)
    call.apply_defaults()
    return dict(call.arguments)


def check_dispatch(orchestration: OrchestrationConfig) -> None:
    """Pools mode needs a Prefect server that workers poll; the per-process ephemeral one has none."""
    from prefect.settings import PREFECT_API_URL

    if orchestration.mode == "pools" and not PREFECT_API_URL.value():
        raise ConfigError("orchestration=pools sends stages to Prefect work pools, but PREFECT_API_URL is not set "
                          "(this process would start its own ephemeral server, which no worker polls). Point it at "
                          "the team's server (PREFECT_API_URL=http://<host>:4200/api, docs/team.md) or use "
                          "orchestration=local.")


class LocalStage:
    """A stage task run in this process; one that raises is named in ``failed``."""

    def __init__(self, task, failed: list[str] | None = None):
        self.task, self.failed = task, [] if failed is None else failed

    def __call__(self, *args: Any, **kwargs: Any) -> StageRecord:
        try:
            out = self.task(*args, **kwargs)
            return out.result() if isinstance(out, State) else out  # a reused folder's record comes as a Cached state
        except Exception:
            self.failed.append(task_run_name(self.task, bind_arguments(self.task, args, kwargs)))
            raise

    def submit(self, *args: Any, **kwargs: Any) -> Future:
        """Runs the stage now (stages in one process run one at a time) and returns its finished future."""
        done: Future = Future()
        done.set_result(self(*args, **kwargs))
        return done


class PoolStage:
    """A stage run as a flow run of ``stage/<pool>`` on that work pool's workers."""

    def __init__(self, name: str, task, pool: str, timeout_s: float | None, executor: ThreadPoolExecutor,
                 failed: list[str]):
        self.name, self.task, self.pool, self.timeout_s, self.executor = name, task, pool, timeout_s, executor
        self.failed = failed

    def __call__(self, *args: Any, **kwargs: Any) -> StageRecord:
        return self.submit(*args, **kwargs).result()

    def submit(self, *args: Any, **kwargs: Any) -> Future:
        context = contextvars.copy_context()  # keeps the flow run context: the stage shows as a subflow
        return self.executor.submit(context.run, self._dispatch, bind_arguments(self.task, args, kwargs))

    def _dispatch(self, arguments: dict[str, Any]) -> StageRecord:
        try:
            return self._run(arguments)
        except Exception:
            self.failed.append(task_run_name(self.task, arguments))
            raise

    def pool_for(self, arguments: dict[str, Any]) -> str:
        """The stage's pool; an owner's stage of a run on several nodes: its node's."""
        if declaration_of(self.task).per_owner:
            return arguments["ctx"].engine_pools.get(arguments["member"].owner, self.pool)
        return self.pool

    def _run(self, arguments: dict[str, Any]) -> StageRecord:
        pool = self.pool_for(arguments)
        run_name = task_run_name(self.task, arguments)
        run_id = run_on_pool(pool, {"stage": self.name, "args": encode_args(arguments), "pool": pool}, run_name,
                             timeout_s=self.timeout_s, timeout_hint="orchestration.stage_timeout_s")
        return read_dispatched(arguments["ctx"].root, run_id)


def run_on_pool(pool: str, parameters: dict[str, Any], run_name: str, *, timeout_s: float | None,
                timeout_hint: str) -> str:
    """Run the ``stage`` flow on ``pool`` (a subflow of the calling flow run, named ``run_name``) and wait; its flow
    run id, once it completed. ``timeout_hint`` names the setting behind ``timeout_s`` in the error."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    deployment = f"{STAGE_FLOW}/{pool}"
    what = f"stage {run_name}" if parameters["stage"] in ALL else f"{parameters['stage']} {run_name}"
    require_worker(pool, what)
    try:
        run = run_deployment(deployment, parameters=parameters, flow_run_name=run_name, timeout=timeout_s,
                             poll_interval=2)
    except ObjectNotFound:
        raise RuntimeError(f"no deployment {deployment!r} on the Prefect server: register it with "
                           f"`python flows/deploy.py` and start a worker: `prefect worker start --pool {pool}`"
                           ) from None
    state = run.state
    if state is None or not state.is_final():
        _cancel(run.id)
        raise TimeoutError(f"{what} on pool {pool!r} was not finished after {timeout_hint}={timeout_s} s (state "
                           f"{state and state.name}); is a worker polling it? `prefect worker start --pool {pool}`")
    if not state.is_completed():
        raise RuntimeError(f"{what} failed on pool {pool!r}: flow run {run.name} ({run.id}) "
                           f"ended {state.name}: {state.message or ''}".rstrip(": "))
    return str(run.id)


NO_WORKER_WAIT_S = 60.0  # a worker started beside the run registers within seconds; none in this time: none comes


def require_worker(pool: str, what: str) -> None:
    """Fail, instead of waiting for ever, when no worker polls ``pool`` (a stage sent to a pool nobody runs a worker
    on: Prefect keeps its flow run scheduled until one does). A worker counts while the server holds it ONLINE
    (Prefect keeps every worker that ever polled, and marks it OFFLINE after three missed heartbeats); waits up to
    ``NO_WORKER_WAIT_S`` for one (a worker starting or restarting)."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    deadline = time.monotonic() + NO_WORKER_WAIT_S
    while True:
        try:
            with get_client(sync_client=True) as client:
                if any(w.status == "ONLINE" for w in client.read_workers_for_work_pool(work_pool_name=pool)):
                    return
        except ObjectNotFound:
            return  # no such pool: the missing deployment is the clearer error (run_on_pool)
        except PrefectHTTPStatusError as e:
            if e.response.status_code == 404:  # this call reports a missing pool as a bare 404
                return
            raise
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{what} goes to work pool {pool!r}, which no worker polls (waited {NO_WORKER_WAIT_S:.0f} s): "
                f"it would wait for ever. Start one where it should run (`prefect worker start --pool {pool}`), or "
                f"send the stage to a pool that has one (orchestration.pools.<stage>=<pool>; a run on several "
                f"nodes: orchestration.pools.rollout=<node 0's pool> orchestration.pools.evaluation=<node 0's "
                f"pool>, docs/team.md section 7)")
        time.sleep(2)


def _cancel(flow_run_id) -> None:
    """Best effort: the stage is reported as timed out whether or not its flow run could be cancelled."""
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectException
    from prefect.logging import get_logger
    from prefect.states import Cancelled

    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run_id, Cancelled(message="stage timed out"), force=True)
    except (PrefectException, httpx.HTTPError, OSError, RuntimeError) as e:
        get_logger("mars2.stages").warning("could not cancel flow run %s: %s", flow_run_id, e)


# ---------------------------------------------------------------- the far side: the `stage` flow

@flow(name=STAGE_FLOW, log_prints=True)
def stage_flow(stage: str, args: dict[str, Any], pool: str = "") -> str:
    """Run one stage task (``stage`` = its function name, e.g. ``rollout``) with JSON-encoded ``args``, in the run
    folder named by ``args["ctx"]["root"]``, on a worker of ``pool``; its record goes to
    ``<root>/dispatch/<this flow run id>.json``. ``stage`` = ``serve_engine``: :func:`serve_engine`."""
    from prefect.runtime import flow_run

    if stage != SERVE_ENGINE and stage not in ALL:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(ALL)}")
    kwargs = decode_args(ALL[stage].fn if stage in ALL else serve_engine, args)
    ctx = kwargs["ctx"]
    use_cpu_budget(ctx.cpus)  # this worker's cores when the run's budget is 0
    if not Path(ctx.root).is_dir():
        raise FileNotFoundError(f"run folder {ctx.root} is not on this worker: every worker must mount the run "
                                "folder ($MARS2_HOME) at the same path")
    path = Path(ctx.root) / DISPATCH_DIR / f"{flow_run.id}.json"
    if stage == SERVE_ENGINE:
        atomic_write_json(path, {"service_dir": str(serve_engine(**kwargs))})
        return str(path)
    # the generation stages (their BackendConfig argument): the node's engine services of the run, and the engines
    # of owners on other nodes; the others generate nothing
    backend = kwargs.get("backend") or BackendConfig(persistent=False)
    remote = {owner: remote_engine(p, ctx, backend) for owner, p in ctx.engine_pools.items() if p != pool}
    with node_engines(backend, ctx, remote) as engines:
        kwargs["ctx"] = dataclasses.replace(ctx, engines=engines)
        record = getattr(placed_stages(), stage)(**kwargs)
    atomic_write_json(path, dataclasses.asdict(record))
    return str(path)


def serve_engine(ctx: StageContext, spec: EngineSpec, backend: BackendConfig) -> Path:
    """On the owner's node: its engine service of the run holding ``spec.version`` (attached to if it runs, else
    started on TCP), left running for the stage that asked; returns the node's service folder. The spec's GPU
    indices are the plan's on this node, mapped through this worker's ``CUDA_VISIBLE_DEVICES``; a vLLM engine runs
    in this node's vLLM environment; a CPU engine's threads are the run's CPU budget on this node
    (:meth:`StageContext.cpu_shares`: ``cpus``, or this node's usable cores), not the asking stage's."""
    import os

    from mars2.backends.vllm_env import find_python

    if spec.device.startswith("cuda"):  # this node's GPUs, before a start that would fail late or obscurely
        from mars2.config import check_cuda, check_gpu_fit

        check_cuda(f"the engine of agent {spec.agent!r} needs GPUs ({spec.device})", f"node {node_name()}")
        check_gpu_fit(ctx.gpu_memory_gb, here=f"node {node_name()} (engine of {spec.agent})")
    if spec.kind == "vllm":
        spec = dataclasses.replace(spec, python=find_python() or spec.python)
    if spec.device.startswith("cpu"):
        spec = dataclasses.replace(spec, threads=ctx.cpu_shares(engines=1).engine)
    if spec.cuda_visible_devices:
        ids = [int(i) for i in spec.cuda_visible_devices.split(",")]
        mapped = visible_devices(ids, os.environ.get("CUDA_VISIBLE_DEVICES"))
        spec = dataclasses.replace(spec, cuda_visible_devices=mapped)
    folder = node_services_dir(ctx)
    try:
        engine = EngineClient(spec, service_dir=folder, start_timeout_s=backend.start_timeout_s,
                              idle_exit_s=backend.service_idle_exit_s, listen_tcp=True)
    except EngineError as e:  # the run's engine_starts still counts the starts it paid for
        with open(folder.parent / STARTS_FILE, "a") as starts:
            starts.write(f"{spec.agent} {node_name()} failed\n" * e.starts)
        raise
    try:
        engine.load(spec.model_dir, spec.version)
    finally:
        engine.close()
    print(f"engine of {spec.agent} serves {spec.version} on {node_name()}")
    return folder


def remote_engine(pool: str, ctx: StageContext, backend: BackendConfig) -> Callable[[EngineSpec], Path]:
    """The ``provide`` of an owner whose node's work pool is ``pool``: a ``serve_engine`` flow run there."""
    def provide(spec: EngineSpec) -> Path:
        arguments = {"ctx": ctx, "spec": spec, "backend": backend}
        run_id = run_on_pool(pool, {"stage": SERVE_ENGINE, "args": encode_args(arguments), "pool": pool},
                             f"engine-{spec.agent}", timeout_s=backend.start_timeout_s + REMOTE_PICKUP_S,
                             timeout_hint=f"backend.start_timeout_s + {REMOTE_PICKUP_S:.0f}")
        return Path(json.loads((Path(ctx.root) / DISPATCH_DIR / f"{run_id}.json").read_text())["service_dir"])

    return provide


REMOTE_PICKUP_S = 300.0  # a serve_engine flow run's time to reach its node's worker, beyond the engine's start


def read_dispatched(root: str, flow_run_id: str) -> StageRecord:
    path = Path(root) / DISPATCH_DIR / f"{flow_run_id}.json"
    if not path.exists():
        raise FileNotFoundError(f"the stage flow run {flow_run_id} completed but {path} is missing: does its worker "
                                "mount the run folder at the same path?")
    return StageRecord(**json.loads(path.read_text()))


def encode_args(arguments: dict[str, Any]) -> dict[str, Any]:
    """A stage call's arguments as JSON values (dataclasses become dicts); the context without its engines, which
    belong to this process (the worker opens its own)."""
    from pydantic_core import to_jsonable_python

    return to_jsonable_python({name: dataclasses.replace(value, engines=None) if isinstance(value, StageContext)
                               else value for name, value in arguments.items()})


def decode_args(fn, args: dict[str, Any]) -> dict[str, Any]:
    """Rebuild typed arguments (StageContext, configs, records) from :func:`encode_args`, by ``fn``'s signature."""
    from pydantic import TypeAdapter

    hints = typing.get_type_hints(fn)
    return {name: TypeAdapter(hints.get(name, Any)).validate_python(value) for name, value in args.items()}
