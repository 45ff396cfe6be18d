"""A CPU rehearsal of the GPU path (``agents=rehearsal_cpu``): the paper preset's search, train and eval groups scaled
down, run as a team would run it on a cluster, with every real component a CPU has:

* a Prefect server and process workers on three pools: ``cpu``, and two "nodes" ``gpu`` and ``gpu1``
  (``orchestration.node_pools``; node1's worker has its own ``MARS2_NODE_NAME``; both reached at 127.0.0.1);
* the real vLLM (CPU build) as each agent's persistent engine, llama_vllm's served on node1 and reached over TCP;
* each agent's update on two ranks with ZeRO-3, the optimizer on DeepSpeed's CPU Adam and gradient checkpointing
  (conf/deepspeed/zero3_cpu.yaml), log-probs in 8-token chunks, shorter than the responses;
* the new weights loaded into the running engines for the evaluation after training.

One train cycle runs once for the module (~6 minutes on 2 cores); each test reads a different part of what it left.
Marked ``rehearsal`` (run by .ci/run with the vLLM group); skipped where the vLLM environment is absent.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from mars2.backends.vllm_env import find_python
from pipeline.config import compose_run, load_cfg, resolve

pytestmark = [pytest.mark.rehearsal, pytest.mark.timeout(1800)]
if find_python() is None or not Path(find_python()).exists():
    pytest.skip("no vLLM environment (python -m mars2.backends.vllm_env makes one)", allow_module_level=True)

from tests.flows.test_deploy import (  # noqa: E402,F401 (stack: a fixture)
    NODES, _flow_runs, _logs, _stage_table, _sweep, stack)

REHEARSAL = ["agents=rehearsal_cpu", "orchestration=pools", f"orchestration.node_pools=[{NODES}]",
             "agents.members.1.node=1"]
AGENTS = ("qwen_vllm", "llama_vllm")


@pytest.fixture(scope="module")
def cycle(stack):
    """The rehearsal's train cycle, submitted through the sweep deployment as a team does, and what it left."""
    out, ids = _sweep(stack, *REHEARSAL, timeout=1500)
    assert out.returncode == 0 and ": Completed" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:] + _logs(stack)
    (flow_run_id,) = ids
    with sqlite3.connect(stack["home"] / "mlflow.db") as db:
        (run_id,) = db.execute("select run_uuid from tags where key = 'prefect.flow_run_id' and value = ?",
                               (flow_run_id,)).fetchone()
        metrics = dict(db.execute("select key, value from metrics where run_uuid = ?", (run_id,)).fetchall())
    (starts,) = (stack["home"] / "engines").glob("*/starts")  # this module's stack runs this one flow
    return dict(stack=stack, id=flow_run_id, table=_stage_table(stack, flow_run_id), metrics=metrics,
                engines=starts.parent, stages={r["name"]: r for r in _flow_runs(stack, "stage")})


def test_the_rehearsal_is_the_papers_search_train_and_eval_scaled_down():
    """Every setting of the paper preset's groups that is not a size stays the paper's; the DeepSpeed profile is the
    headline one (zero3_bf16_offload) but for bf16, which CPU ranks do not run."""
    run = resolve(load_cfg(["agents=rehearsal_cpu"]), cuda_available=False)
    paper = resolve(load_cfg(["agents=tiny_vllm_cpu", "search=paper", "train=paper", "eval=paper",
                              "backend.max_model_len=40000"]), cuda_available=False)
    sizes = {"search": {"max_nodes", "max_new_tokens"},
             "train": {"cycles", "micro_batch_tokens", "train_batch", "step_batch", "overlong_buffer",
                       "logprob_chunk_tokens", "filter_flat_trees"},
             "eval": {"every", "max_new_tokens", "max_nodes"}}
    for group, scaled in sizes.items():
        ours, theirs = vars(getattr(run, group)), vars(getattr(paper, group))
        assert {k: v for k, v in ours.items() if k not in scaled} == {k: v for k, v in theirs.items()
                                                                     if k not in scaled}, group
    assert run.train.logprob_chunk_tokens < run.search.max_new_tokens  # a response spans several chunks
    offload = dict(run.deepspeed_profiles["zero3_bf16_offload"])
    cpu = dict(run.deepspeed_profiles["zero3_cpu"])
    assert cpu.pop("bf16") == {"enabled": False} and offload.pop("bf16") == {"enabled": True}
    assert cpu["zero_optimization"].pop("offload_optimizer")["device"] == "cpu"
    assert offload["zero_optimization"].pop("offload_optimizer")["device"] == "cpu"
    assert cpu == offload
    placed = compose_run(REHEARSAL)
    assert [(m.name, m.deepspeed, m.processes, m.node, m.backend) for m in placed.agents.members] == [
        ("qwen_vllm", "zero3_cpu", 2, None, "vllm"), ("llama_vllm", "zero3_cpu", 2, 1, "vllm")]


def test_each_agent_trains_on_two_zero3_ranks_on_its_nodes_pool_with_uneven_log_prob_chunks(cycle):
    """Both updates ran on two ranks under ZeRO-3 (one optimizer shard per rank in the checkpoint), each on its
    node's pool, and the ranks' responses needed different numbers of log-prob chunks, so the short rank called the
    partitioned head on empty chunks to keep the gathers in step (the hang of #49 item 1 had it not)."""
    m, table, stages = cycle["metrics"], cycle["table"], cycle["stages"]
    assert (table["status"] == "ran").all(), table
    for agent, pool in zip(AGENTS, ("gpu", "gpu1"), strict=True):
        assert m[f"update/{agent}/processes"] == 2 and m[f"update/{agent}/optimizer_steps"] >= 1
        assert stages[f"update-{agent}-c0"]["work_pool_name"] == pool
        manifest = json.loads((Path(table.loc[f"update/{agent}", "dir"]) / "MANIFEST.json").read_text())
        shards = sorted(f for f in manifest["files"] if f.endswith("_optim_states.pt"))
        assert shards == [f"ds/ckpt/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    assert max(m[f"update/{agent}/logprob_empty_chunks"] for agent in AGENTS) > 0


def test_the_engines_serve_both_nodes_and_take_the_updates_weights_in_place(cycle):
    """One vLLM engine per owner for the whole run, llama_vllm's a service on node1 reached over TCP; after the
    update each loads its agent's new model folder in place (no restart) before the evaluation."""
    engines, table, m = cycle["engines"], cycle["table"], cycle["metrics"]
    starts = sorted(line.split()[:2] for line in (engines / "starts").read_text().splitlines())
    assert [agent for agent, _ in starts] == sorted(AGENTS) and m["engine_starts"] == 2
    assert dict(starts)["llama_vllm"] == "node1"
    record = json.loads((engines / "node1" / "llama_vllm.json").read_text())
    assert record["family"] == "AF_INET" and record["address"][0] == "127.0.0.1"
    for agent in AGENTS:
        (where,) = [p for p in engines.glob(f"*/{agent}.json")]
        log = Path(json.loads(where.read_text())["log"]).read_text()
        new = str(Path(table.loc[f"update/{agent}", "dir"]) / "model")
        assert f"loaded {new} in place" in log, log[-2000:]
    assert cycle["stages"]["evaluation-c0"]["work_pool_name"] == "gpu"
    assert (engines / "STOP").exists()
