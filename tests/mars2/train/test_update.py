"""One real DeepSpeed (CPU) policy step per agent: weights move the right way, state carries over."""

import json

import pytest
import torch
from safetensors.torch import load_file

from mars2.train import Sample, UpdateHParams, update_agent, warmup_cosine
from mars2.train.update import deepspeed_config, pack_batch, rank_micro_batches, step_groups, token_logprobs
from mars2.train.launch import UpdateLaunchError, launch_update


def test_warmup_cosine_schedule():
    kw = dict(total_steps=100, warmup_ratio=0.03, lr=1e-6, min_lr=1e-7)
    assert warmup_cosine(0, **kw) == pytest.approx(1e-6 / 3)
    assert warmup_cosine(2, **kw) == pytest.approx(1e-6)
    assert warmup_cosine(100, **kw) == pytest.approx(1e-7)
    assert 1e-7 < warmup_cosine(50, **kw) < 1e-6


def test_deepspeed_config_drops_non_deepspeed_keys():
    cfg = deepspeed_config({"zero_optimization": {"stage": 2}, "gradient_checkpointing": True}, micro_batch=4,
                           grad_accum=3, grad_clip=1.0)
    assert "gradient_checkpointing" not in cfg
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["gradient_accumulation_steps"] == 3


def _logp_of(model_dir, samples, pad_id):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    batch = pack_batch(samples, pad_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
    return (logp * batch["mask"]).sum(1) / batch["mask"].sum(1)


def _good_and_bad(model_dir, tok, copies: int):
    """A correct (+1) and a wrong (−1) answer to one prompt, ``copies`` times each, with rollout log-probs = the
    model's mean log-prob of each; and those initial log-probs."""
    good = tok("print(sum(map(int, input().split())))")["input_ids"]
    bad = tok("while True: pass")["input_ids"]
    prompt = tok("<|user|>\nadd<|end|>\n<|assistant|>\n")["input_ids"]
    init_logp = _logp_of(str(model_dir), [Sample(prompt, good, [0.0] * len(good), 0.0),
                                          Sample(prompt, bad, [0.0] * len(bad), 0.0)], tok.pad_token_id)
    lp = init_logp.tolist()
    samples = [Sample(prompt, good, [lp[0]] * len(good), 1.0), Sample(prompt, bad, [lp[1]] * len(bad), -1.0)] * copies
    return samples, init_logp


def test_update_raises_logprob_of_positive_advantage_and_resumes_optimizer(tiny_model_dir, tiny_tokenizer, tmp_path):
    tok = tiny_tokenizer
    samples, init_logp = _good_and_bad(tiny_model_dir, tok, copies=2)
    hp = UpdateHParams(lr=3e-3, min_lr=3e-4, warmup_ratio=0.0, micro_batch=2, cycles=10)
    profile = {"zero_optimization": {"stage": 0}}
    m1 = update_agent(model_dir=str(tiny_model_dir), ref_model_dir=str(tiny_model_dir), prev_ds_dir=None,
                      samples=samples, out_dir=tmp_path / "c0", profile=profile, hp=hp, pad_id=tok.pad_token_id)
    assert m1["update_step"] == 1 and m1["n_samples"] == 4
    assert (tmp_path / "c0" / "model" / "model.safetensors").exists()
    after = _logp_of(str(tmp_path / "c0" / "model"), samples[:2], tok.pad_token_id)
    assert after[0] > init_logp[0] and after[1] < init_logp[1]

    told = []
    m2 = update_agent(model_dir=str(tmp_path / "c0" / "model"), ref_model_dir=str(tiny_model_dir),
                      prev_ds_dir=str(tmp_path / "c0" / "ds"), samples=samples, out_dir=tmp_path / "c1",
                      profile=profile, hp=hp, pad_id=tok.pad_token_id,
                      progress=lambda done, total: told.append((done, total)))
    assert told == [(4, 4)]  # one optimizer step on all four samples: the stage's display is told once
    assert m2["update_step"] == 2  # optimizer/scheduler state came back from the DeepSpeed checkpoint
    assert m2["kl"] > 0  # the policy has moved away from its frozen reference
    assert json.loads((tmp_path / "c1" / "model" / "config.json").read_text())["model_type"] == "qwen2"


def test_step_batches_split_evenly_and_never_empty():
    from mars2.train.update import step_batches

    assert step_batches(10, None, 4, 0) == [[[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]]  # one step, in order
    steps = step_batches(10, 4, 4, 0)
    assert len(steps) == 2 and all(len(s) == len(steps[0]) for s in steps)  # same accumulation count per step
    flat = sorted(i for s in steps for m in s for i in m)
    assert flat == list(range(10)) and all(m for s in steps for m in s)
    assert step_batches(10, 4, 4, 0) == steps and step_batches(10, 4, 4, 1) != steps  # seeded order
    odd = step_batches(5, 2, 1, 0)
    assert len(odd) == 2 and all(m for s in odd for m in s)
    few = step_batches(3, 8, 8, 0)  # fewer samples than step_batch: one step on all of them
    assert len(few) == 1 and sorted(few[0][0]) == [0, 1, 2]
    with pytest.raises(ValueError):
        step_batches(0, None, 4, 0)


def test_several_optimizer_steps_per_update(tiny_model_dir, tiny_tokenizer, tmp_path):
    tok = tiny_tokenizer
    samples, lp = _good_and_bad(tiny_model_dir, tok, copies=4)
    hp = UpdateHParams(lr=3e-3, min_lr=3e-4, warmup_ratio=0.0, micro_batch=2, cycles=10, step_batch=2)
    m = update_agent(model_dir=str(tiny_model_dir), ref_model_dir=str(tiny_model_dir), prev_ds_dir=None,
                     samples=samples, out_dir=tmp_path / "u", profile={"zero_optimization": {"stage": 0}}, hp=hp,
                     pad_id=tok.pad_token_id)
    assert m["optimizer_steps"] == 4 and m["update_step"] == 4
    assert m["clip_frac"] > 0  # later steps see ratios away from 1: π_old is the policy before the first step
    after = _logp_of(str(tmp_path / "u" / "model"), samples[:2], tok.pad_token_id)
    assert after[0] > lp[0] and after[1] < lp[1]


# one agent's update on several processes (torchrun, gloo on CPU) equals the one-process update

PROFILE = {"zero_optimization": {"stage": 0}}


def test_ranks_split_every_step_into_equal_numbers_of_micro_batches():
    groups = step_groups(11, 5, seed=0)
    per_rank = [rank_micro_batches(groups, micro_batch=2, world=2, rank=r) for r in range(2)]
    assert len({len(m) for steps in per_rank for m in steps}) == 1  # one accumulation count for all steps and ranks
    for s, group in enumerate(groups):
        mine = [sorted(i for m in per_rank[r][s] for i in m) for r in range(2)]
        assert sorted(mine[0] + mine[1]) == sorted(group) and not set(mine[0]) & set(mine[1])
        assert all(m for r in range(2) for m in per_rank[r][s])
    with pytest.raises(ValueError, match="processes"):
        rank_micro_batches(step_groups(3, None, 0), micro_batch=2, world=4, rank=0)


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage,chunk", [(0, 1024), (3, 2)])
def test_two_process_update_matches_one_process(tiny_model_dir, tiny_tokenizer, tmp_path, zero_stage, chunk):
    """ZeRO-3 across the two ranks (weights and optimizer state partitioned, gathered by rank 0 to save) too. With
    log-prob chunks of 2 positions, the two answers (of different lengths) need different numbers of chunks, so the
    ranks' micro-batches do too: under ZeRO-3 every rank must still call the partitioned head equally often
    (mars2.train.update.chunk_count), in the reference, the old log-probs and the training pass alike."""
    tok = tiny_tokenizer
    samples, init_logp = _good_and_bad(tiny_model_dir, tok, copies=4)
    assert len({-(-len(s.response_ids) // chunk) for s in samples}) == (2 if chunk == 2 else 1)
    hp = UpdateHParams(lr=3e-3, min_lr=3e-4, warmup_ratio=0.0, micro_batch=1, cycles=10, step_batch=4,
                       logprob_chunk_tokens=chunk)
    args = dict(model_dir=str(tiny_model_dir), ref_model_dir=str(tiny_model_dir), prev_ds_dir=None, samples=samples,
                profile=PROFILE, hp=hp, pad_id=tok.pad_token_id, device="cpu")
    one = update_agent(out_dir=tmp_path / "one", **args)
    args["profile"] = {"zero_optimization": {"stage": zero_stage}}
    two = launch_update(2, tmp_path / "job", out_dir=str(tmp_path / "two"), **args)
    assert two["processes"] == 2 and two["optimizer_steps"] == one["optimizer_steps"] == 2
    w1 = load_file(tmp_path / "one" / "model" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "model" / "model.safetensors")
    assert w1.keys() == w2.keys()
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-5
    assert any(float((w1[k] - load_file(tiny_model_dir / "model.safetensors")[k]).abs().max()) > 1e-3 for k in w1)
    assert two["kl"] == pytest.approx(one["kl"], rel=1e-4, abs=1e-9)
    assert one["logprob_empty_chunks"] == 0 and (two["logprob_empty_chunks"] > 0) == (chunk == 2)
    after = _logp_of(str(tmp_path / "two" / "model"), samples[:2], tok.pad_token_id)
    assert after[0] > init_logp[0] and after[1] < init_logp[1]

    again = launch_update(2, tmp_path / "job2", **{**args, "model_dir": str(tmp_path / "two" / "model"),
                                                    "prev_ds_dir": str(tmp_path / "two" / "ds")},
                          out_dir=str(tmp_path / "three"), threads_per_rank=3)
    assert again["update_step"] == 4  # optimizer and scheduler state resumed from the two-rank checkpoint
    assert again["cpu_threads"] == 3  # each rank's share of the run's CPU budget


@pytest.mark.slow
def test_failed_launch_raises_with_the_ranks_output(tiny_model_dir, tiny_tokenizer, tmp_path):
    samples, _ = _good_and_bad(tiny_model_dir, tiny_tokenizer, copies=1)
    with pytest.raises(UpdateLaunchError, match="(?s)exit.*missing-model"):
        launch_update(2, tmp_path / "job", model_dir=str(tmp_path / "missing-model"),
                      ref_model_dir=str(tiny_model_dir), prev_ds_dir=None, samples=samples, out_dir=str(tmp_path / "o"),
                      profile=PROFILE, hp=UpdateHParams(), pad_id=tiny_tokenizer.pad_token_id, device="cpu")
    assert not (tmp_path / "o" / "model").exists()


def test_update_hparams_read_the_run_and_agent_config_once():
    from mars2.config import OptimizerConfig, TrainConfig
    from mars2.train import update_hparams

    train = TrainConfig(loss="grpo", clip_eps=0.3, kl_coef=0.01, micro_batch_tokens=4096, step_batch=16, cycles=5, seed=3)
    hp = update_hparams(train, OptimizerConfig(lr=2e-4, betas=[0.8, 0.9], warmup_ratio=0.1), cycle=2,
                        dtype="bfloat16", temperature=0.0)
    assert (hp.loss, hp.clip_eps, hp.kl_coef, hp.micro_batch_tokens, hp.step_batch) == ("grpo", 0.3, 0.01, 4096, 16)
    assert (hp.lr, hp.betas, hp.warmup_ratio) == (2e-4, (0.8, 0.9), 0.1)
    assert (hp.cycle, hp.cycles, hp.seed, hp.dtype) == (2, 5, 5, "bfloat16")
    assert hp.temperature == 1.0  # greedy rollouts train the untempered policy
