"""Real-model presets compose the paper's whole experiment (docs/presets.md is the spec), and orchestration=pools lets a
CPU machine start a GPU preset while each GPU stage checks its own worker."""

from __future__ import annotations


import pytest
import yaml

from mars2.config import ConfigError
from pipeline.config import compose_run, to_container
from tests.paths import ROOT

PRESETS = ("single_8b", "homogeneous_8b", "heterogeneous_8b", "heterogeneous_14b", "heterogeneous_32b")


def preset_table() -> list[dict[str, str]]:
    """The rows of docs/presets.md's "Every number" table: field, one YAML cell per preset, source."""
    text = (ROOT / "docs" / "presets.md").read_text().split("## Every number", 1)[1]
    lines = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("|---")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=True)) for ln in lines[1:]]


def select(tree, dotted: str):
    for part in dotted.split("."):
        tree = tree[int(part)] if isinstance(tree, list) else tree[part]
    return tree


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch):
    monkeypatch.delenv("MARS2_MODELS", raising=False)


def test_the_table_covers_every_preset_and_names_a_source():
    rows = preset_table()
    assert len(rows) >= 50
    assert set(PRESETS) <= set(rows[0]) and all(r["source"] for r in rows)


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_composes_the_numbers_of_docs_presets_md(preset):
    cfg = to_container(compose_run([f"agents={preset}"], planning=True))
    checked = 0
    for row in preset_table():
        cell = row[preset]
        if cell == "-":
            continue
        assert select(cfg, row["field"]) == yaml.safe_load(cell), (preset, row["field"], row["source"])
        checked += 1
    assert checked >= 50
    # the engine's context holds a prompt plus the longest response
    assert cfg["backend"]["max_model_len"] >= cfg["plan"]["prompt_tokens"] + cfg["search"]["max_new_tokens"]


def test_a_preset_field_stays_overridable():
    cfg = compose_run(["agents=heterogeneous_32b", "search.max_new_tokens=16384", "train.overlong_buffer=1024",
                       "data=toy"], planning=True)
    assert (cfg.search.max_new_tokens, cfg.train.overlong_buffer, cfg.data.source) == (16384, 1024, "toy")
    assert cfg.search.max_nodes == 16  # the rest of the preset stays


def test_pools_mode_lets_a_cpu_machine_start_a_gpu_preset(paper_data):
    data = paper_data
    with pytest.raises(ConfigError, match="does not exist on this machine"):
        compose_run(["agents=heterogeneous_8b", *data])  # local: this machine runs every stage
    one_node = ["plan.node_per_agent=false", "agents.members.0.gpus=4", "agents.members.1.gpus=4"]
    cfg = compose_run(["agents=heterogeneous_8b", "orchestration=pools", *one_node, *data])  # stages check their workers
    assert cfg.orchestration.mode == "pools" and cfg.data.split == "source"


def test_the_flow_entry_refuses_what_the_planner_says_cannot_fit(paper_data):
    from mars2.plan import PlanRefused

    data = paper_data
    with pytest.raises(PlanRefused, match="cannot fit"):
        compose_run(["agents=heterogeneous_32b", "orchestration=pools", "plan.gpu_memory_gb=40", *data])


def test_a_gpu_stage_on_a_worker_without_cuda_says_so(tmp_path, monkeypatch):
    import torch

    from mars2.config import AgentConfig, TrainConfig
    from stagekit.stage import StageContext
    from tasks.update import update_policy

    if torch.cuda.is_available():
        pytest.skip("this worker has CUDA")
    (tmp_path / "Qwen3-8B").mkdir()
    member = AgentConfig(name="qwen3_8b", model=str(tmp_path / "Qwen3-8B"), backend="vllm", device="cuda", gpus=8)
    with pytest.raises(ConfigError, match=r"stage update/qwen3_8b on this worker has none: .*NVIDIA driver"):
        update_policy.fn(StageContext(root=str(tmp_path)), member, TrainConfig(), {}, None, None, None, 0)
    gone = AgentConfig(name="a", model=str(tmp_path / "nope"), device="cuda")
    with pytest.raises(ConfigError, match=r"does not exist on stage update/a on this worker"):
        update_policy.fn(StageContext(root=str(tmp_path)), gone, TrainConfig(), {}, None, None, None, 0)


def test_an_evaluation_is_not_refused_for_an_update_it_does_not_make(paper_data):
    from flows.evaluate import compose_eval
    from mars2.plan import PlanRefused

    one_gpu = ["agents=single_8b", "orchestration=pools", "agents.members.0.gpus=1", *paper_data]
    with pytest.raises(PlanRefused, match="the update needs"):
        compose_run(one_gpu)  # training an 8B agent at 36K tokens on one GPU does not fit
    assert compose_eval(one_gpu).agents.members[0].gpus == 1  # evaluating it on one GPU is allowed


def test_a_bare_cuda_device_gets_an_index_for_set_device(monkeypatch):
    from mars2.train.update import rank_device

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert rank_device("cuda", 1) == "cuda:0" and rank_device("cuda:3", 1) == "cuda:3"
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert rank_device("cuda", 4) == "cuda:2" and rank_device("cpu", 4) == "cpu"


def test_a_gpu_machine_without_cuda_says_whether_its_driver_is_too_old_for_cuda_13(tmp_path):
    """torch 2.13.0 and vllm 0.32.0 from PyPI are built for CUDA 13 (driver >= 580): on an older driver they report no
    GPU at all, so the refusal reads the loaded driver's version and says which case it is."""
    from mars2.config import no_cuda_reason, nvidia_driver

    old, new = tmp_path / "old", tmp_path / "new"
    old.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
                   "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    new.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  Sun Jul 27 "
                   "2025\n")
    assert nvidia_driver(str(old)) == "535.104.05" and nvidia_driver(str(new)) == "580.65.06"
    assert nvidia_driver(str(tmp_path / "absent")) is None
    assert "older than CUDA 13 needs (>= 580)" in no_cuda_reason("535.104.05") and "update the driver" in \
        no_cuda_reason("535.104.05")
    assert "torch sees no device" in no_cuda_reason("580.65.06")
    assert no_cuda_reason(None) == "no NVIDIA driver is loaded"


@pytest.mark.parametrize(("device", "speaks_of_gpus"), [("cpu", False), ("cuda", True)])
def test_a_missing_model_folder_speaks_of_gpus_only_for_an_agent_placed_on_them(device, speaks_of_gpus):
    from mars2.config import AgentConfig, check_machine

    with pytest.raises(ConfigError) as e:
        check_machine([AgentConfig(name="a", model="/nonexistent/model", device=device)], cuda_available=True)
    assert ("GPU" in str(e.value)) == speaks_of_gpus, str(e.value)
    assert "/nonexistent/model" in str(e.value)
