"""Deployments, sweeps and work pools (flows/deploy.py, pipeline/dispatch.py, conf/orchestration/).

Fast tests: the CLI and a deployment compose identical configs (one function, ``pipeline.config.compose_run``), the
CLI hands each Hydra job's overrides to the flow (``-m`` gives one flow run per job), stage arguments survive the
trip to a worker with their cache keys, stages are placed by ``orchestration.pools``.

Slow tests (``-m slow``; what CI runs with the rest): a real ``prefect server start`` (SQLite, free port, temporary
PREFECT_HOME) with two ``prefect worker start`` process workers (pools ``cpu`` and ``gpu``, no Docker) and the
deployments of ``python flows/deploy.py``. The default flow (made small) runs from its deployment, started by the
``sweep`` deployment as from the UI; then ``flows/deploy.py sweep --wait`` runs it with ``orchestration=pools``
(rollout, both agents' updates at once, and evaluation as ``stage`` flow runs on the ``gpu`` pool). Everything
started is stopped at the end (≈ 3.5 min on 2 cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import httpx
import pandas as pd
import pytest
import yaml

from mars2.config import ConfigError, OrchestrationConfig
from stagekit.stage import AgentWeights, StageContext, StageRecord, stage_digest
from pipeline.config import compose_run, load_cfg, to_container
from tests.flowenv import RANDOM_TEAM, free_port
from tests.paths import ROOT

NODES = "gpu,gpu1"  # the work pools of the stack's two nodes
SMALL = [*RANDOM_TEAM, "eval.before=False", "data.n_problems=24", "data.max_train_problems=3", "data.max_eval_problems=3", "search.max_nodes=4",
         "search.max_new_tokens=24", "eval.max_new_tokens=24", "train.train_batch=2", "train.micro_batch=4",
         "train.cycles=1", "grading.time_limit_s=2"]
OVERRIDE_LISTS = [
    [],
    ["agents=tiny_cpu_single", "train.kl_coef=0.002"],
    ["search=sampling", "train=grpo", "train.cycles=3", "agents.members.1.optimizer.lr=2e-6"],
    ["orchestration=pools", "orchestration.pools.grading=gpu", "++agents.members.0.tiny.seed=7"],
    ["agents=heterogeneous_8b", "agents.members.0.optimizer.lr=2e-6"],  # the example (composed, not run)
]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "MARS2_HOME": str(tmp / "home"), "HF_HUB_OFFLINE": "1", **extra}
    for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        if k not in extra:
            env.pop(k, None)
    return env


# ---------------------------------------------------------------- one config code path

@pytest.mark.parametrize("overrides", OVERRIDE_LISTS, ids=lambda o: " ".join(o) or "default")
def test_cli_and_deployment_compose_identical_configs(overrides, tmp_path, monkeypatch):
    """What ``flows/train_cycle.py <overrides> --cfg job`` shows (Hydra's @hydra.main composition) is what a
    deployment run with ``{"overrides": <overrides>}`` composes and runs."""
    env = _env(tmp_path, MARS2_MODELS=str(tmp_path / "models"))
    out = subprocess.run([sys.executable, "flows/train_cycle.py", *overrides, "--cfg", "job", "--resolve"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cli = yaml.safe_load(out.stdout)
    monkeypatch.setenv("MARS2_HOME", env["MARS2_HOME"])
    monkeypatch.setenv("MARS2_MODELS", env["MARS2_MODELS"])
    deployed = to_container(load_cfg(overrides))  # the composition train_cycle(overrides) starts from
    assert cli == deployed
    if not any(o.startswith("agents=heterogeneous") for o in overrides):  # CPU presets validate here
        from omegaconf import OmegaConf

        from pipeline.config import resolve

        assert to_container(resolve(OmegaConf.create(cli))) == to_container(compose_run(overrides))


def test_cli_gives_the_flow_each_jobs_overrides_and_multirun_runs_one_flow_per_job(tmp_path):
    probe = (
        "import json, sys\n"
        "import flows.train_cycle as m\n"
        "calls, names = [], []\n"
        "class Flow:\n"
        "    def __call__(self, overrides): calls.append(overrides)\n"
        "    def with_options(self, flow_run_name): names.append(flow_run_name); return self\n"
        "m.train_cycle = Flow()\n"
        "for argv in (['train.cycles=3', 'agents=tiny_cpu_single'],\n"
        "             ['-m', 'agents=tiny_cpu,tiny_cpu_single', 'train.kl_coef=0.001,0.002', 'search.max_nodes=4']):\n"
        "    sys.argv = ['flows/train_cycle.py', *argv]\n"
        "    m.main()\n"
        "print('CALLS=' + json.dumps(calls) + '\\nNAMES=' + json.dumps(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    calls = json.loads(out.stdout.split("CALLS=")[1].split("\n")[0])
    assert calls == [
        ["train.cycles=3", "agents=tiny_cpu_single"],
        ["agents=tiny_cpu", "train.kl_coef=0.001", "search.max_nodes=4"],
        ["agents=tiny_cpu", "train.kl_coef=0.002", "search.max_nodes=4"],
        ["agents=tiny_cpu_single", "train.kl_coef=0.001", "search.max_nodes=4"],
        ["agents=tiny_cpu_single", "train.kl_coef=0.002", "search.max_nodes=4"],
    ]
    # each -m job is headed by what varies, and its flow run (and so its MLflow run) is named by it
    names = json.loads(out.stdout.split("NAMES=")[1])
    assert names == ["agents=tiny_cpu train.kl_coef=0.001", "agents=tiny_cpu train.kl_coef=0.002",
                     "agents=tiny_cpu_single train.kl_coef=0.001", "agents=tiny_cpu_single train.kl_coef=0.002"]
    headers = [line.strip("─ ") for line in out.stderr.splitlines() if line.startswith("─")]
    assert headers == [f"job {i}: {name}" for i, name in enumerate(names)], out.stderr
    # multirun's per-job folders stay in the run folder, not the repository
    assert (tmp_path / "home" / "multirun").is_dir()


def test_a_runs_label_is_its_overrides_but_the_preset_in_the_order_given():
    from pipeline.config import override_label

    assert override_label([]) == override_label(["agents=tiny_cpu"]) == ""
    assert override_label(["train.kl_coef=0.002", "agents=tiny_cpu_single", "+paths.tags.arm=grpo", "hydra.job.chdir=1",
                           "debug.fail_at=grading", "agents.members.0.model=tiny"]) == \
        "train.kl_coef=0.002 +paths.tags.arm=grpo agents.members.0.model=tiny"


def test_a_sweep_point_is_named_by_what_the_sweep_varies():
    from flows.deploy import expand_grid, varied_keys
    from pipeline.config import run_name

    points = expand_grid(["agents=tiny_cpu", "data=toy", "train.seed=0,2", "train.kl_coef=0.001"])
    assert varied_keys(points) == ["train.seed"]
    assert [run_name("tiny_cpu", p, varied_keys(points)) for p in points] == \
        ["tiny_cpu train.seed=0", "tiny_cpu train.seed=2"]
    assert run_name("tiny_cpu", points[0]) == "tiny_cpu data=toy train.seed=0 train.kl_coef=0.001"
    assert run_name("tiny_cpu", ["agents=tiny_cpu"]) == ""


def test_sweep_grid_is_hydras_multirun_grid():
    from flows.deploy import expand_grid

    assert expand_grid(["agents=tiny_cpu,tiny_cpu_single", "train.kl_coef=0.001,0.002", "train.cycles=1"]) == [
        ["agents=tiny_cpu", "train.kl_coef=0.001", "train.cycles=1"],
        ["agents=tiny_cpu", "train.kl_coef=0.002", "train.cycles=1"],
        ["agents=tiny_cpu_single", "train.kl_coef=0.001", "train.cycles=1"],
        ["agents=tiny_cpu_single", "train.kl_coef=0.002", "train.cycles=1"],
    ]
    assert expand_grid(["search.max_nodes=range(4,12,4)"]) == [["search.max_nodes=4"], ["search.max_nodes=8"]]
    assert expand_grid([]) == [[]]


def test_a_sweep_with_a_bad_point_submits_nothing():
    from flows.deploy import submit_grid

    # fails while composing, before any Prefect call (no server here)
    with pytest.raises(ConfigError, match="agents=nope: no such option in config group 'agents'"):
        submit_grid(["agents=tiny_cpu,nope"])


def test_a_failed_sweep_names_its_failed_points_by_what_varies():
    from flows.deploy import failed_points

    grid = [["agents=tiny_cpu", "train.kl_coef=0.001", "train.cycles=1"],
            ["agents=tiny_cpu", "train.kl_coef=0.002", "train.cycles=1"],
            ["agents=tiny_cpu_single", "train.kl_coef=0.001", "train.cycles=1"]]
    rows = [{"flow_run": f"run-{i}", "overrides": o, "state": s}
            for i, (o, s) in enumerate(zip(grid, ["Completed", "Failed", "TIMEOUT"]))]
    assert failed_points(rows) == ("2 of 3 sweep points did not complete: run-1 [agents=tiny_cpu train.kl_coef=0.002] "
                                   "Failed; run-2 [agents=tiny_cpu_single train.kl_coef=0.001] TIMEOUT")
    assert failed_points([{"flow_run": "a", "overrides": ["train.cycles=1"], "state": "Crashed"}]) == \
        "1 of 1 sweep points did not complete: a [train.cycles=1] Crashed"


# ---------------------------------------------------------------- stages on pools

def _stage_names() -> list[str]:
    from pipeline.dispatch import ALL

    return list(ALL)


def _argument(hint, cfg, ctx: StageContext, rec: StageRecord):
    """A realistic value of a stage parameter's type (configs from the composed default run config)."""
    import dataclasses
    import typing

    from mars2.config import AgentConfig

    members = cfg.agents.members
    table = {StageContext: ctx, StageRecord: rec, AgentConfig: members[1], int: 1, float: 0.7, bool: False,
             str: "d" * 64, int | None: None, list[AgentConfig]: members, dict[str, StageRecord]: {m.name: rec for m in members},
             dict[str, typing.Any]: cfg.deepspeed, dict[str, str]: {m.name: f"/ckpt/{m.name}" for m in members},
             dict[str, dict[str, str]]: {m.name: {"model.safetensors": "e" * 64} for m in members}}
    if hint in table:
        return table[hint]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if type(value) is hint:
            return value
    raise AssertionError(f"no test value for a stage parameter of type {hint}")


def _stage_call(name: str) -> dict:
    import typing

    from pipeline.dispatch import ALL

    cfg = compose_run(SMALL, cuda_available=False)
    ctx = StageContext(root="/runs/x", flow_run_id="f-1", fail_at=None)
    rec = StageRecord(stage="update", key="ab" * 32, dir="/runs/x/artifacts/update/abab", files={"model/a": "h1"},
                      metrics={"loss": 0.25, "n": 3.0}, meta={"l": [1, 2.5, None]}, flow_run_id="f-0", seconds=1.5,
                      weights={"qwen_tiny": AgentWeights("model", "/runs/x/artifacts/agents/ab/qwen_tiny/tokenizer",
                                                         optimizer_dir="ds", buffer=None),
                               "llama_tiny": AgentWeights("/abs/model", "/abs/tok", buffer="buffer.parquet")})
    hints = typing.get_type_hints(ALL[name].fn)
    return {p: _argument(hints[p], cfg, ctx, rec) for p in hints if p != "return"}


@pytest.mark.parametrize("name", _stage_names())
def test_stage_arguments_reach_a_worker_with_the_same_cache_key(name):
    """A dispatched stage is rebuilt on the worker from JSON: same typed values, same cache key."""
    from pipeline.dispatch import ALL, decode_args, encode_args

    task = ALL[name]
    arguments = _stage_call(name)
    sent = json.loads(json.dumps(encode_args(arguments)))  # what Prefect stores and hands the worker
    received = decode_args(task.fn, sent)
    assert received == arguments
    assert {k: type(v) for k, v in received.items()} == {k: type(v) for k, v in arguments.items()}
    modules = ("pipeline.dispatch",)
    assert stage_digest(task.name, modules, received) == stage_digest(task.name, modules, arguments)


def test_stages_are_placed_by_their_pools(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from pipeline.dispatch import ALL, LocalStage, PoolStage, placed_stages

    local = placed_stages(OrchestrationConfig())
    assert all(isinstance(getattr(local, name), LocalStage) for name in ALL) and local.failed == []
    orchestration = compose_run(["orchestration=pools"], cuda_available=False).orchestration
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        pools = placed_stages(orchestration)
    placed = {task.name: (s.pool if isinstance(s, PoolStage) else "in-flow")
              for name, task in ALL.items() for s in [getattr(pools, name)]}
    assert {k: placed[k] for k in ("data", "agents", "grading", "advantage")} == dict.fromkeys(
        ("data", "agents", "grading", "advantage"), "in-flow")
    assert {k: placed[k] for k in ("rollout", "update", "evaluation")} == dict.fromkeys(
        ("rollout", "update", "evaluation"), "gpu")
    with temporary_settings({PREFECT_API_URL: None}), pytest.raises(ConfigError, match="PREFECT_API_URL"):
        placed_stages(orchestration)


def test_a_run_on_several_nodes_sends_each_owners_update_to_its_nodes_pool():
    """orchestration.node_pools: the owners' nodes become StageContext.engine_pools, which route each update (a role
    sharing weights is updated with its owner) while the other stages keep their pools; deploy registers a stage
    deployment for every node's pool."""
    from pipeline.dispatch import ALL, PoolStage, owner_pools
    from flows.deploy import deployment_pools

    run = compose_run(["orchestration=pools", "orchestration.node_pools=[n0,n1]", "agents.members.1.node=1"],
                      cuda_available=False)
    pools = owner_pools(run.orchestration, run.agents.owners)
    assert pools == {"qwen_tiny": "n0", "llama_tiny": "n1"}
    assert owner_pools(compose_run(["orchestration=pools"], cuda_available=False).orchestration, run.agents.owners) == {}
    ctx = StageContext(root="/r", engine_pools=pools)
    update = PoolStage("update_policy", ALL["update_policy"], "gpu", None, None, [])
    assert [update.pool_for({"ctx": ctx, "member": m}) for m in run.agents.members] == ["n0", "n1"]
    assert update.pool_for({"ctx": StageContext(root="/r"), "member": run.agents.members[1]}) == "gpu"
    assert PoolStage("rollout", ALL["rollout"], "gpu", None, None, []).pool_for({"ctx": ctx}) == "gpu"
    assert {"n0", "n1", "gpu", "cpu"} <= set(deployment_pools(["orchestration.node_pools=[n0,n1]"]))


def test_local_submit_runs_now_and_returns_a_finished_future():
    from pipeline.dispatch import LocalStage

    seen = []
    future = LocalStage(lambda *a: seen.append(a) or "record").submit(1, 2)
    assert seen == [(1, 2)] and future.done() and future.result() == "record"


def test_a_stage_that_raises_is_named_by_its_task_run_name(tmp_path):
    from pipeline.dispatch import placed_stages

    stage = placed_stages()
    ctx = StageContext(root=str(tmp_path), flow_run_id="f", fail_at="grading")
    with pytest.raises(Exception, match="fault injected in stage 'grading'"):
        stage.grade(ctx, load_cfg().grading, None, None, 3)
    assert stage.failed == ["grading-c3"]  # what the run's summary lists as FAILED


@pytest.mark.parametrize(("overrides", "message"), [
    (["orchestration.mode=cloud"], "orchestration.mode='cloud' is unknown"),
    (["+orchestration.pools.nope=gpu"], "unknown stage"),
    (["orchestration.stage_timeout_s=0"], "stage_timeout_s"),
    (["orchestration.node_pools=[n0,n1]"], "node_pools=\\['n0', 'n1'\\] needs orchestration=pools"),
    (["orchestration=pools", "orchestration.node_pools=[n0,n1]", "orchestration.pools.rollout=cpu"],
     r"stage\(s\) \['rollout'\] would run in the flow's own process"),
    (["orchestration=pools", "orchestration.node_pools=[n0,n1]", "orchestration.pools.update=cpu"],
     r"stage\(s\) \['update'\] would run in the flow's own process \(pool 'cpu'\) for every agent"),
    (["orchestration=pools", "orchestration.node_pools=[n0]", "agents.members.1.node=1"],
     r"node=1 but the run has 1 node\(s\)"),
    (["orchestration=pools", "orchestration.node_pools=[n0,n1]", "backend.persistent=false"],
     "needs backend.persistent=true"),
    (["orchestration=pools", "orchestration.node_pools=[n0,n1]", "agents=tiny_cpu_homogeneous",
      "agents.members.1.node=1"],
     "shares the weights of"),
])
def test_bad_orchestration_gives_a_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose_run(overrides, cuda_available=False)


def test_a_role_on_its_owners_node_by_default_or_by_name_is_accepted_and_one_process_flows_refuse_nodes(paper_data):
    both = ["orchestration=pools", "orchestration.node_pools=[n0,n1]", "agents=tiny_cpu_homogeneous"]
    assert [m.node for m in compose_run([*both, "agents.members.1.node=0"], cuda_available=False).agents.members] \
        == [None, 0]
    with pytest.raises(ConfigError, match="this flow runs every stage in its own process"):
        compose_run(["orchestration=pools", "orchestration.node_pools=[n0,n1]"], config_name="evaluate",
                    updates=False, dispatch=False, cuda_available=False)
    with pytest.raises(ConfigError, match="cannot plan the run"):  # no plan, no placement on several nodes
        compose_run(["agents=heterogeneous_8b", "orchestration=pools", "orchestration.node_pools=[n0,n1]",
                     "agents.members.0.model=/nonexistent/custom-model", *paper_data])


def test_pools_mode_without_a_server_fails_fast_on_the_cli(tmp_path):
    out = subprocess.run([sys.executable, "flows/train_cycle.py", "orchestration=pools"], cwd=ROOT, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "mars2: config error: orchestration=pools" in out.stderr and "PREFECT_API_URL" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "home" / "artifacts").exists()


# ---------------------------------------------------------------- a real server and workers (slow)

def _stop(procs: list[subprocess.Popen]) -> None:
    """Interrupt processes we started and their process groups (a worker's flow-run children) together; kill the
    ones still there after 15 s."""
    def signal_all(sig) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)

    signal_all(signal.SIGINT)
    deadline = time.monotonic() + 15
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    signal_all(signal.SIGKILL)
    for proc in procs:
        proc.wait(5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """prefect server (SQLite) + deployments + process workers on pools cpu, gpu and gpu1 (a second node: its
    worker's MARS2_NODE_NAME is node1; every node is reached at 127.0.0.1); stopped afterwards."""
    tmp = tmp_path_factory.mktemp("stack")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    base = _env(tmp, PREFECT_HOME=str(tmp / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    client_env = {**base, "PREFECT_API_URL": api, "PREFECT_WORKER_QUERY_SECONDS": "1", "MARS2_NODE_ADDRESS": "127.0.0.1"}
    procs: list[subprocess.Popen] = []

    def start(args, env, log):
        procs.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=(tmp / log).open("w"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        return procs[-1]

    try:
        server = start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
                        "--no-ui"], base, "server.log")
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prefect server did not start in 120 s"
            time.sleep(1)
        reg = subprocess.run([sys.executable, "flows/deploy.py", "--pool", "cpu", f"orchestration.node_pools=[{NODES}]"],
                             cwd=ROOT, env=client_env, capture_output=True, text=True, timeout=180)
        assert reg.returncode == 0, reg.stdout + reg.stderr
        for pool, node in (("cpu", {}), ("gpu", {}), ("gpu1", {"MARS2_NODE_NAME": "node1"})):
            start([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
                  {**client_env, **node}, f"worker-{pool}.log")
        yield dict(tmp=tmp, api=api, env=client_env, home=Path(base["MARS2_HOME"]), register=reg.stdout)
    finally:
        _stop(procs[1:])  # the workers, then the server they talk to
        _stop(procs[:1])


def _sweep(stack, *args: str, timeout: int = 420) -> tuple[subprocess.CompletedProcess, list[str]]:
    out = subprocess.run([sys.executable, "flows/deploy.py", "sweep", "--wait", "--timeout", str(timeout - 30), *args],
                         cwd=ROOT, env=stack["env"], capture_output=True, text=True, timeout=timeout)
    ids = [line.split()[2] for line in out.stdout.splitlines() if line.startswith("submitted ")]
    return out, ids


def _stage_table(stack, flow_run_id: str) -> pd.DataFrame:
    with sqlite3.connect(stack["home"] / "mlflow.db") as db:
        (run_id,) = db.execute("select run_uuid from tags where key = 'prefect.flow_run_id' and value = ?",
                               (flow_run_id,)).fetchone()
    return pd.read_parquet(stack["home"] / "runs" / f"{run_id}.parquet").set_index("stage")


def _mlflow_metric(stack, flow_run_id: str, key: str) -> float | None:
    with sqlite3.connect(stack["home"] / "mlflow.db") as db:
        row = db.execute("select m.value from metrics m join tags t on t.run_uuid = m.run_uuid where "
                         "t.key = 'prefect.flow_run_id' and t.value = ? and m.key = ?", (flow_run_id, key)).fetchone()
    return row[0] if row else None


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _flow_runs(stack, flow_name: str) -> list[dict]:
    r = httpx.post(f"{stack['api']}/flow_runs/filter", json={"flows": {"name": {"any_": [flow_name]}}}, timeout=10)
    r.raise_for_status()
    return r.json()


def _worker_submitted(stack, flow_run_id: str) -> datetime:
    """When the pool's worker launched the flow run (its "submitting flow run" log line)."""
    r = httpx.post(f"{stack['api']}/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}}, timeout=10)
    r.raise_for_status()
    (line,) = [log for log in r.json() if "submitting flow run" in log["message"]]
    return datetime.fromisoformat(line["timestamp"])


def _logs(stack) -> str:
    return "\n".join((stack["tmp"] / f).read_text()[-4000:] for f in ("worker-cpu.log", "worker-gpu.log",
                                                                     "worker-gpu1.log"))


def test_a_pool_whose_only_worker_is_offline_counts_as_polled_by_no_one(monkeypatch):
    """Prefect keeps every worker that ever polled a pool and marks it OFFLINE after missed heartbeats: a pool whose
    only worker went away is refused like one nobody ever polled (a stack that once ran a single-node GPU worker
    on ``gpu`` and moved to node pools); an ONLINE worker passes."""
    import prefect.client.orchestration as orchestration
    from prefect.client.schemas.objects import WorkerStatus

    import pipeline.dispatch as dispatch

    statuses = [WorkerStatus.OFFLINE]

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read_workers_for_work_pool(self, work_pool_name):
            return [SimpleNamespace(status=status) for status in statuses]

    monkeypatch.setattr(orchestration, "get_client", lambda sync_client=False: Client())
    monkeypatch.setattr(dispatch, "NO_WORKER_WAIT_S", 0.1)
    with pytest.raises(RuntimeError, match="work pool 'gpu', which no worker polls"):
        dispatch.require_worker("gpu", "stage rollout c0")
    statuses.append(WorkerStatus.ONLINE)
    dispatch.require_worker("gpu", "stage rollout c0")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stage_sent_to_a_pool_no_worker_polls_fails_naming_it_instead_of_waiting(stack, monkeypatch):
    """A stage routed to a pool that exists but that no worker polls (the default gpu pool of a run whose workers
    poll only node pools) fails after NO_WORKER_WAIT_S, naming the pool and the fix; Prefect alone would keep its
    flow run scheduled for ever."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import pipeline.dispatch as dispatch

    made = subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", "nobody", "--type", "process"],
                          cwd=ROOT, env=stack["env"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stdout + made.stderr
    monkeypatch.setattr(dispatch, "NO_WORKER_WAIT_S", 3.0)
    started = time.monotonic()
    with temporary_settings(updates={PREFECT_API_URL: stack["api"]}), \
            pytest.raises(RuntimeError, match=r"work pool 'nobody', which no worker polls.*"
                                              r"prefect worker start --pool nobody"):
        dispatch.run_on_pool("nobody", {"stage": "rollout", "args": {}, "pool": "nobody"}, "rollout c0",
                             timeout_s=None, timeout_hint="orchestration.stage_timeout_s")
    assert time.monotonic() - started < 30
    with temporary_settings(updates={PREFECT_API_URL: stack["api"]}):
        dispatch.require_worker("gpu1", "stage x")  # a pool with a worker: passes at once
        dispatch.require_worker("no-such-pool", "stage x")  # no pool at all: run_on_pool's own error says so


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_registration_makes_every_deployment(stack):
    for name in ("train-cycle/cpu", "sweep/cpu", "stage/cpu", "stage/gpu", "stage/gpu1"):
        assert f"deployment {name} " in stack["register"]
    # each run's default CPU budget is all of its worker's cores: a sweep's points take turns (docs/cpu.md)
    r = httpx.get(f"{stack['api']}/deployments/name/train-cycle/cpu", timeout=10)
    r.raise_for_status()
    assert r.json()["global_concurrency_limit"]["limit"] == 1
    stage = httpx.get(f"{stack['api']}/deployments/name/stage/cpu", timeout=10)  # a run waits on its own stages
    stage.raise_for_status()
    assert stage.json()["global_concurrency_limit"] is None


def _run_deployment(stack, name: str, parameters: dict, timeout: int = 300) -> dict:
    """``run_deployment`` from a client process pointed at the test server; waits for the run's final state."""
    submit = (
        "import json\n"
        "from prefect.deployments import run_deployment\n"
        f"run = run_deployment({name!r}, parameters={parameters!r}, timeout={timeout}, poll_interval=2)\n"
        "print('RUN=' + json.dumps({'state': run.state.name, 'id': str(run.id), 'message': run.state.message}))\n"
    )
    out = subprocess.run([sys.executable, "-c", submit], cwd=ROOT, env=stack["env"], capture_output=True, text=True,
                         timeout=timeout + 60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.split("RUN=")[1])


def _wait_final(stack, flow_name: str, select, n: int, timeout_s: float = 400) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = [r for r in _flow_runs(stack, flow_name) if select(r)]
        if len(runs) == n and all(r["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for r in runs):
            return runs
        assert time.monotonic() < deadline, [(r["name"], r["state_type"]) for r in runs]
        time.sleep(2)


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_default_flow_runs_from_its_deployment_submitted_by_the_sweep_deployment(stack):
    """What a person does in the UI: run ``sweep/cpu`` with a grid; it starts ``train-cycle/cpu`` runs on the cpu
    pool's process worker (here two points: the default flow made small, and one whose model does not exist). The
    sweep's run waits for both and ends Failed, naming the failed point by the override that varies."""
    missing = "/nonexistent/model"
    sweep = _run_deployment(stack, "sweep/cpu", {"grid": [*SMALL, f"agents.members.0.model=tiny,{missing}"]},
                            timeout=500)
    assert sweep["state"] == "Failed", _logs(stack)
    runs = _wait_final(stack, "train-cycle", lambda r: r["parent_task_run_id"], 2, timeout_s=30)  # its children
    (run,) = [r for r in runs if r["state_type"] == "COMPLETED"]
    (bad,) = [r for r in runs if r["state_type"] != "COMPLETED"]
    assert f"1 of 2 sweep points did not complete: {bad['name']} [agents.members.0.model={missing}] Failed" \
        in sweep["message"], sweep["message"]
    assert run["parameters"] == {"overrides": [*SMALL, "agents.members.0.model=tiny"]}
    r = httpx.post(f"{stack['api']}/logs/filter", json={"logs": {"flow_run_id": {"any_": [sweep["id"]]}}}, timeout=10)
    listed = [log["message"] for log in r.json() if log["message"].startswith("point ")]  # the sweep's log lists them
    assert len(listed) == 2 and all(any(f"({child['id']}): {' '.join(child['parameters']['overrides'])}" in line
                                        for line in listed) for child in runs), listed
    assert run["work_pool_name"] == "cpu"
    table = _stage_table(stack, run["id"])
    assert set(table.index) == {"data", "agents", "rollout", "grading", "advantage", "update/qwen_tiny",
                                "update/llama_tiny", "eval"}
    assert (table["status"] == "ran").all()
    stack["local_keys"] = table["key"].to_dict()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pools_mode_runs_each_owners_update_and_engine_on_its_nodes_pool(stack):
    """``flows/deploy.py sweep --wait`` from the command line, with ``orchestration=pools`` on two nodes (pools gpu
    and gpu1, llama_tiny on node 1): rollout and evaluation run as ``stage`` flow runs on the gpu pool, each agent's
    update on its node's pool (both at once); the evaluation reaches llama_tiny's engine as a service on node1,
    started there by a ``serve_engine`` flow run on gpu1, over TCP."""
    if "local_keys" not in stack:
        pytest.skip("needs the default run")
    out, ids = _sweep(stack, *SMALL, "orchestration=pools", f"orchestration.node_pools=[{NODES}]",
                      "agents.members.1.node=1", "train.seed=1")
    assert out.returncode == 0 and ": Completed" in out.stdout, out.stdout + out.stderr + _logs(stack)
    table = _stage_table(stack, ids[0])
    # the same cache keys in both modes and on any node: data, agents, rollout, grading and advantage (train.seed in
    # none of their keys) came back from cache, the rollout through a gpu worker; train.seed=1 gives new updates
    # and evaluation
    assert table.loc[["data", "agents", "rollout", "grading", "advantage"], "status"].eq("cached").all()
    assert table.loc["rollout", "key"] == stack["local_keys"]["rollout"]
    assert table.loc[["update/qwen_tiny", "update/llama_tiny", "eval"], "status"].eq("ran").all()
    stages = {r["name"]: r for r in _flow_runs(stack, "stage")}
    assert set(stages) == {"rollout-c0", "update-qwen_tiny-c0", "update-llama_tiny-c0", "evaluation-c0",
                           "engine-llama_tiny"}
    assert all(r["state_type"] == "COMPLETED" and r["parent_task_run_id"] for r in stages.values())
    assert {name: r["work_pool_name"] for name, r in stages.items()} == {
        "rollout-c0": "gpu", "update-qwen_tiny-c0": "gpu", "update-llama_tiny-c0": "gpu1", "evaluation-c0": "gpu",
        "engine-llama_tiny": "gpu1"}
    # the dispatcher launched each update before the other had finished (when each process got to its first line
    # depends on how busy the machine is: on 2 loaded cores one can still be importing torch when the other ends)
    a, b = (stages[n] for n in ("update-qwen_tiny-c0", "update-llama_tiny-c0"))
    launch_a, launch_b = (_worker_submitted(stack, r["id"]) for r in (a, b))
    end_a, end_b = (datetime.fromisoformat(r["end_time"]) for r in (a, b))
    assert launch_a < end_b and launch_b < end_a, "the two agents' updates ran one after the other"
    assert len(list((stack["home"] / "dispatch").glob("*.json"))) == 5
    # the evaluation's engines were node services, qwen_tiny's on the gpu worker's node and llama_tiny's on node1
    # (TCP), counted by the flow and stopped with the run
    (starts,) = (stack["home"] / "engines").glob("*/starts")
    assert sorted(line.split()[:2] for line in starts.read_text().splitlines()) == [
        ["llama_tiny", "node1"], ["qwen_tiny", socket.gethostname()]]
    record = json.loads((starts.parent / "node1" / "llama_tiny.json").read_text())
    assert record["family"] == "AF_INET" and record["address"][0] == "127.0.0.1"
    assert (starts.parent / "STOP").exists()
    engine_starts = _mlflow_metric(stack, ids[0], "engine_starts")
    assert engine_starts == 2, engine_starts
    pids = [int(line.split()[2]) for line in starts.read_text().splitlines() if line.split()[2].isdigit()]
    deadline = time.time() + 20
    while any(_running(pid) for pid in pids):
        assert time.time() < deadline, "node services outlived their run"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_sweep_point_is_a_run_named_by_its_overrides_under_one_mlflow_filter(stack):
    """A command-line run reported to the server prints links to its Prefect flow run and its MLflow run; a 2-point
    sweep after it, one point with the same settings (every stage from cache: it reuses that run) and one not,
    shows two runs under the filter ``tags.mars2.sweep = '<id>'``, each named by its overrides, and the sweep's points
    are Prefect flow runs named the same way."""
    base = [*SMALL, "agents.members.0.model=tiny"]
    cli = subprocess.run([sys.executable, "flows/train_cycle.py", *base], cwd=ROOT, env=stack["env"],
                         capture_output=True, text=True, timeout=400)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    console = cli.stdout + cli.stderr
    assert console.lstrip().startswith(f"mars2 train cycle: {' '.join(base)}: checking it"), console[:300]
    assert "Prefect flow run: http://" in console and "/flow-run/" in console, console[-1500:]
    assert "#/experiments/" in console, console[-1500:]  # the MLflow run's link

    out, ids = _sweep(stack, *base, "train.seed=0,2")
    assert out.returncode == 0, out.stdout + out.stderr + _logs(stack)
    (sweep_id,) = {line.split("'")[1] for line in out.stdout.splitlines() if "tags.mars2.sweep" in line}
    with sqlite3.connect(stack["home"] / "mlflow.db") as db:
        names = dict(db.execute("select r.run_uuid, r.name from runs r join tags t on t.run_uuid = r.run_uuid "
                                "where t.key = 'mars2.sweep' and t.value = ?", (sweep_id,)).fetchall())
        overrides = dict(db.execute("select run_uuid, value from tags where key = 'mars2.overrides'").fetchall())
    assert len(names) == 2, names
    label = " ".join(o for o in base if not o.startswith("agents="))
    # a sweep's point is named by what the sweep varies; the reused run keeps the name of whichever run made it (the
    # command-line run: all its overrides; an earlier test's sweep point: what that sweep varied)
    assert "tiny_cpu train.seed=2" in names.values() and len(set(names.values())) == 2, names
    assert sorted(overrides[r] for r in names) == sorted([label, f"{label} train.seed=2"])
    points = {r["id"]: r["name"] for r in _flow_runs(stack, "train-cycle") if r["id"] in ids}
    assert sorted(points.values()) == ["tiny_cpu train.seed=0", "tiny_cpu train.seed=2"], points
    assert sorted(line.split(":")[0] for line in out.stdout.splitlines() if line.endswith(": Completed")) == \
        ["tiny_cpu train.seed=0", "tiny_cpu train.seed=2"], out.stdout  # the final lines use the new names
