"""Config composition and the one-paragraph errors of validation."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mars2.config import ConfigError
from pipeline.config import CONF_DIR, ROSTER_PRESETS, load_cfg, resolve
from tests.paths import ROOT

PRESETS = sorted([p.stem for p in (CONF_DIR / "agents").glob("*.yaml")] + ROSTER_PRESETS)
CPU_PRESETS = [p for p in PRESETS if p in ROSTER_PRESETS or p.startswith("tiny_cpu") or p.endswith("_cpu")]
GPU_PRESETS = [p for p in PRESETS if p not in CPU_PRESETS]


def test_presets_named_by_the_issue_exist():
    assert {"tiny_cpu", "single_8b", "homogeneous_8b", "heterogeneous_8b", "heterogeneous_14b",
            "heterogeneous_32b", "tiny_cpu_warm", "tiny_cpu_warm_homogeneous", "tiny_cpu_warm_single"} <= set(PRESETS)


def test_warm_presets_share_one_definition_of_each_agent():
    """The roster defines qwen_tiny once; the three warm presets carry the same block, and an override of one
    preset's member reaches that preset only."""
    members = {p: load_cfg([f"agents={p}"]).agents.members for p in ROSTER_PRESETS}
    qwen = {p: m[0] for p, m in members.items() if m[0].name == "qwen_tiny"}
    assert len(qwen) == 3 and len({str(m) for m in qwen.values()}) == 1 and qwen["tiny_cpu_warm"].bootstrap.steps > 0
    assert str(members["tiny_cpu_warm_single_llama"][0]) == str(members["tiny_cpu_warm"][1])  # llama_tiny alone
    warm = load_cfg(["agents=tiny_cpu_warm"])
    assert warm.data.n_problems == 256 and warm.search.temperature == 0.7  # the preset's benchmark and sampling ...
    assert load_cfg(["agents=tiny_cpu_warm", "data=toy"]).data.n_problems == 64  # ... and the command line wins
    assert load_cfg(["agents=tiny_cpu_warm", "search.temperature=1.0"]).search.temperature == 1.0
    lr = load_cfg(["agents=tiny_cpu_warm_single", "agents.members.0.optimizer.lr=0.5"]).agents.members[0].optimizer.lr
    assert lr == 0.5 and load_cfg(["agents=tiny_cpu_warm_single"]).agents.members[0].optimizer.lr != 0.5


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes(preset):
    cfg = load_cfg([f"agents={preset}"])
    assert cfg.agents.preset == preset
    assert cfg.agents.members and all(m.model for m in cfg.agents.members)


@pytest.mark.parametrize("preset", ["tiny_cpu_single", "tiny_cpu_homogeneous"])
def test_tiny_paradigm_presets_validate(preset):
    run = resolve(load_cfg([f"agents={preset}"]), cuda_available=False)
    owners = {m.shares_weights_with or m.name for m in run.agents.members}
    assert len(owners) == 1 and run.agents.paradigm in ("single", "homogeneous")


def test_default_team_is_warm_started_with_two_architectures():
    run = resolve(load_cfg([]), cuda_available=False)
    archs = {m.tiny.arch for m in run.agents.members}
    assert archs == {"qwen2", "llama"} and run.agents.paradigm == "heterogeneous"
    assert run.agents.preset == "tiny_cpu_warm" and all(m.bootstrap.steps > 0 for m in run.agents.members)
    assert run.data.n_problems == 256
    random_team = resolve(load_cfg(["agents=tiny_cpu"]), cuda_available=False)  # what the flow tests name
    assert all(m.bootstrap.steps == 0 for m in random_team.agents.members) and random_team.data.n_problems == 64


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_presets_validate_when_models_and_gpus_exist(preset, tmp_path, monkeypatch, paper_data):
    monkeypatch.setenv("MARS2_MODELS", str(tmp_path))
    cfg = load_cfg([f"agents={preset}", *paper_data])
    for m in cfg.agents.members:
        Path(m.model).mkdir(parents=True, exist_ok=True)
    run = resolve(cfg, cuda_available=True)
    assert all(m.device.startswith("cuda") for m in run.agents.members)
    with pytest.raises(ConfigError, match="needs GPUs"):
        resolve(cfg, cuda_available=False)


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_presets_fail_fast_without_model_folders(preset, monkeypatch, tmp_path):
    monkeypatch.setenv("MARS2_MODELS", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="does not exist.*GPUs"):
        resolve(load_cfg([f"agents={preset}"]), cuda_available=False)


@pytest.mark.parametrize(("overrides", "message"), [
    (["agents=nope"], "agents=nope: no such option in config group 'agents'. Options: heterogeneous_14b"),
    (["agents=heterogenous_32b"], "did you mean agents=heterogeneous_32b\\?"),
    (["search.max_node=4"], "no key 'max_node' in search; did you mean search.max_nodes\\? Keys of search: strategy"),
    (["agents.members.1.optimizer.lrr=1e-5"],  # a key inside a list element: the element's schema
     "no key 'lrr' in agents.members.1.optimizer; did you mean agents.members.1.optimizer.lr\\? Keys of "
     "agents.members.1.optimizer: lr, min_lr"),
    (["train.cycles=-1"], "train.cycles=-1"),
    (["train.cycles=abc"], "could not be converted to Integer"),
    (["+nonsense=1"], "unknown config key"),
    (["+trian.cycles=1"], "Did you mean 'train' for 'trian'"),
    (["agents.members.1.shares_weights_with=qwen_tiny"], "heterogeneous preset needs"),
    (["agents.members.0.deepspeed=zero9"], "Profiles in conf/deepspeed/"),
    (["debug.fail_at=nowhere"], "debug.fail_at='nowhere' is unknown"),
    (["search.n_samples=0"], "n_samples"),
    (["eval.split=test"], "eval.split='test' is unknown"),
    (["agents.members.0.update_procs=0"], "update_procs=0 must be >= 1"),
    (["agents.members.0.bootstrap.own_failures=4"], "own_failures and own_failures_steps both 0 or both >= 1"),
    (["gate.n_fresh=0"], "gate.n_fresh"),
    (["gate.n_pool=0"], "gate.n_pool"),
    (["agents.members.0.bootstrap.wrong_readings=true"], "bootstrap.wrong_readings=true needs data=known_answer"),
    (["gate.split=test"], "gate.split='test' is unknown"),
    (["search.top_p=0"], "search.top_p=0.0 is out of range"),
])
def test_bad_overrides_give_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        resolve(load_cfg(overrides), cuda_available=False)
    assert "\n" not in str(err.value).strip() or len(str(err.value)) < 600


def test_a_vllm_agent_on_the_cpu_needs_the_vllm_environment(monkeypatch):
    monkeypatch.setenv("MARS2_VLLM_PYTHON", "/nonexistent/bin/python")
    with pytest.raises(ConfigError, match="vllm backend on the CPU needs vLLM's CPU build.*mars2.backends.vllm_env"):
        resolve(load_cfg(["agents.members.0.backend=vllm"]), cuda_available=False)
    monkeypatch.setenv("MARS2_VLLM_PYTHON", sys.executable)  # an interpreter exists: the agent may run there
    resolve(load_cfg(["agents.members.0.backend=vllm"]), cuda_available=False)


def _cli(*args, env_extra=None):
    env = {**os.environ, "MARS2_HOME": "/nonexistent-do-not-create", **(env_extra or {})}
    return subprocess.run([sys.executable, "flows/train_cycle.py", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)


def test_cli_cfg_job_prints_32b_config_without_touching_a_gpu():
    out = _cli("agents=heterogeneous_32b", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "preset: heterogeneous_32b" in out.stdout and "Qwen3-32B" in out.stdout
    assert not Path("/nonexistent-do-not-create").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["agents=heterogeneous_32b"], "model path '/models/Qwen3-32B' does not exist"),
    (["agents=nope"], "no such option in config group 'agents'"),
    (["agents=heterogenous_32b"], "did you mean agents=heterogeneous_32b?"),
    (["search.max_node=4"], "did you mean search.max_nodes?"),
    (["agents.members.0.optimzer.lr=1e-5"], "did you mean agents.members.0.optimizer?"),
    (["train.cycles=-1"], "train.cycles=-1"),
])
def test_cli_bad_config_fails_fast_with_one_paragraph(args, needle):
    out = _cli(*args)
    assert out.returncode != 0
    assert needle in out.stderr
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout
    assert "search path" not in out.stderr.lower() and "HYDRA_FULL_ERROR" not in out.stderr
    assert not Path("/nonexistent-do-not-create").exists()


@pytest.mark.parametrize(("flow", "bad", "says"), [
    ("train_cycle", "train.cycles=-1", "config error: train."), ("evaluate", "eval.n_samples=0", "config error: eval."),
    ("gate", "gate.max_problems=-1", "config error: gate."),
    ("evaluate", "+eval.checkpoints.qwen_tiny=/no/such/folder", "checkpoint error: checkpoint of 'qwen_tiny' not found"),
    ("gate", "+eval.checkpoints.nobody=/tmp", "checkpoint error: eval.checkpoints names ['nobody']")])
def test_a_bad_override_fails_before_prefect_mlflow_or_torch_is_imported(flow, bad, says):
    """The command line checks the config first, and the checkpoint folders it names: a mistyped value costs a second,
    not the stack's imports."""
    out = subprocess.run([sys.executable, "-X", "importtime", f"flows/{flow}.py", bad], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "MARS2_HOME": "/nonexistent-do-not-create"}, timeout=120)
    assert out.returncode == 1 and f"mars2: {says}" in out.stderr, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert "hydra" in imported and not imported & {"prefect", "mlflow", "torch", "transformers"}


