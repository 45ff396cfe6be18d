"""The plan's placement is the runtime's: every GPU preset, composed at the flow's entry, starts each weight owner's
engines and update on exactly the GPUs the planner assigned it, and no two owners share a GPU."""

from __future__ import annotations

import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from mars2.backends.base import visible_devices
from mars2.backends.engine import EngineError
from mars2.plan import PlanRefused, plan
from mars2.backends.vllm_backend import vllm_engine_args
from mars2.plan.placement import owner_gpus, owner_nodes, place, require_placeable
from mars2.plan.planner import _layout
from mars2.train.launch import launch_environment
from pipeline.config import compose_run, load_cfg, resolve
from pipeline.dispatch import all_results, owner_pools
from stagekit.engines import EnginePool
from tasks.update import node_ranks, update_devices
from stagekit.runners import engine_placement, in_process_device

GPU_PRESETS = ("single_8b", "homogeneous_8b", "heterogeneous_8b", "heterogeneous_14b", "heterogeneous_32b")
ONE_NODE = ("plan.node_per_agent=false", "agents.members.0.gpus=4", "agents.members.1.gpus=4")


@pytest.fixture(autouse=True)
def _no_models(monkeypatch):
    monkeypatch.delenv("MARS2_MODELS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _span_gpus(spans) -> list[int]:
    return [g for s in spans for g in range(s.first, s.last + 1)]


def _compose(preset: str, paper_data, *extra: str):
    overrides = [f"agents={preset}", "orchestration=pools", *paper_data, *extra]
    if preset.startswith("heterogeneous"):
        overrides += ONE_NODE
    return compose_run(overrides)


@pytest.mark.parametrize("preset", GPU_PRESETS)
@pytest.mark.parametrize("backend", ["vllm", "transformers"])
def test_each_owner_starts_on_the_gpus_its_plan_gives_it(preset, backend, paper_data):
    short = ["search.max_new_tokens=2048", "eval.max_new_tokens=2048"] if backend == "transformers" else []
    run = _compose(preset, paper_data, f"backend={backend}", *short,  # transformers: its padded KV cache fits 2K
                   *(f"agents.members.{i}.backend={backend}" for i in range(2 if preset != "single_8b" else 1)))
    cp = plan(run)
    assert cp.fits
    planned = {a.name: a for a in cp.agents}
    taken: set[int] = set()
    for m in run.agents.members:
        a = planned[m.shares_weights_with or m.name]
        assert m.gpu_ids == _span_gpus(a.update_spans) and m.gpu_ids  # the entry wrote the plan into the config
        device, visible = engine_placement(m)
        assert device == "cuda" and visible == ",".join(map(str, _span_gpus(a.rollout.spans)))
        assert update_devices(m) == ",".join(map(str, _span_gpus(a.update_spans)))
        assert in_process_device(m) == f"cuda:{a.update_spans[0].first}"
        if m.shares_weights_with is None:
            assert not taken & set(m.gpu_ids)  # no two owners on one GPU
            taken |= set(m.gpu_ids)
    if preset.startswith("heterogeneous"):
        assert len(taken) == 8 and {s.node for a in cp.agents for s in a.update_spans} == {0}


@pytest.mark.parametrize("preset", [p for p in GPU_PRESETS if p.startswith("heterogeneous")])
def test_the_papers_one_node_per_agent_layout_needs_a_pool_per_node(preset, paper_data):
    """Two owners on two nodes need a work pool per node (an engine on another node is a service its pool starts).
    Without them the run reaches one node: the plan packs the owners onto it, halving their GPUs, and the run uses
    that layout (GPUs, devices, engines' TP); with node pools each owner is placed on its node's GPUs, its update routed
    to that node's pool and its engine provided there."""
    asked = resolve(load_cfg([f"agents={preset}", "orchestration=pools", *paper_data]), planning=True)
    assert "on nodes of their own do not fit 1 node(s)" in plan(asked).chosen
    packed = compose_run([f"agents={preset}", "orchestration=pools", *paper_data])
    cp = plan(packed)
    assert cp.chosen.endswith("as the preset asks") and place(packed, cp) == packed  # placed: planning again agrees
    assert [(m.node, m.gpus, m.gpu_ids) for m in packed.agents.members] == [(0, 4, [0, 1, 2, 3]), (0, 4, [4, 5, 6, 7])]
    for m, a in zip(packed.agents.members, cp.agents, strict=True):
        engine = vllm_engine_args("/m", m, packed.backend)
        assert m.tensor_parallel_size == a.rollout.tp == engine.tensor_parallel_size
        assert engine.data_parallel_size == a.rollout.replicas == 4 // a.rollout.tp
    run = compose_run([f"agents={preset}", "orchestration=pools", *paper_data,
                       "orchestration.node_pools=[gpu-node0,gpu-node1]"])
    cp = plan(run)
    assert [(m.node, m.gpu_ids) for m in run.agents.members] == [(0, list(range(8))), (1, list(range(8)))]
    assert owner_nodes(cp) == {m.name: m.node for m in run.agents.members}
    assert owner_pools(run.orchestration, run.agents.owners) == {run.agents.members[0].name: "gpu-node0",
                                                                  run.agents.members[1].name: "gpu-node1"}
    with pytest.raises(PlanRefused, match="node=0 but the plan places it on node 1"):
        compose_run([f"agents={preset}", "orchestration=pools", *paper_data,
                     "orchestration.node_pools=[gpu-node0,gpu-node1]", "agents.members.1.node=0"])
    with pytest.raises(PlanRefused, match="names a work pool for 1 node"):  # a plan made for other pools
        place(packed, cp)


def test_an_agent_never_spans_nodes(paper_data):
    """6 GPUs asked on nodes of 4: the plan halves to 3 + 2, each on one node, and refuses a plan that spans."""
    run = compose_run(["agents=heterogeneous_8b", "orchestration=pools", *paper_data, "plan.gpus_per_node=4",
                       "plan.nodes=4", "agents.members.0.gpus=6", "agents.members.1.gpus=4",
                       "orchestration.node_pools=[a,b,c,d]"])
    assert [(m.gpus, m.node) for m in run.agents.members] == [(3, 0), (2, 1)]
    spread = _layout(run, {"qwen3_8b": 6, run.agents.members[1].name: 4}, True, 4)
    with pytest.raises(PlanRefused, match=r"spreads agent\(s\) \['qwen3_8b'\] over several nodes"):
        require_placeable(spread, ["a", "b", "c", "d"])


def test_an_evaluation_fits_only_its_engines_and_may_take_a_smaller_layout_than_training(paper_data):
    """heterogeneous_14b on one node of 8 GPUs of 80 GB: training fits neither 8 + 8 (one node) nor 4 + 4 (the update
    needs 101 GB per GPU) and is refused; an evaluation, which runs no update, takes 4 + 4 (review 9 of the GPU
    path, finding 4: it kept the preset's layout and refused the second agent)."""
    one_node = ["agents=heterogeneous_14b", "orchestration=pools", "plan.gpu_memory_gb=80", "plan.nodes=1",
                *paper_data]
    with pytest.raises(PlanRefused, match="the update needs 101.0 GB per GPU on 4 GPU"):
        compose_run(one_node)
    run = compose_run(one_node, config_name="evaluate", updates=False, dispatch=False)
    assert [(m.gpus, m.gpu_ids, m.tensor_parallel_size) for m in run.agents.members] == \
        [(4, [0, 1, 2, 3], 4), (4, [4, 5, 6, 7], 4)]
    cp = plan(resolve(load_cfg(one_node, config_name="evaluate"), planning=True), updates=False)
    assert cp.fits and not cp.updates and [a.gpus_min for a in cp.agents] == [1, 1]
    small = [*one_node, "plan.gpu_memory_gb=24"]  # 27.5 GB of weights: an engine needs TP 2
    assert [a.gpus_min for a in plan(resolve(load_cfg(small, config_name="evaluate"), planning=True),
                                     updates=False).agents] == [2, 2]
    tiny = plan(resolve(load_cfg([*small, "plan.gpus_per_node=2"], config_name="evaluate"), planning=True),
                updates=False)
    assert not tiny.fits and "even without an update" in tiny.refusal() and "deepspeed" not in tiny.refusal()


def test_a_plan_that_leaves_an_owner_without_gpus_or_ranks_is_refused_before_anything_starts(paper_data):
    """An engine with no GPUs of its own would see every GPU, the other owner's too: refused, in an evaluation as in
    training. Ranks asked for (update_procs) that a halved layout cannot give rule that layout out in the plan
    itself, not only at the entry."""
    with pytest.raises(PlanRefused, match="agent 'areal_14b': no room"):
        compose_run(["agents=heterogeneous_14b", "orchestration=pools", "plan.nodes=1", "plan.gpus_per_node=1",
                     *paper_data], config_name="evaluate", updates=False, dispatch=False)
    cp = plan(resolve(load_cfg(["agents=heterogeneous_8b", "plan.nodes=1", "agents.members.0.update_procs=8",
                                *paper_data]), planning=True))
    assert not cp.fits and "update_procs=8 ranks need as many GPUs but it has 4" in cp.refusal()


def test_engines_and_updates_map_the_plans_gpus_through_the_workers_own_visible_devices(paper_data, monkeypatch):
    run = _compose("heterogeneous_8b", paper_data)
    second = run.agents.members[1]
    assert second.gpu_ids == [4, 5, 6, 7]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "8,9,10,11,12,13,14,15")
    assert engine_placement(second) == ("cuda", "12,13,14,15")
    assert update_devices(second) == "12,13,14,15"
    assert launch_environment(4, dict(os.environ), update_devices(second))["CUDA_VISIBLE_DEVICES"] == "12,13,14,15"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with pytest.raises(ValueError, match="shows 4"):
        engine_placement(second)
    env = launch_environment(2, {"RANK": "3", "PATH": "/bin"}, None, threads_per_rank=3)
    assert "RANK" not in env and env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "3"


def test_a_transformers_engine_takes_its_owners_first_gpu(paper_data):
    run = _compose("heterogeneous_8b", paper_data, "agents.members.1.backend=transformers",
                   "search.max_new_tokens=2048", "eval.max_new_tokens=2048")
    assert engine_placement(run.agents.members[1]) == ("cuda", "4")
    assert visible_devices([1, 2], "5,6,7") == "6,7" and visible_devices([0, 3], None) == "0,3"


def _started_environment(tmp_path, monkeypatch, **spec) -> list[str]:
    """What an engine process really gets: an interpreter that writes part of its environment and exits."""
    seen = tmp_path / "seen"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES|$OMP_NUM_THREADS|$VLLM_CPU_OMP_THREADS_BIND|"
                    f"$TORCHINDUCTOR_VEC_ISA_OK\" > {seen}\n"
                    "exit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for name in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "TORCHINDUCTOR_VEC_ISA_OK"):
        monkeypatch.delenv(name, raising=False)
    pool = EnginePool(persistent=True, start_timeout_s=30)
    with pytest.raises(EngineError, match="exited with code 3"):
        pool.engine("areal_8b", str(tmp_path), str(tmp_path), "v1", dtype="bfloat16", batch_size=4, kind="vllm",
                    python=str(fake), vllm={"model": str(tmp_path)}, **spec)
    return seen.read_text().strip().split("|")


def test_the_engine_process_is_started_with_the_placed_devices(tmp_path, monkeypatch):
    assert _started_environment(tmp_path, monkeypatch, device="cuda", cuda_visible_devices="4,5,6,7") == ["4,5,6,7",
                                                                                                            "", "", ""]


def test_a_vllm_engine_on_the_cpu_gets_its_share_of_the_cores_unpinned(tmp_path, monkeypatch):
    """vLLM's CPU build pins each engine's OpenMP threads to all cores of the first NUMA node unless told otherwise: two
    engines of a run would spin on the same cores. Each gets its share (``threads``), unpinned, and trusts the CPU's
    vector ISA in inductor's builds (mars2.backends.vllm_env.engine_environment)."""
    assert _started_environment(tmp_path, monkeypatch, device="cpu", threads=1) == ["", "1", "nobind", "1"]


def test_a_given_gpu_list_or_device_index_must_be_the_plans(paper_data):
    run = _compose("heterogeneous_8b", paper_data)
    cp = plan(run)
    first, second = run.agents.members
    assert owner_gpus(cp) == {first.name: [0, 1, 2, 3], second.name: [4, 5, 6, 7]}
    moved = replace(run, agents=replace(run.agents, members=[first, replace(second, gpu_ids=[0, 1, 2, 3])]))
    with pytest.raises(PlanRefused, match="gpu_ids=\\[0, 1, 2, 3\\]"):
        place(moved, cp)
    pinned = replace(run, agents=replace(run.agents, members=[first, replace(second, gpu_ids=[], device="cuda:0")]))
    with pytest.raises(PlanRefused, match="write device: cuda"):
        place(pinned, cp)
    assert place(run, cp) == run  # placing twice changes nothing


def test_cpu_agents_are_not_placed():
    run = compose_run([])
    assert all(m.gpu_ids == [] for m in run.agents.members)
    assert engine_placement(run.agents.members[0]) == ("cpu", None)
    assert in_process_device(run.agents.members[0]) == "cpu" and update_devices(run.agents.members[0]) is None


def test_a_failed_update_waits_for_the_other_agents_before_its_error_is_raised():
    """Concurrent updates of two agents: the first fails at once, the second is still running on its GPUs; the
    error comes only once the second has finished (a retry must find it done, not still holding its GPUs)."""
    finished = threading.Event()

    def fails():
        raise RuntimeError("update of agent a failed")

    def slow():
        time.sleep(0.5)
        finished.set()
        return "b's record"

    with ThreadPoolExecutor(2) as executor:
        futures = {"a": executor.submit(fails), "b": executor.submit(slow)}
        with pytest.raises(RuntimeError, match="agent a"):
            all_results(futures)
        assert finished.is_set()
        assert all_results({"b": futures["b"]}) == {"b": "b's record"}


def test_two_updates_on_one_node_share_its_cores_only_where_they_run_at_once(paper_data):
    """One node of 8 GPUs, each agent's update on 4 of them: in pools mode both updates run at once, so a rank gets an
    eighth of the node's cores (16 ranks' threads on 8 ranks' cores before); in local mode they run one after the
    other and each rank gets a quarter. Two nodes (node pools): each update has its node to itself."""
    from mars2.cpu import split_cpus
    from pipeline.dispatch import concurrent_update_ranks
    from stagekit.stage import StageContext

    cfg = _compose("heterogeneous_32b", paper_data)
    owners = cfg.agents.owners
    assert [m.processes for m in owners] == [4, 4]
    pools = StageContext(root="/r", node_update_ranks=concurrent_update_ranks(cfg.orchestration, owners))
    assert [node_ranks(pools, m) for m in owners] == [8, 8]
    assert split_cpus(64, update_ranks=node_ranks(pools, owners[0])).update_rank == 8
    local = StageContext(root="/r", node_update_ranks=concurrent_update_ranks(replace(cfg.orchestration, mode="local"),
                                                                              owners))
    assert [node_ranks(local, m) for m in owners] == [4, 4]
    two_nodes = [replace(owners[0], node=0), replace(owners[1], node=1)]
    assert concurrent_update_ranks(cfg.orchestration, two_nodes) == {m.name: 4 for m in owners}


def test_a_plan_for_other_gpus_than_the_machines_is_refused_before_anything_runs(paper_data):
    """The default plan is 8 GPUs of 141 GB a node: on a 4-GPU box the second agent's GPUs 4-7 do not exist (vLLM
    and torchrun fail late and obscurely), and on 80 GB cards the 14B update runs out of memory after hours of
    rollout. Both are refused at once, naming the plan.* settings."""
    from mars2.config import ConfigError, GpuInventory, check_gpus

    owners = _compose("heterogeneous_14b", paper_data).agents.owners
    assert max(i for m in owners for i in m.gpu_ids) == 7
    h200, h100 = 143771 / 1024, 81559 / 1024  # nvidia-smi's MiB of each card, in the planner's GiB
    check_gpus(owners, gpu_memory_gb=141, inventory=GpuInventory(8, h200, ("Default",) * 8))  # as planned
    with pytest.raises(ConfigError, match=r"8 GPUs of a node, but this machine sees 4.*plan.gpus_per_node=4"):
        check_gpus(owners, gpu_memory_gb=141, inventory=GpuInventory(4, h200))
    with pytest.raises(ConfigError, match=r"GPUs of 141 GB, but this machine's have 79.6 GB.*plan.gpu_memory_gb=79 "):
        check_gpus(owners, gpu_memory_gb=141, inventory=GpuInventory(8, h100))
    check_gpus(owners, gpu_memory_gb=80, inventory=GpuInventory(8, h100))  # docs/gpu.md's H100 plan
    check_gpus(owners, gpu_memory_gb=141, inventory=GpuInventory(8))  # no nvidia-smi: the count alone
    with pytest.raises(ConfigError, match=r"compute mode Exclusive_Process.*Default"):
        check_gpus(owners, gpu_memory_gb=141, inventory=GpuInventory(8, h200, ("Default", "Exclusive_Process")))


def test_the_gpu_inventory_reads_the_visible_gpus_in_gib(tmp_path, monkeypatch):
    """nvidia-smi reports MiB and ignores CUDA_VISIBLE_DEVICES: the inventory asks it for the visible devices and
    converts to the planner's GiB (an H100's 81,559 MiB read 85.5 'GB' and the refusal advised a plan 5.4 GiB too
    large per GPU)."""
    from mars2.config import gpu_inventory

    calls = tmp_path / "calls"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nprintf '81559, Default\\n143771, Exclusive_Process\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    inventory = gpu_inventory()
    assert inventory.memory_gb == pytest.approx(79.65, abs=0.01)
    assert inventory.compute_modes == ("Default", "Exclusive_Process")
    assert "--id=2,5" in calls.read_text()


def test_in_pools_mode_each_gpu_worker_checks_its_gpus_hold_the_plan(tmp_path, monkeypatch):
    """Pools mode (the multi-node layout) checked only the GPU count on its workers: a 141-GiB plan on 80-GB cards ran
    the whole rollout and died in the update. The plan's memory travels in the stage context; the update, the
    engines a stage loads and an engine served to another node each check it on their worker first."""
    import mars2.config as config
    from mars2.backends.engine import EngineSpec
    from mars2.config import AgentConfig, BackendConfig, ConfigError, GpuInventory, check_machine
    from pipeline.dispatch import serve_engine
    from stagekit.stage import StageContext

    h100 = GpuInventory(8, 81559 / 1024, ("Default",) * 8)
    monkeypatch.setattr(config, "gpu_inventory", lambda: h100)
    member = AgentConfig(name="a", model="tiny", device="cuda", gpu_ids=(0, 1))
    with pytest.raises(ConfigError, match=r"GPUs of 141 GB, but stage update/a on this worker's have 79.6 GB"):
        check_machine([member], cuda_available=True, stage="update/a", gpu_memory_gb=141)
    check_machine([member], cuda_available=True, stage="update/a", gpu_memory_gb=80)
    import torch

    from stagekit.runners import agent_runners

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    spec = EngineSpec(agent="a", model_dir=str(tmp_path), tokenizer_dir=str(tmp_path), version="v0", device="cuda")
    with pytest.raises(ConfigError, match=r"GPUs of 141 GB, but node .* \(engine of a\)'s have 79.6 GB"):
        serve_engine(StageContext(root=str(tmp_path), gpu_memory_gb=141), spec, BackendConfig())
    with pytest.raises(ConfigError, match=r"GPUs of 141 GB, but stage rollout/evaluation on this worker's have 79.6"):
        agent_runners([member], {}, None, batch_size=1, ctx=StageContext(root=str(tmp_path), gpu_memory_gb=141))
