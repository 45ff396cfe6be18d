"""Weights a stage hands on: complete model folders that load alone, and pruned optimizer states."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from mars2.config import AgentConfig, DataConfig, TinyModelConfig, TrainConfig
from mars2.train.checkpoints import (
    PRUNED,
    OptimizerStateMissing,
    complete_model_folder,
    missing_model_files,
    prune_optimizer_states,
    require_optimizer_state,
)
from stagekit.stage import StageContext, StageRecord

OWNER = "qwen_tiny"


def _loads_alone(folder: str | Path) -> None:
    """What the next rollout does with a model folder: model, tokenizer and chat template from it alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    assert missing_model_files(folder) == []
    AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert GenerationConfig.from_pretrained(folder, local_files_only=True).eos_token_id == tok.eos_token_id


def _run_task(module, task, monkeypatch, **params):
    """A stage task's body as Prefect runs it, without a Prefect server."""
    monkeypatch.setattr(module, "current_parameters", lambda: params)
    return task.fn(**params)


def test_complete_model_folder_copies_tokenizer_files_verbatim_and_derives_a_generation_config(
        tmp_path, tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    tok_dir = tmp_path / "tokenizer"
    tiny_tokenizer.save_pretrained(tok_dir)
    model = tmp_path / "model"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(model)
    (model / "generation_config.json").unlink()
    assert "tokenizer_config.json" in missing_model_files(model)
    complete_model_folder(model, tok_dir)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (model / f).read_bytes() == (tok_dir / f).read_bytes()
    _loads_alone(model)
    with pytest.raises(ValueError, match="no tokenizer files"):
        complete_model_folder(model, tmp_path / "empty")


def test_older_optimizer_states_are_pruned_and_a_pruned_one_is_a_clear_error(tmp_path):
    folders = []
    for c in range(3):
        (tmp_path / f"u{c}" / "ds").mkdir(parents=True)
        (tmp_path / f"u{c}" / "model").mkdir()
        folders.append(str(tmp_path / f"u{c}" / "ds"))
    history = [None, folders[0], folders[1], folders[1], folders[2]]  # before the first update; a skipped update
    assert prune_optimizer_states(history, keep=2) == [folders[0]]
    assert prune_optimizer_states(history, keep=2) == []  # idempotent: a re-run deletes nothing more
    assert [Path(f).exists() for f in folders] == [False, True, True]
    assert (tmp_path / "u0" / "model").exists() and (tmp_path / "u0" / PRUNED).exists()
    with pytest.raises(OptimizerStateMissing, match=r"was pruned .*train.keep_optimizer_states=2"):
        require_optimizer_state(folders[0])
    require_optimizer_state(folders[2])
    require_optimizer_state(None)
    assert prune_optimizer_states(history, keep=1) == [folders[1]]
    assert Path(folders[2]).exists()  # the newest always stays
    with pytest.raises(OptimizerStateMissing, match="is missing"):
        require_optimizer_state(str(tmp_path / "elsewhere" / "ds"))


def test_a_state_another_run_is_resuming_from_is_not_pruned(tmp_path):
    """A sweep sharing the cache: run B resumes from u0's state while run A prunes; A skips it, the next prune takes it."""
    import subprocess
    import sys

    from mars2.train.checkpoints import optimizer_state_in_use

    folders = []
    for c in range(2):
        (tmp_path / f"u{c}" / "ds").mkdir(parents=True)
        folders.append(str(tmp_path / f"u{c}" / "ds"))
    with optimizer_state_in_use(folders[0]):
        other = subprocess.run([sys.executable, "-c", "import sys; from mars2.train.checkpoints import "
                                "prune_optimizer_states as p; print(p(sys.argv[1:], keep=1))", *folders],
                               capture_output=True, text=True, timeout=120)
        assert other.stdout.strip() == "[]" and Path(folders[0]).exists(), other.stderr[-1000:]
    assert prune_optimizer_states(folders, keep=1) == [folders[0]]


@pytest.fixture(scope="module")
def agents_record(tmp_path_factory):
    """The agents stage of one tiny agent on the toy data, run as Prefect would run it."""
    from tasks import agents as agents_stage
    from tasks import data as data_stage

    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("run")
    ctx = StageContext(root=str(root))
    data = DataConfig(n_problems=12)
    dataset = _run_task(data_stage, data_stage.prepare_dataset, mp, ctx=ctx, data=data,
                        input_hash=data_stage.source_hash(data))
    member = AgentConfig(name=OWNER, tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                                                          intermediate_size=64))
    record = _run_task(agents_stage, agents_stage.init_agents, mp, ctx=ctx, members=[member], dataset=dataset)
    mp.undo()
    return ctx, member, record


def test_agents_stage_hands_on_a_complete_model_folder(agents_record):
    _, _, record = agents_record
    w = record.weights_of(OWNER)
    assert w.model_dir == f"{record.dir}/{OWNER}/model" and w.optimizer_dir is None and w.buffer is None
    _loads_alone(w.model_dir)


def _routed(ctx: StageContext, tokenizer_dir: str) -> StageRecord:
    """An advantage record routing a +1 and a −1 answer (twice) to OWNER."""
    from transformers import AutoTokenizer

    from mars2.io import write_parquet

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompt = tok("add two numbers")["input_ids"]
    rows = [{"prompt_ids": prompt, "response_ids": tok(text)["input_ids"], "advantage": adv, "agent": OWNER}
            for text, adv in (("print(sum(map(int, input().split())))", 1.0), ("while True: pass", -1.0))] * 2
    for r in rows:
        r["logprobs"] = [-3.0] * len(r["response_ids"])
    folder = Path(ctx.root) / "routed-test"
    write_parquet(folder / "routed" / f"{OWNER}.parquet", pd.DataFrame(rows))
    return StageRecord(stage="advantage", key="r" * 64, dir=str(folder), files={f"routed/{OWNER}.parquet": "h"})


def test_update_hands_on_a_complete_folder_and_fails_clearly_once_its_state_was_pruned(agents_record, monkeypatch):
    from tasks import update as update_stage

    ctx, member, agents = agents_record
    routed = _routed(ctx, agents.weights_of(OWNER).tokenizer_dir)
    train = TrainConfig(train_batch=2, micro_batch=2)

    def update(weight_record: StageRecord, cycle: int) -> StageRecord:
        return _run_task(update_stage, update_stage.update_policy, monkeypatch, ctx=ctx, member=member, train=train,
                         profile={"zero_optimization": {"stage": 0}}, weight_record=weight_record, agents=agents,
                         routed=routed, cycle=cycle, temperature=1.0)

    first = update(agents, 0)
    w = first.weights_of(OWNER)
    assert (w.model_dir, w.optimizer_dir) == (f"{first.dir}/model", f"{first.dir}/ds")
    assert w.tokenizer_dir == agents.weights_of(OWNER).tokenizer_dir
    _loads_alone(w.model_dir)
    second = update(first, 1)
    assert second.metrics["update_step"] == 2  # resumed from the first update's optimizer state
    prune_optimizer_states([w.optimizer_dir, second.weights_of(OWNER).optimizer_dir], keep=1)
    assert Path(w.model_dir).exists() and not Path(w.optimizer_dir).exists()
    with pytest.raises(OptimizerStateMissing, match="was pruned"):
        update(first, 2)  # an update from the first one's state (e.g. its successor's folder deleted)


def test_checkpoint_files_follow_the_shard_index_else_every_safetensors_file(tmp_path):
    import json

    from mars2.backends.base import CheckpointRefused, checkpoint_files

    with pytest.raises(CheckpointRefused, match="no \\*.safetensors"):
        checkpoint_files(tmp_path)
    for name in ("b.safetensors", "a.safetensors", "stale.safetensors"):
        (tmp_path / name).write_bytes(b"")
    assert [f.name for f in checkpoint_files(tmp_path)] == ["a.safetensors", "b.safetensors", "stale.safetensors"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "b.safetensors",
                                                                                     "y": "a.safetensors",
                                                                                     "z": "b.safetensors"}}))
    assert [f.name for f in checkpoint_files(tmp_path)] == ["a.safetensors", "b.safetensors"]
