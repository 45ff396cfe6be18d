"""Resource planner (docs/plan.md): parameter counts on the meta device, DeepSpeed's ZeRO estimators, vLLM KV-cache
arithmetic, placement, refusal, and the `flows/plan.py` CLI."""

import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from mars2.config import ConfigError
from mars2.plan import PUBLIC_PARAMS, PlanRefused, count_parameters, load_model_config, plan, require_fit
from mars2.plan.memory import GB, kv_bytes_per_token, vllm_kv_budget, zero_model_states
from mars2.plan.models import ModelConfigNotFound, shipped_models, tiny_config_dict
from pipeline.config import CONF_DIR, load_cfg, resolve
from tests.paths import ROOT

QWEN3_32B = 32_762_123_264
QWEN3_32B_LARGEST = 151_936 * 5120  # embed_tokens (lm_head is the same size, untied)


def _preset_models() -> list[str]:
    names = set()
    for path in (CONF_DIR / "agents").glob("*.yaml"):
        node = OmegaConf.load(path)  # real-model presets are whole experiments (package _global_): agents.members
        for m in (node.agents if "agents" in node else node).members:
            model = OmegaConf.to_container(m).get("model", "tiny")  # a member without one has the schema's
            if model != "tiny":
                names.add(model.rsplit("/", 1)[-1])
    return sorted(names)


PRESET_MODELS = _preset_models()


@pytest.fixture
def no_models(monkeypatch, tmp_path):
    """MARS2_MODELS points at an empty folder: the planner must fall back to the shipped configs."""
    monkeypatch.setenv("MARS2_MODELS", str(tmp_path / "no-models-here"))


def _plan(*overrides: str):
    return plan(resolve(load_cfg(list(overrides)), planning=True))


def test_every_real_model_of_the_presets_is_shipped_with_a_public_size():
    assert {"Qwen3-8B", "Qwen3-14B", "Qwen3-32B", "AReaL-boba-2-8B", "AReaL-boba-2-14B",
            "AReaL-boba-2-32B"} <= set(PRESET_MODELS)
    assert set(PRESET_MODELS) <= set(shipped_models()) and set(PRESET_MODELS) <= set(PUBLIC_PARAMS)


@pytest.mark.parametrize("name", PRESET_MODELS)
def test_parameter_counts_match_public_sizes_within_2_percent(name, tmp_path):
    config, source = load_model_config(str(tmp_path / name))  # no such folder: the shipped config.json
    assert source == f"shipped:{name}.json"
    total, largest = count_parameters(config)
    assert abs(total - PUBLIC_PARAMS[name]) / PUBLIC_PARAMS[name] < 0.02, (name, total)
    assert largest == config["vocab_size"] * config["hidden_size"]  # the embedding is the largest module


def test_qwen3_32b_exact_count_from_the_architecture():
    config, _ = load_model_config("/nowhere/Qwen3-32B")
    h, i, layers, v, hd = 5120, 25600, 64, 151_936, 128
    per_layer = (h * 64 * hd + 2 * h * 8 * hd + 64 * hd * h  # q, k, v, o projections (no bias)
                 + 3 * h * i  # gate, up, down
                 + 2 * h + 2 * hd)  # two RMSNorms + q_norm / k_norm
    assert count_parameters(config) == (2 * v * h + layers * per_layer + h, QWEN3_32B_LARGEST) == (QWEN3_32B,
                                                                                                  QWEN3_32B_LARGEST)


def test_tied_embeddings_are_counted_once():
    cfg = {"model_type": "qwen2", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}
    tied, _ = count_parameters({**cfg, "tie_word_embeddings": True})
    untied, _ = count_parameters({**cfg, "tie_word_embeddings": False})
    assert untied - tied == 512 * 64


def test_a_local_config_json_takes_precedence_over_the_shipped_one(tmp_path):
    folder = tmp_path / "Qwen3-32B"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2", "vocab_size": 100, "hidden_size": 32, '
                                        '"num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64}')
    config, source = load_model_config(str(folder))
    assert source == str(folder / "config.json") and config["hidden_size"] == 32


def test_an_unknown_model_without_a_folder_says_what_to_do(tmp_path):
    with pytest.raises(ModelConfigNotFound, match="shipped configs.*config.json"):
        load_model_config(str(tmp_path / "Mystery-70B"))


def test_kv_cache_arithmetic_against_hand_computed_values():
    # Qwen3-32B in bf16: 2 (K, V) x 64 layers x 8 KV heads x 128 x 2 bytes = 256 KiB per token
    assert kv_bytes_per_token(64, 8, 128, 2) == 262_144
    assert kv_bytes_per_token(64, 8, 128, 2, tp=8) == 32_768  # one KV head per GPU
    assert kv_bytes_per_token(64, 8, 128, 2, tp=16) == 32_768  # vLLM replicates KV heads beyond tp = 8
    kv = vllm_kv_budget(weights_bytes=QWEN3_32B * 2, gpu_bytes=141 * GB, utilization=0.85, tp=8, layers=64,
                        kv_heads=8, head_dim=128, dtype_bytes=2, seq_len=2048 + 96, concurrent=32)
    # 0.85 x 141 x 2**30 = 128,687,957,606.4 bytes; weights / 8 = 8,190,530,816 → 120,497,426,790 bytes per GPU
    assert kv.per_gpu_bytes == 120_497_426_790
    assert kv.tokens == 120_497_426_790 // 32_768 == 3_677_289
    assert kv.max_seqs == 3_677_289 // 2144 == 1715
    assert kv.needed_bytes_per_gpu == 32 * 2144 * 32_768


def test_deepspeed_estimators_against_the_hand_formulas():
    p, largest, n = QWEN3_32B, QWEN3_32B_LARGEST, 8
    z3 = zero_model_states(3, p, largest, gpus_per_node=n)
    assert z3.gpu_bytes == 4 * largest + int(18 * p / n)  # fp32 largest layer + 18 B/param sharded
    assert "estimate_zero3_model_states_mem_needs" in z3.source
    z3_off = zero_model_states(3, p, largest, gpus_per_node=n, offload_optimizer=True)
    assert z3_off.gpu_bytes == 4 * largest + int(2 * p / n)  # only the bf16 parameters stay on the GPU
    assert z3_off.cpu_bytes == int(p * 16 * 1.5)  # per node, zero_init, additional_buffer_factor 1.5
    z2 = zero_model_states(2, p, largest, gpus_per_node=n)
    assert z2.gpu_bytes == 2 * p + int(18 * p / n)
    assert zero_model_states(0, p, largest, gpus_per_node=n).gpu_bytes == 16 * p  # ZeRO-0: plain formula
    two_nodes = zero_model_states(3, p, largest, gpus_per_node=8, nodes=2)
    assert two_nodes.gpu_bytes == 4 * largest + int(18 * p / 16)


POOLS = ("orchestration=pools", "orchestration.node_pools=[gpu-node0,gpu-node1]")


def test_heterogeneous_32b_plan_fits_the_papers_cluster_one_node_per_agent(no_models):
    cp = require_fit(_plan("agents=heterogeneous_32b", *POOLS))
    assert [a.shape.name for a in cp.agents] == ["Qwen3-32B", "AReaL-boba-2-32B"]
    assert all(a.shape.params == QWEN3_32B for a in cp.agents)
    assert cp.chosen.endswith(": as the preset asks")
    for node, a in enumerate(cp.agents):
        assert a.profile.stage == 3 and a.profile.offload_optimizer and a.gpus == 8
        assert [str(s) for s in a.update_spans] == [f"node{node}:GPU0-7"] == [str(s) for s in a.rollout.spans]
        assert a.rollout.replicas == 8 // a.rollout.tp and a.rollout.kv.needed_seqs == 512 // a.rollout.replicas
        assert a.update.states.gpu_bytes == 4 * QWEN3_32B_LARGEST + int(2 * QWEN3_32B / 8)
        assert a.update.reference_bytes == QWEN3_32B * 2 // 8
        assert a.update.gpu_bytes < 141 * GB and a.gpus_min is not None and a.gpus_min <= 8
    assert cp.used_gpus == 16 and cp.total_gpus == 24


def _held(kv, replicas: int, demand: int) -> int:
    """Requests an agent's engines hold at once (none where an engine cannot start)."""
    return min(replicas * kv.max_seqs, demand) if kv.per_gpu_bytes > 0 and kv.tokens >= 40000 else 0


@pytest.mark.parametrize("gpu", [("H200", 141), ("H100", 80)])
def test_the_plan_picks_the_smallest_tensor_parallel_size_whose_engines_hold_the_most_requests(gpu, no_models):
    """On 8 GPUs each candidate TP's engines are sized by the same KV arithmetic; the plan's TP holds the most of the
    rollout's 512 in-flight requests at once, and no smaller TP holds as many. TP 1 cannot even start a 32B engine
    on an 80 GB GPU (61 GB of weights under 0.75 x 80 GB)."""
    from mars2.plan.planner import rollout_plan

    over = ("agents=heterogeneous_32b", *POOLS, f"plan.gpu_name={gpu[0]}", f"plan.gpu_memory_gb={gpu[1]}")
    run = resolve(load_cfg(list(over)), planning=True)
    a = require_fit(plan(run)).agents[0]
    member = run.agents.members[0]
    held = {t: _held(r.kv, r.replicas, 512) for t in (1, 2, 4, 8)
            for r in [rollout_plan(a.shape, member, run, n=8, dtype_bytes=2, seq_len=a.rollout.kv.seq_len, tp=t)]}
    assert held[a.rollout.tp] == max(held.values()) > 0
    assert all(held[t] < held[a.rollout.tp] for t in held if t < a.rollout.tp)
    if gpu[0] == "H100":
        assert held[1] == 0 and a.rollout.tp >= 2
    fixed = _plan(*over, "backend.tensor_parallel_size=2").agents[0].rollout
    assert (fixed.tp, fixed.replicas) == (2, 4)  # a size the config gives is kept


def test_a_given_tensor_parallel_or_engine_count_never_plans_more_gpus_than_the_agent_has(no_models):
    """A fixed TP 8 does not fit the halved 4 + 4 layout (the engine would need 8 GPUs of 4), so one node refuses and
    two node pools keep 8 + 8; a fixed engine count bounds the TP the plan may pick (2 engines of TP 4 on 8 GPUs)."""
    one = _plan("agents=heterogeneous_32b", "backend.tensor_parallel_size=8")
    assert not one.fits and "1 vLLM engine(s) of tensor parallelism 8 need 8 GPUs but it has 4" in one.refusal()
    two = require_fit(_plan("agents=heterogeneous_32b", "backend.tensor_parallel_size=8", *POOLS))
    assert [(a.gpus, a.rollout.tp, a.rollout.replicas) for a in two.agents] == [(8, 8, 1)] * 2
    dp = require_fit(_plan("agents=heterogeneous_32b", *POOLS, "plan.gpu_memory_gb=80", "backend.data_parallel_size=2"))
    assert [(a.rollout.tp, a.rollout.replicas) for a in dp.agents] == [(4, 2)] * 2


@pytest.mark.parametrize("cluster", [
    ("plan.nodes=1",),  # one node of 8 H200
    ("plan.nodes=2", "plan.gpu_name=H100", "plan.gpu_memory_gb=80"),  # two nodes of 8 H100
    (),  # the default cluster: 3 nodes of 8 H200, no work pool per node
])
def test_the_headline_preset_fits_one_node_of_the_cluster_it_is_given(cluster, no_models):
    """Without a work pool per node the run reaches one node: the preset's 8 + 8 GPUs on nodes of their own do not fit
    it, so the plan takes the largest halving that does, 4 + 4 packed on node0, and says so in one line."""
    cp = require_fit(_plan("agents=heterogeneous_32b", *cluster))
    assert [(a.gpus, [str(s) for s in a.update_spans]) for a in cp.agents] == [(4, ["node0:GPU0-3"]),
                                                                              (4, ["node0:GPU4-7"])]
    assert all(a.rollout.replicas * a.rollout.tp == 4 for a in cp.agents)
    assert "the preset's 8 + 8 GPUs on nodes of their own do not fit 1 node(s)" in cp.chosen
    assert ("a run reaches one node per work pool" in cp.chosen) == (cluster != ("plan.nodes=1",)), cp.chosen


@pytest.mark.parametrize("preset", ["single_8b", "homogeneous_8b", "heterogeneous_8b", "heterogeneous_14b"])
def test_8b_and_14b_presets_plan_with_public_sizes(preset, no_models):
    cp = require_fit(_plan(f"agents={preset}"))
    for a in cp.agents:
        assert abs(a.shape.params - PUBLIC_PARAMS[a.shape.name]) / PUBLIC_PARAMS[a.shape.name] < 0.02
        assert a.device == "cuda" and a.update_spans


def test_homogeneous_roles_share_one_engine(no_models):
    cp = _plan("agents=homogeneous_8b")
    assert [(a.name, a.roles) for a in cp.agents] == [("solver", ["solver", "debugger"])]


def test_smollm2_cpu_plans_from_the_shipped_config():
    cp = require_fit(_plan("agents=smollm2_cpu"))
    assert [(a.shape.name, a.device) for a in cp.agents] == [("smollm2-135m-instruct", "cpu"), ("tiny:qwen2", "cpu")]
    assert cp.agents[0].shape.params == 134_515_008 and cp.agents[0].shape.tied_embeddings


def test_tiny_cpu_plans_on_cpu():
    cp = require_fit(_plan("agents=tiny_cpu"))
    assert [a.device for a in cp.agents] == ["cpu", "cpu"] and cp.used_gpus == 0
    run = resolve(load_cfg(["agents=tiny_cpu"]), cuda_available=False)
    for a, m in zip(cp.agents, run.agents.members, strict=True):
        assert a.shape.params == count_parameters(tiny_config_dict(m.tiny))[0]


def test_zero0_on_one_gpu_for_32b_is_refused_with_the_reason(no_models):
    cp = _plan("agents=heterogeneous_32b", *POOLS, "agents.members.0.gpus=1", "agents.members.0.deepspeed=zero0_cpu")
    assert not cp.fits and cp.agents[1].fits
    with pytest.raises(PlanRefused, match=r"agent 'qwen3_32b': the update needs .* per GPU .*ZeRO-0.*fits on no "
                                          r"number of GPUs"):
        require_fit(cp)


def test_not_enough_gpus_is_refused(no_models):
    """Two agents and one GPU: no halving of the preset's layout fits; the refusal keeps the preset's reasons."""
    cp = _plan("agents=heterogeneous_32b", "plan.nodes=1", "plan.gpus_per_node=1")
    assert not cp.fits and not cp.chosen and "no room" in cp.refusal()
    far = _plan("agents=heterogeneous_32b", "plan.gpus_per_node=1")  # 3 nodes, but the run reaches one
    assert "the run reaches 1 node(s) of 1 H200 (of the cluster's 3" in far.refusal()


def test_node_per_agent_gives_each_agent_its_own_node(no_models):
    two = ["agents.members.0.gpus=2", "agents.members.1.gpus=2"]
    packed = _plan("agents=heterogeneous_8b", "plan.node_per_agent=false", *two)
    assert [str(a.update_spans[0]) for a in packed.agents] == ["node0:GPU0-1", "node0:GPU2-3"]
    own = _plan("agents=heterogeneous_8b", *two, *POOLS)  # the paper's layout, the preset's default
    assert [str(a.update_spans[0]) for a in own.agents] == ["node0:GPU0-1", "node1:GPU0-1"]


def test_plan_config_is_validated():
    with pytest.raises(ConfigError, match="plan.gpus_per_node"):
        resolve(load_cfg(["plan.nodes=0"]), cuda_available=False)


def test_planning_resolve_skips_model_folders_and_gpu_checks_only_when_asked(no_models):
    cfg = load_cfg(["agents=heterogeneous_32b"])
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(cfg, cuda_available=False)
    assert resolve(cfg, cuda_available=False, planning=True).agents.preset == "heterogeneous_32b"


# Runs flows/plan.py as __main__ and reports, at exit, which of these packages the process had loaded.
_REPORT_MODULES = ("import atexit, runpy, sys\n"
                   "atexit.register(lambda: print('LOADED', sorted({k.split('.')[0] for k in sys.modules"
                   " if sys.modules[k]} & {'prefect', 'mlflow', 'deepspeed', 'torch'}), file=sys.stderr))\n"
                   "sys.argv = ['flows/plan.py', *sys.argv[1:]]\n"
                   "runpy.run_path('flows/plan.py', run_name='__main__')\n")


def _cli(*args, tmp_path):
    env = {**os.environ, "MARS2_HOME": str(tmp_path / "home"), "MARS2_MODELS": str(tmp_path / "no-models")}
    return subprocess.run([sys.executable, "-c", _REPORT_MODULES, *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def test_cli_prints_the_32b_plan_without_prefect_or_mlflow(tmp_path):
    """The headline command exits 0 on the default cluster, with the layout it chose in one line; with a work pool
    per node it keeps the paper's layout, one node per agent."""
    out = _cli("agents=heterogeneous_32b", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for needle in ("Qwen3-32B", "AReaL-boba-2-32B", "32.76 B (32,762,123,264)", "public 32.8 B", "ZeRO-3+opt→cpu",
                   "node0:GPU0-3", "node0:GPU4-7", "plan: fits"):
        assert needle in out.stdout, needle
    chosen = " ".join(out.stdout.split("chosen: ")[1].split("plan: fits")[0].split())
    assert chosen.startswith("qwen3_32b 4 GPU(s) node0:GPU0-3") and "do not fit 1 node(s) of 8 H200" in chosen
    assert "LOADED ['deepspeed', 'torch']" in out.stderr  # DeepSpeed's estimators ran; Prefect and MLflow never loaded
    out = _cli("agents=heterogeneous_32b", *POOLS, tmp_path=tmp_path)
    assert out.returncode == 0 and "node1:GPU0-7" in out.stdout and "as the preset asks" in out.stdout, out.stderr


def test_cli_refuses_a_cluster_that_cannot_fit(tmp_path):
    out = _cli("agents=heterogeneous_32b", "plan.gpu_memory_gb=16", tmp_path=tmp_path)
    assert out.returncode == 1
    message = [ln for ln in out.stderr.splitlines() if ln.startswith("mars2: plan refused")]
    assert len(message) == 1 and "cannot fit" in message[0] and "a GPU has 16 GB" in message[0]
    assert "DOES NOT FIT" in out.stdout


def test_cli_plans_an_evaluation_without_its_update(tmp_path):
    """What flows/evaluate.py runs (--config-name evaluate) has no update to fit: one node of 80 GB GPUs that refuses
    training heterogeneous_14b takes its evaluation on 4 + 4 GPUs, and says no update is planned."""
    one_node = ("agents=heterogeneous_14b", "plan.gpu_memory_gb=80", "plan.nodes=1")
    assert _cli(*one_node, tmp_path=tmp_path).returncode == 1
    out = _cli("--config-name", "evaluate", *one_node, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "node0:GPU4-7" in out.stdout and "no update is planned" in out.stdout and "plan: fits" in out.stdout


def test_the_plan_is_the_update_the_engine_builds(no_models):
    """ZeRO-3 under zero.Init, the reference scored first and freed, the vocabulary projection in chunks: a 32B agent's
    update at the paper's 36K-token sequences fits an 80 GB GPU (its rollout needs TP 2 there)."""
    cp = _plan("agents=heterogeneous_32b", *POOLS, "plan.gpu_memory_gb=80", "backend.tensor_parallel_size=2")
    a = cp.agents[0]
    assert cp.fits and a.rollout.tp == 2 and a.rollout.replicas == 4
    u = a.update
    assert u.gpu_bytes == max(u.training_bytes, u.reference_phase_bytes) < 80 * GB
    assert u.training_bytes == u.states.gpu_bytes + u.activation_bytes + u.reserved_bytes  # no reference beside it
    # the chunked projection: a 4x longer chunk costs 4x the logits block, not the sequence x vocab tensor
    chunked = _plan("agents=heterogeneous_32b", *POOLS, "plan.gpu_memory_gb=80", "backend.tensor_parallel_size=2",
                    "train.logprob_chunk_tokens=4096").agents[0].update.activation_bytes
    assert 0 < chunked - u.activation_bytes <= 1.25 * 3 * 1024 * 151_936 * 20 + 1
    tp1 = _plan("agents=heterogeneous_32b", *POOLS, "plan.gpu_memory_gb=80", "backend.tensor_parallel_size=1")
    assert not tp1.fits and "leave no KV cache" in tp1.refusal()  # TP 1: 61 GB of weights per GPU


def test_transformers_on_a_gpu_is_sized_with_the_engines_spare_kv_columns(no_models):
    """The transformers engine's KV buffers keep a quarter of their width spare (SlackLayer): the planner counts
    them, so a batch it passes fits the buffers the engine allocates."""
    from mars2.backends.base import cache_columns

    cp = _plan("agents=single_8b", "agents.members.0.backend=transformers")
    roll = cp.agents[0].rollout
    assert roll.backend == "transformers" and roll.kv is not None
    kv, per_token = roll.kv, kv_bytes_per_token(36, 8, 128, 2)  # Qwen3-8B, bf16
    assert kv.bytes_per_token_gpu == per_token == 147_456
    assert cache_columns(kv.seq_len) == kv.seq_len + kv.seq_len // 4 and cache_columns(40) == 56
    assert kv.needed_bytes_per_gpu == kv.needed_seqs * cache_columns(kv.seq_len) * per_token
    assert kv.max_seqs == kv.tokens // cache_columns(kv.seq_len) < kv.tokens // kv.seq_len


def test_zero3_on_one_gpu_names_the_zero2_profile_that_fits(no_models):
    one = ["agents=heterogeneous_8b", "agents.members.0.model=Qwen3-1.7B", "agents.members.0.gpus=1",
           "agents.members.1.gpus=1"]

    def hints(*extra):
        return [[w for w in a.warnings if "ZeRO-3 on one GPU" in w] for a in _plan(*one, *extra).agents]

    small, large = hints()
    assert len(small) == 1 and small[0].endswith("agents.members.0.deepspeed=zero2_bf16")
    assert large == []  # an 8B model's ZeRO-2 update does not fit one GPU (and its ZeRO-3 one does not either)
    assert hints("agents.members.0.gpus=2")[0] == []  # two ranks: ZeRO-3 partitions across them
    assert hints("agents.members.0.deepspeed=zero2_bf16")[0] == []
    assert hints("agents.members.0.deepspeed=zero3_bf16_offload")[0] == []
