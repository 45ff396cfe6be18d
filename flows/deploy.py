"""Register mars2's Prefect deployments on a server, and submit sweeps to them.

    export PREFECT_API_URL=http://<host>:4200/api          # the team's server (docs/team.md)
    python flows/deploy.py                                # train-cycle/cpu, sweep/cpu, stage/cpu, stage/gpu
    python flows/deploy.py --pool gpu                     # train-cycle (and sweep) on the gpu pool instead
    python flows/deploy.py --concurrency 2                # 2 train-cycle runs at once (give each cpus=<cores/2>)
    python flows/deploy.py sweep agents=tiny_cpu,tiny_cpu_single train.kl_coef=1e-3,2e-3   # 4 flow runs
    python flows/deploy.py sweep --wait train.cycles=1    # one run; wait for it, exit 1 unless it completed

Deployments (no image, no code storage: workers import the installed ``flows``/``tasks`` packages, so each worker
needs ``pip install -e .`` of the same code and ``MARS2_HOME`` pointing at the shared run folder):

- ``train-cycle/<pool>``: the train cycle. Its one parameter, ``overrides``, is a list of Hydra overrides — start a
  run from the UI with ``["agents=heterogeneous_8b", "train.kl_coef=2e-3"]``; the flow composes the config exactly
  as ``python flows/train_cycle.py agents=heterogeneous_8b train.kl_coef=2e-3`` does.
- ``sweep/<pool>``: submits one ``train-cycle`` run per point of a grid written in Hydra's ``-m`` syntax
  (``["agents=tiny_cpu,tiny_cpu_single", "train.kl_coef=1e-3,2e-3"]``), waits for them, and fails naming the
  points that did not complete (``wait=False``: submit and return).
- ``stage/<pool>`` for every pool named in ``conf/orchestration/pools.yaml`` and in the overrides given
  (``orchestration.node_pools=[gpu-node0,gpu-node1]``: a run on several nodes): one stage of a train cycle run
  with ``orchestration=pools``, or an agent's engine served on that pool's node (``pipeline/dispatch.py``).

Missing work pools are created as ``process`` pools (``--no-create-pools`` to skip). ``train-cycle/<pool>`` runs
one flow run at a time by default (each run's CPU budget is all of its worker's cores; ``--concurrency``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence

from pipeline.runtime import configure_process

configure_process()  # PREFECT_HOME, offline hub flags, quiet warnings: before Prefect/MLflow/transformers load
from omegaconf import OmegaConf
from prefect import flow, get_run_logger
from prefect.deployments.runner import EntrypointType

from mars2.config import ConfigError
from pipeline.config import VARY_TAG, load_cfg, override_key
from pipeline.dispatch import stage_flow
from pipeline.stages import stage_pools
from flows.train_cycle import train_cycle

DEFAULT_POOL = "cpu"


# ---------------------------------------------------------------- sweeps

def expand_grid(overrides: Sequence[str]) -> list[list[str]]:
    """The override lists of a Hydra sweep, exactly as ``python flows/train_cycle.py -m ...`` expands them:
    ``a=1,2 b=x`` → ``[["a=1", "b=x"], ["a=2", "b=x"]]`` (also ``choice(...)``, ``range(...)``, ``glob(...)``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        (batch,) = BasicSweeper.split_arguments(parsed, None)
    except HydraException as e:
        raise ConfigError(f"bad sweep: {' '.join(str(e).split())}") from None
    return batch


def varied_keys(points: Sequence[Sequence[str]]) -> list[str]:
    """The keys whose override differs between the points of a sweep (present in some points only included)."""
    keys = {override_key(o) for point in points for o in point}
    return sorted(k for k in keys if len({next((o for o in p if override_key(o) == k), None) for p in points}) > 1)


def submit_grid(grid: Sequence[str], deployment: str = f"train-cycle/{DEFAULT_POOL}", *,
                as_subflow: bool = False) -> list:
    """Compose every point of ``grid`` (a bad override fails before anything is submitted), then start one flow run
    of ``deployment`` per point without waiting. Returns the flow runs; they share the tag ``sweep-<id>``, and
    ``vary:<key>`` for each key the grid varies (each point's run is named after those overrides)."""
    from prefect.deployments import run_deployment

    points = expand_grid(grid)
    for point in points:
        load_cfg(point)  # keys, option names, types; machine checks (models, GPUs) run on the worker
    sweep_id = hashlib.sha256(json.dumps([points, time.time()]).encode()).hexdigest()[:8]
    varied = varied_keys(points)
    return [run_deployment(deployment, parameters={"overrides": point}, timeout=0, as_subflow=as_subflow,
                           tags=["mars2", f"sweep-{sweep_id}", *(VARY_TAG + k for k in varied)]) for point in points]


@flow(name="sweep")
def sweep(grid: list[str], deployment: str = f"train-cycle/{DEFAULT_POOL}", wait: bool = True,
          timeout_s: float | None = None) -> list[dict]:
    """One ``train-cycle`` flow run per point of ``grid`` — Hydra ``-m`` syntax, e.g.
    ``["agents=tiny_cpu,tiny_cpu_single", "train.kl_coef=1e-3,2e-3"]`` (4 runs).

    With ``wait`` (the default) the sweep's own run lasts until every point has finished and ends Failed, naming
    each point that did not complete, when any failed (or was still running after ``timeout_s``); without it, the
    runs are submitted and the sweep completes at once."""
    runs = submit_grid(grid, deployment, as_subflow=True)
    rows = [{"flow_run": r.name, "id": str(r.id), "overrides": r.parameters["overrides"]} for r in runs]
    log = get_run_logger()
    log.info("sweep %s: %d points of %s", sweep_tag(runs), len(rows), deployment)
    for i, row in enumerate(rows):
        log.info("point %d: flow run %s (%s): %s", i, row["flow_run"], row["id"], " ".join(row["overrides"]))
    if not wait:
        return rows
    states = wait_for(runs, math.inf if timeout_s is None else timeout_s)
    for row in rows:
        row["state"], row["flow_run"] = states[row["id"]]
    if any(row["state"] != "Completed" for row in rows):
        raise SweepFailed(failed_points(rows))
    return rows


def sweep_tag(runs: Sequence) -> str:
    """The tag the flow runs of one sweep share (``sweep-<id>``); their MLflow runs carry ``mars2.sweep=<id>``."""
    return next(t for t in runs[0].tags if t.startswith("sweep-")) if runs else "sweep-(empty)"


class SweepFailed(RuntimeError):
    """A waited-for sweep in which some point did not complete."""


def failed_points(rows: Sequence[dict]) -> str:
    """``1 of 4 sweep points did not complete: <flow run> [train.kl_coef=0.002] Failed; ...``: each point is named
    by the overrides that vary across the grid (all of them for a one-point grid)."""
    common = set.intersection(*(set(r["overrides"]) for r in rows)) if len(rows) > 1 else set()
    failed = [r for r in rows if r["state"] != "Completed"]
    named = [f"{r['flow_run']} [{' '.join(o for o in r['overrides'] if o not in common)}] {r['state']}" for r in failed]
    return f"{len(failed)} of {len(rows)} sweep points did not complete: " + "; ".join(named)


def wait_for(runs: Iterable, timeout_s: float) -> dict[str, tuple[str, str]]:
    """Flow run id → (final state name, ``TIMEOUT`` for runs still going after ``timeout_s``; the run's name now: a
    train cycle renames itself after what it varies)."""
    from prefect.client.orchestration import get_client

    names = {str(r.id): r.name for r in runs}
    pending = [r.id for r in runs]
    states: dict[str, tuple[str, str]] = {}
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while pending and time.monotonic() < deadline:
            for run_id in list(pending):
                run = client.read_flow_run(run_id)
                names[str(run_id)] = run.name
                if run.state is not None and run.state.is_final():
                    states[str(run_id)] = (run.state.name, run.name)
                    pending.remove(run_id)
            if pending:
                time.sleep(2)
    return {**states, **{str(run_id): ("TIMEOUT", names[str(run_id)]) for run_id in pending}}


# ---------------------------------------------------------------- registration

def deployment_pools(overrides: Sequence[str] = ()) -> list[str]:
    """Every pool a run with ``orchestration=pools`` (plus ``overrides``, e.g. ``orchestration.pools.update=a100`` or
    ``orchestration.node_pools=[gpu-node0,gpu-node1]``) sends a stage or an engine to, and the flow's own."""
    orchestration = OmegaConf.to_object(load_cfg(["orchestration=pools", *overrides]).orchestration)
    return sorted({*stage_pools(orchestration).values(), orchestration.flow_pool, *orchestration.node_pools})


def ensure_pools(names: Iterable[str]) -> list[str]:
    """Create the missing ones as process work pools; returns the names created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    created = []
    with get_client(sync_client=True) as client:
        for name in sorted(set(names)):
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type="process",
                                                       base_job_template=ProcessWorker.get_default_base_job_template()))
                created.append(name)
    return created


def run_concurrency(cores: int, cpus: int) -> int:
    """Train-cycle runs at once on a worker of ``cores`` cores when each run's CPU budget is ``cpus`` (0: every core
    of the worker, so one run at a time): ⌊cores / budget⌋, at least 1."""
    return max(1, cores // (cpus or cores))


def register(pool: str = DEFAULT_POOL, overrides: Sequence[str] = (), *, create_pools: bool = True,
             concurrency: int | None = None) -> dict[str, str]:
    """Create/update ``train-cycle/<pool>``, ``sweep/<pool>`` and ``stage/<p>`` for every stage pool; name → id.

    ``train-cycle/<pool>`` runs at most ``concurrency`` flow runs at once (0: no limit; None:
    :func:`run_concurrency` of this machine's cores and the runs' default ``cpus``); the others wait in the queue,
    so a sweep's points take turns instead of sharing the cores. Stage flow runs are not limited (a run waits on
    its own stages)."""
    from mars2.cpu import usable_cpus

    if concurrency is None:
        concurrency = run_concurrency(usable_cpus(), load_cfg(list(overrides)).cpus)
    pools = deployment_pools(overrides)
    if create_pools:
        for name in ensure_pools([pool, *pools]):
            print(f"created work pool {name!r} (process)")
    module = EntrypointType.MODULE_PATH  # workers import the installed packages: no image, no code storage
    sweep_flow = importlib.import_module("flows.deploy").sweep  # not __main__.sweep when run as a script
    deployments = [
        train_cycle.to_deployment(name=pool, parameters={"overrides": []}, entrypoint_type=module, tags=["mars2"],
                                  concurrency_limit=concurrency or None,
                                  description="MARS² train cycle. `overrides`: Hydra overrides, as on the command line "
                                              "of flows/train_cycle.py, e.g. [\"agents=tiny_cpu_single\", "
                                              "\"train.cycles=3\"]."),
        sweep_flow.to_deployment(name=pool, parameters={"deployment": f"train-cycle/{pool}"}, entrypoint_type=module,
                            tags=["mars2"], description="One train-cycle run per point of a Hydra -m grid, e.g. "
                                                        "[\"agents=tiny_cpu,tiny_cpu_single\", \"train.kl_coef=1e-3,2e-3\"]."),
        *[stage_flow.to_deployment(name=p, entrypoint_type=module, tags=["mars2"],
                                   description=f"One stage of a train cycle with orchestration=pools, on pool {p!r}.")
          for p in sorted({pool, *pools})],
    ]
    ids = {}
    for d in deployments:
        ids[f"{d.flow_name}/{d.name}"] = str(d.apply(work_pool_name=d.name))
    return ids


# ---------------------------------------------------------------- CLI

def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="flows/deploy.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    reg = sub.add_parser("register", help="register the deployments (the default command)")
    reg.add_argument("--pool", default=DEFAULT_POOL, help="work pool of train-cycle and sweep (default: cpu)")
    reg.add_argument("--no-create-pools", action="store_true", help="do not create missing work pools")
    reg.add_argument("--concurrency", type=int, default=None,
                     help="train-cycle runs at once (0: no limit; default: this machine's cores / a run's cpus, "
                          "1 with the default cpus=0)")
    reg.add_argument("overrides", nargs="*", help="orchestration overrides naming stage pools")
    sw = sub.add_parser("sweep", help="submit one train-cycle run per point of a Hydra -m grid")
    sw.add_argument("--deployment", default=f"train-cycle/{DEFAULT_POOL}")
    sw.add_argument("--wait", action="store_true", help="wait for every run; exit 1 unless all completed")
    sw.add_argument("--timeout", type=float, default=3600.0, help="with --wait: seconds (default 3600)")
    sw.add_argument("grid", nargs="*", help="Hydra overrides; comma lists / choice() / range() sweep")
    if not argv or argv[0] not in ("register", "sweep", "-h", "--help"):
        argv = ["register", *argv]
    args = parser.parse_args(argv)
    try:
        if args.command == "register":
            ids = register(args.pool, args.overrides, create_pools=not args.no_create_pools,
                           concurrency=args.concurrency)
            for name, dep_id in ids.items():
                print(f"deployment {name}  ({dep_id})")
            print(f"start workers: prefect worker start --pool {args.pool}   (and one per stage pool, e.g. --pool gpu)")
            return 0
        runs = submit_grid(args.grid, args.deployment)
    except ConfigError as e:
        print(f"mars2: config error: {e}", file=sys.stderr)
        return 2
    for r in runs:
        print(f"submitted {r.name}  {r.id}  {json.dumps(r.parameters['overrides'])}")
    tag = sweep_tag(runs)
    print(f"{tag}: in MLflow, filter the runs by  tags.mars2.sweep = '{tag.removeprefix('sweep-')}'")
    if not args.wait:
        return 0
    states = wait_for(runs, args.timeout)
    rows = [{"flow_run": states[str(r.id)][1], "overrides": r.parameters["overrides"], "state": states[str(r.id)][0]}
            for r in runs]
    for row in rows:
        print(f"{row['flow_run']}: {row['state']}")
    if any(row["state"] != "Completed" for row in rows):
        print(f"mars2: {failed_points(rows)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
