"""The vLLM backend's request/response mapping and worker protocol, without a GPU.

vLLM itself cannot be installed beside this stack, so a stand-in ``vllm`` package (objects shaped like
vLLM's RequestOutput/CompletionOutput/Logprob) is put on the worker's PYTHONPATH; everything else — request
file, worker process, response parsing — is the real code path.
"""

import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from mars2.backends import SamplingParams
from mars2.backends.base import request_seed
from mars2.backends.vllm_backend import VLLMBackend, VLLMEngineArgs, build_request, generation_from_vllm
from tests.paths import ROOT
from tests.pids import alive

FAKE_VLLM = '''
import os
from types import SimpleNamespace as NS

class SamplingParams:
    def __init__(self, **kw):
        assert kw["logprobs"] == 0
        self.kw = kw

class LLM:
    def __init__(self, **kw):
        assert kw["logprobs_mode"] == "processed_logprobs" and kw["model"]
        assert "data_parallel_size" not in kw  # offline vllm.LLM is one engine per process
    def generate(self, prompts, sps):
        assert len(sps) == len(prompts)  # one SamplingParams per request: each its own seed
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, sps)):
            assert isinstance(sp.kw["seed"], int)
            comps = []
            for k in range(sp.kw["n"]):
                ids = [10 + i, 20 + k, 2]
                text = f"{p}->{k}@{os.environ.get('CUDA_VISIBLE_DEVICES')}"
                comps.append(NS(token_ids=ids, text=text, finish_reason="stop" if k == 0 else "length",
                                logprobs=[{t: NS(logprob=-0.5 * (j + 1)), 999: NS(logprob=-9.0)} for j, t in enumerate(ids)]))
            outs.append(NS(prompt_token_ids=[1, 2, 3 + i], outputs=comps))
        return outs
'''


def test_request_carries_sampling_and_engine_arguments():
    params = SamplingParams(n=3, temperature=0.0, top_p=0.9, max_new_tokens=7, seed=5)
    req = build_request(["a", "b"], params, VLLMEngineArgs(model="/m", tensor_parallel_size=4), seeds=[11, 12])
    assert req["sampling"] == {"n": 3, "temperature": 0.0, "top_p": 1.0, "max_tokens": 7, "logprobs": 0}
    assert req["engine"]["tensor_parallel_size"] == 4 and req["prompts"] == ["a", "b"] and req["seeds"] == [11, 12]
    from mars2.backends.base import prompt_seeds

    assert build_request(["a", "b"], params, VLLMEngineArgs(model="/m"))["seeds"] == prompt_seeds(params, 2)


def test_completion_output_maps_to_generation():
    out = SimpleNamespace(token_ids=[5, 6], text="hi", finish_reason="length",
                          logprobs=[{5: SimpleNamespace(logprob=-1.0), 7: SimpleNamespace(logprob=-0.1)},
                                    {6: SimpleNamespace(logprob=-2.0)}])
    g = generation_from_vllm([1, 2], out)
    assert (g.prompt_ids, g.response_ids, g.logprobs, g.finish_reason) == ([1, 2], [5, 6], [-1.0, -2.0], "length")
    with pytest.raises(ValueError, match="log-probs"):
        generation_from_vllm([1], SimpleNamespace(token_ids=[5], text="", finish_reason="stop", logprobs=None))


def test_worker_protocol_end_to_end_with_a_stand_in_engine(tmp_path, monkeypatch):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    backend = VLLMBackend(VLLMEngineArgs(model=str(tmp_path)), python=sys.executable)
    out = backend.generate(["p0", "p1"], SamplingParams(n=2, max_new_tokens=3))
    assert [len(g) for g in out] == [2, 2]
    assert out[1][0].response_ids == [11, 20, 2] and out[1][0].prompt_ids == [1, 2, 4]
    assert out[0][1].logprobs == [-0.5, -1.0, -1.5] and out[0][1].finish_reason == "length"
    assert out[0][0].text.startswith("p0->0@")


def test_engine_replicas_run_as_one_worker_each_on_their_own_gpus(tmp_path, monkeypatch):
    """data_parallel_size = 2 engines of TP 2 on the four GPUs this process sees: prompt i goes to replica i mod 2,
    which sees only its two GPUs; the answers come back in prompt order."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    backend = VLLMBackend(VLLMEngineArgs(model=str(tmp_path), tensor_parallel_size=2, data_parallel_size=2),
                          python=sys.executable)
    out = backend.generate([f"p{i}" for i in range(5)], SamplingParams(n=1, max_new_tokens=3))
    assert [g[0].text for g in out] == ["p0->0@4,5", "p1->0@6,7", "p2->0@4,5", "p3->0@6,7", "p4->0@4,5"]
    one = VLLMBackend(VLLMEngineArgs(model=str(tmp_path), tensor_parallel_size=2, data_parallel_size=2),
                      python=sys.executable).generate(["only"], SamplingParams())
    assert one[0][0].text == "only->0@4,5"  # one prompt: one worker
    from mars2.backends.vllm_backend import replica_devices

    with pytest.raises(ValueError, match="need 4 GPUs"):
        replica_devices(2, 2, "0,1")


def test_worker_failure_is_reported_clearly(tmp_path):
    backend = VLLMBackend(VLLMEngineArgs(model="/nope"), python=sys.executable)
    with pytest.raises(RuntimeError, match="vLLM worker 0 .* failed"):
        backend.generate(["x"], SamplingParams())


def test_the_backend_group_and_the_models_end_tokens_reach_the_engine(tmp_path):
    """An agent's engine takes the ``backend`` group's settings (TP, replicas, memory, context, eager, prefix cache)
    and every end token its model folder's generation config lists."""
    import json

    from mars2.backends.base import end_token_ids, generation_config_eos
    from mars2.backends.vllm_backend import vllm_engine_args
    from mars2.config import AgentConfig, BackendConfig

    member = AgentConfig(name="q", model=str(tmp_path), backend="vllm", device="cuda", dtype="bfloat16", gpus=8)
    engine = vllm_engine_args(str(tmp_path), member, BackendConfig(gpu_memory_utilization=0.75, tensor_parallel_size=2,
                                                                   max_model_len=40000, enforce_eager=True))
    assert (engine.tensor_parallel_size, engine.data_parallel_size, engine.gpu_memory_utilization) == (2, 4, 0.75)
    assert (engine.max_model_len, engine.enforce_eager, engine.enable_prefix_caching, engine.dtype) == (
        40000, True, False, "bfloat16")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    stops = end_token_ids(generation_config_eos(str(tmp_path)), 151643)
    assert stops == [151645, 151643]
    req = build_request(["a"], SamplingParams(max_new_tokens=5), engine, stops)
    assert req["sampling"]["stop_token_ids"] == [151645, 151643]
    assert "data_parallel_size" not in req["engine"] and req["engine"]["enforce_eager"] is True


FAKE_ASYNC_VLLM = {
    "vllm/__init__.py": '''
class SamplingParams:
    def __init__(self, **kw):
        assert kw["logprobs"] == 0 and kw["n"] == 1 and isinstance(kw["seed"], int)
        self.kw = kw

class AsyncEngineArgs:
    def __init__(self, **kw):
        assert kw["logprobs_mode"] == "processed_logprobs" and kw["model"]
        self.kw = kw
''',
    "vllm/platforms/__init__.py": '''
import os

class _Platform:
    def is_sleep_mode_available(self):  # as vLLM: CUDA, ROCm and XPU have it, CPU does not
        return os.environ.get("FAKE_VLLM_DEVICE", "cuda") != "cpu"

    def is_cpu(self):
        return os.environ.get("FAKE_VLLM_DEVICE", "cuda") == "cpu"

current_platform = _Platform()
''',
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/exceptions.py": '''
class EngineDeadError(Exception):
    pass
''',
    "vllm/v1/engine/async_llm.py": '''
import asyncio, json, os
from types import SimpleNamespace as NS

from vllm.v1.engine.exceptions import EngineDeadError

def log(*event):
    with open(os.environ["FAKE_VLLM_LOG"], "a") as f:
        f.write(json.dumps(event) + "\\n")

class AsyncLLM:
    def __init__(self, kw):
        from vllm.platforms import current_platform

        self.model, self.in_flight, self.peak, self.asleep = kw["model"], 0, 0, False
        self.sleep_mode = kw.get("enable_sleep_mode", False)
        assert current_platform.is_sleep_mode_available() or not self.sleep_mode, "Sleep mode is not supported"
        self.core_dead = False  # its engine core exited: every call fails from then on, as vLLM's
        log("start", kw["model"], kw["tensor_parallel_size"], kw["data_parallel_size"])

    @property
    def errored(self):  # the core dies at a request for "die", or while idle when FAKE_VLLM_KILL names this process
        killed = os.environ.get("FAKE_VLLM_KILL", "")
        if killed and os.path.exists(killed) and open(killed).read() == str(os.getpid()):
            self.core_dead = True
        return self.core_dead

    @classmethod
    def from_engine_args(cls, args):
        return cls(args.kw)

    async def generate(self, prompt, sp, request_id):
        if self.errored:
            raise EngineDeadError()
        armed = os.environ.get("FAKE_VLLM_DIE", "")
        if prompt == "die" and armed and os.path.exists(armed):  # once: the restarted engine answers it
            os.unlink(armed)
            await asyncio.sleep(0.1)  # the other requests are in flight with it
            self.core_dead = True
            log("died")
            raise EngineDeadError()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        ids = [len(prompt), sp.kw["seed"] % 1000, 2]
        yield NS(prompt_token_ids=[1, 2], outputs=[NS(token_ids=ids[:1], text="", finish_reason=None,
                                                       logprobs=[{ids[0]: NS(logprob=-0.5)}])])
        await asyncio.sleep(0.2)  # long enough for every request of the test to be in flight together
        self.in_flight -= 1
        if self.core_dead:
            raise EngineDeadError()
        log("generate", prompt, sp.kw["seed"], sp.kw["stop_token_ids"], self.model, self.peak)
        yield NS(prompt_token_ids=[1, 2], outputs=[NS(token_ids=ids, text=f"{self.model}|{prompt}",
                                                       finish_reason="stop",
                                                       logprobs=[{t: NS(logprob=-0.5)} for t in ids])])

    async def collective_rpc(self, method, kwargs=None):
        armed = os.environ.get("FAKE_VLLM_WORKER_DIES", "")
        if armed and os.path.exists(armed):  # once: a TP worker dies mid-call; the engine is marked dead 50 ms later
            os.unlink(armed)
            asyncio.get_running_loop().call_later(0.05, setattr, self, "core_dead", True)
            log("worker died")
            raise Exception(f"Call to collective_rpc method failed: cancelled")
        assert not self.asleep, "a reload into weights that sleep moved out"
        log("rpc", method, kwargs, self.in_flight)
        self.model = kwargs["weights_path"]

    async def reset_prefix_cache(self):
        log("reset")
        return True

    async def sleep(self, level=1):
        assert self.sleep_mode, "Sleep mode is not enabled in the model config"
        armed = os.environ.get("FAKE_VLLM_SLEEP_DIES", "")
        if armed and os.path.exists(armed):  # once: the core dies in the sleep
            os.unlink(armed)
            self.core_dead = True
            log("died in sleep")
            raise EngineDeadError()
        self.asleep = True
        log("sleep", level)

    async def wake_up(self):
        oom = os.environ.get("FAKE_VLLM_WAKE_OOM", "")
        if oom and os.path.exists(oom):  # the update still holds the GPU
            raise Exception("Call to collective_rpc method failed: CUDA out of memory")
        self.asleep = False
        log("wake")

    def shutdown(self):  # as vLLM's: the engine is marked dead, what is in flight fails with EngineDeadError; a
        first = not self.core_dead  # second call returns at once
        self.core_dead = True
        log("shutdown")
        if first:
            import time
            time.sleep(float(os.environ.get("FAKE_VLLM_SHUTDOWN_S", "0")))
''',
}


def test_a_persistent_vllm_engine_streams_requests_and_reloads_weights_in_place(tmp_path, monkeypatch):
    """The vLLM engine of a run (``AsyncLLM`` behind the engine protocol) with a stand-in ``vllm`` package that, like
    vLLM, refuses ``sleep`` without sleep mode: requests are in flight together, each with its own seed and the
    model's end tokens; a new version is loaded with ``collective_rpc("reload_weights")`` once none is in flight,
    then the prefix cache is reset; sleep is level 2 (weights discarded) and a request after it wakes the engine and
    reloads the folder it held, a load into a sleeping engine wakes it and loads only the new folder; a folder
    without readable safetensors is refused before the reload and the engine keeps its version, and a sleeping engine
    refusing one stays asleep (it is not woken into discarded weights); it is started once."""
    import json

    import torch
    from safetensors.torch import save_file

    from mars2.backends.engine import EngineClient, EngineError, EngineSpec

    for name, text in FAKE_ASYNC_VLLM.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    ckpt = {v: tmp_path / "ckpt" / v for v in ("v1", "v2", "v3", "broken")}
    for v, folder in ckpt.items():
        folder.mkdir(parents=True)
        if v == "broken":
            (folder / "model.safetensors").write_bytes(b"truncated")
        else:
            save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    v1, v2, v3 = (str(ckpt[v]) for v in ("v1", "v2", "v3"))
    log = tmp_path / "vllm.log"
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    engine_args = VLLMEngineArgs(model=v1, tensor_parallel_size=2, data_parallel_size=2)
    from dataclasses import asdict

    engine = EngineClient(EngineSpec("qwen", v1, v1, version="v1", device="cuda", kind="vllm",
                                     python=sys.executable, vllm=asdict(engine_args), stop_token_ids=(7, 8)))
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=16)
        futures = [engine.submit(f"p{i}", params, seed=i) for i in range(4)]
        engine.load(v2, "v2")  # waits for the four requests above
        first = [f.result() for f in futures]
        assert [g.text for g in first] == [f"{v1}|p{i}" for i in range(4)]
        assert first[0].response_ids == [2, request_seed(0, 0) % 1000, 2] and first[0].logprobs == [-0.5] * 3
        assert first[0].finish_reason == "stop" and first[0].prompt_ids == [1, 2]
        assert engine.generate(["q"], params, [9])[0][0].text == f"{v2}|q"
        engine.sleep()
        assert engine.generate(["r"], params, [9])[0][0].text == f"{v2}|r"
        engine.sleep()  # the update runs; then the next stage loads its weights into the sleeping engine
        engine.load(v3, "v3")
        assert engine.generate(["t"], params, [9])[0][0].text == f"{v3}|t"
        with pytest.raises(EngineError, match="broken/model.safetensors cannot be read"):
            engine.load(str(ckpt["broken"]), "v4")
        assert engine.health()["version"] == "v3" and engine.generate(["u"], params, [9])[0][0].text == f"{v3}|u"
        engine.sleep()  # level 2 kept no weights: a refused folder must not wake it into them
        with pytest.raises(EngineError, match="broken/model.safetensors cannot be read"):
            engine.load(str(ckpt["broken"]), "v4")
        health = engine.health()
        assert health["asleep"] and health["version"] == "v3"
        assert engine.generate(["w"], params, [9])[0][0].text == f"{v3}|w"  # woken by the request, v3 reloaded
        engine.spec = engine.spec.__class__(**{**engine.spec.__dict__, "version": "v1"})  # a stale caller
        with pytest.raises(EngineError, match="holds weights version 'v3'"):
            engine.generate(["s"], params, [1])
    finally:
        engine.close()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [e[0] for e in events]
    assert kinds.count("start") == 1 and events[0] == ["start", v1, 2, 2] and kinds[-1] == "shutdown"
    generated = [e for e in events if e[0] == "generate"]
    assert max(e[5] for e in generated[:4]) == 4  # all four in flight at once
    assert all(e[3] == [7, 8] for e in generated)
    rpc = kinds.index("rpc")
    assert events[rpc][1:] == ["reload_weights", {"weights_path": v2}, 0] and kinds[rpc + 1] == "reset"
    assert kinds.index("rpc") > max(i for i, e in enumerate(events[:rpc]) if e[0] == "generate")
    sleeps = [i for i, k in enumerate(kinds) if k == "sleep"]
    assert [events[i][1] for i in sleeps] == [2, 2, 2]  # level 2: nothing copied to host memory
    wake = kinds.index("wake", sleeps[0])
    assert events[wake + 1][1:] == ["reload_weights", {"weights_path": v2}, 0] and kinds[wake + 2] == "reset"
    v3_load = [i for i, e in enumerate(events) if e[0] == "rpc" and e[2] == {"weights_path": v3}]
    assert kinds.count("rpc") == 4 and len(v3_load) == 2
    assert kinds[v3_load[0] - 1] == "wake"  # the load into the sleeping engine: woken, then only v3 loaded
    assert kinds[v3_load[1] - 1] == "wake" and kinds.index("wake", sleeps[2]) == v3_load[1] - 1  # the refused load
    # left it asleep: the next request woke it and reloaded the folder it held


def test_a_vllm_engine_on_the_cpu_never_asks_for_sleep_mode(tmp_path, monkeypatch):
    """vLLM refuses ``enable_sleep_mode`` at construction where the platform has none (its CPU build): the adapter
    decides from the platform, and sleeping there is a no-op."""
    import torch
    from safetensors.torch import save_file

    from mars2.backends.engine import EngineClient, EngineSpec

    for name, text in FAKE_ASYNC_VLLM.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    log = tmp_path / "vllm.log"
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.setenv("FAKE_VLLM_DEVICE", "cpu")
    from dataclasses import asdict

    engine = EngineClient(EngineSpec("q", str(folder), str(folder), version="v1", device="cpu", kind="vllm",
                                     python=sys.executable, vllm=asdict(VLLMEngineArgs(model=str(folder))), stop_token_ids=(7,)))
    try:
        engine.sleep()
        assert engine.generate(["a"], SamplingParams(max_new_tokens=4), [1])[0][0].text == f"{folder}|a"
    finally:
        engine.close()
    assert "sleep" not in log.read_text() and "wake" not in log.read_text()


def _stand_in_async_vllm(tmp_path, monkeypatch, versions=("v1", "v2")):
    """The stand-in ``vllm`` on the engine's path, its event log, and a checkpoint folder per version."""
    import torch
    from safetensors.torch import save_file

    for name, text in FAKE_ASYNC_VLLM.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    folders = {}
    for v in versions:
        folders[v] = tmp_path / "ckpt" / v
        folders[v].mkdir(parents=True)
        save_file({"w": torch.zeros(2)}, str(folders[v] / "model.safetensors"))
    log = tmp_path / "vllm.log"
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    return log, {v: str(f) for v, f in folders.items()}


def _arm(tmp_path, monkeypatch, variable: str) -> None:
    """Arm one of the stand-in's once-only deaths (the file it names goes at the death: a restarted engine lives)."""
    armed = tmp_path / variable.lower()
    armed.touch()
    monkeypatch.setenv(variable, str(armed))


def _stand_in_spec(model_dir: str, tp: int = 1, dp: int = 1):
    from dataclasses import asdict

    from mars2.backends.engine import EngineSpec

    return EngineSpec("qwen", model_dir, model_dir, version="v1", device="cuda", kind="vllm", python=sys.executable,
                      vllm=asdict(VLLMEngineArgs(model=model_dir, tensor_parallel_size=tp, data_parallel_size=dp)),
                      stop_token_ids=(7,))


def test_a_vllm_engine_whose_core_dies_mid_request_is_restarted_and_answers_what_was_in_flight(tmp_path,
                                                                                               monkeypatch):
    """vLLM's engine core exits while four requests are in flight (``EngineDeadError`` for each, ``AsyncLLM.errored``
    from then on): the engine's process ends without answering them (before: each answered with an error, and the
    process lived on, serving nothing); its client restarts it once, from the version it held, and sends the four
    again: each is answered at that version."""
    import json

    from mars2.backends.engine import EngineClient

    log, ckpt = _stand_in_async_vllm(tmp_path, monkeypatch)
    _arm(tmp_path, monkeypatch, "FAKE_VLLM_DIE")
    engine = EngineClient(_stand_in_spec(ckpt["v1"]))
    try:
        engine.load(ckpt["v2"], "v2")
        first = engine.pid
        params = SamplingParams(temperature=1.0, max_new_tokens=16)
        prompts = ["a", "die", "b", "c"]
        futures = [engine.submit(p, params, seed=i) for i, p in enumerate(prompts)]
        assert [f.result(timeout=60).text for f in futures] == [f"{ckpt['v2']}|{p}" for p in prompts]
        assert engine.starts == 2 and engine.pid != first
        health = engine.health()
        assert health["version"] == "v2" and health["dead"] is False
        assert "exiting, so that its client restarts it" in engine._log.read_text()
    finally:
        engine.close()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    starts = [e for e in events if e[0] == "start"]
    assert [e[1] for e in starts] == [ckpt["v1"], ckpt["v2"]]  # restarted from the weights it held
    assert [e[0] for e in events].count("died") == 1


@pytest.mark.parametrize("tp, dp", [(2, 1), (1, 2)])
def test_a_worker_dying_in_a_load_restarts_the_engine_and_the_load_is_done(tmp_path, monkeypatch, tp, dp):
    """With worker processes of their own (vLLM's "mp" executor: TP × PP × DP > 1, so also data-parallel replicas of
    TP 1) a worker that dies during ``reload_weights`` fails the call with a plain error ("collective_rpc ...
    cancelled") and vLLM marks the engine dead only afterwards: the engine still counts it as its death (before: the
    load was answered with that error and the stage failed, the engine ending half a second later; at TP 1 and DP 2
    so until this case was seen), so its client restarts it from the version it held and sends the load again, which
    succeeds."""
    import json

    from mars2.backends.engine import EngineClient

    log, ckpt = _stand_in_async_vllm(tmp_path, monkeypatch)
    _arm(tmp_path, monkeypatch, "FAKE_VLLM_WORKER_DIES")
    engine = EngineClient(_stand_in_spec(ckpt["v1"], tp=tp, dp=dp))
    try:
        engine.load(ckpt["v2"], "v2")
        assert engine.starts == 2 and engine.health()["version"] == "v2"
        params = SamplingParams(temperature=1.0, max_new_tokens=16)
        assert engine.generate(["a"], params, [1])[0][0].text == f"{ckpt['v2']}|a"
    finally:
        engine.close()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e[1] for e in events if e[0] == "start"] == [ckpt["v1"], ckpt["v1"]]  # restarted from the version held
    assert [e[0] for e in events].count("worker died") == 1


def test_a_wake_that_fails_without_a_death_fails_each_request_at_once(tmp_path, monkeypatch):
    """A sleeping TP 2 engine whose wake fails with an error that is no worker's death (out of memory: the update
    still holds the GPU): each queued request is answered with the error at once, not after the grace a dying
    worker's error gets (5 s each, one after the other)."""
    from mars2.backends.engine import EngineClient, EngineError

    _, ckpt = _stand_in_async_vllm(tmp_path, monkeypatch, versions=("v1",))
    oom = tmp_path / "oom"
    monkeypatch.setenv("FAKE_VLLM_WAKE_OOM", str(oom))
    engine = EngineClient(_stand_in_spec(ckpt["v1"], tp=2))
    try:
        engine.sleep()
        oom.touch()
        started = time.monotonic()
        futures = [engine.submit(f"p{i}", SamplingParams(max_new_tokens=4), seed=i) for i in range(5)]
        for f in futures:
            with pytest.raises(EngineError, match="CUDA out of memory"):
                f.result(timeout=60)
        assert time.monotonic() - started < 3 and engine.starts == 1
    finally:
        engine.close()


def test_closing_an_engine_with_requests_in_flight_is_no_death(tmp_path, monkeypatch):
    """vLLM's shutdown marks its engine dead and fails the requests in flight with ``EngineDeadError``: closing an
    engine then is a clean exit (its folder removed), not a death that races the shutdown's answer (before: the
    client could wait 10 s for it, and the log said the engine died)."""
    from mars2.backends.engine import EngineClient

    _, ckpt = _stand_in_async_vllm(tmp_path, monkeypatch, versions=("v1",))
    monkeypatch.setenv("FAKE_VLLM_SHUTDOWN_S", "0.6")
    engine = EngineClient(_stand_in_spec(ckpt["v1"]))
    folder = engine._folder
    engine.submit("p", SamplingParams(max_new_tokens=4), seed=1)
    started = time.monotonic()
    engine.close()
    assert time.monotonic() - started < 5
    assert not folder.exists()  # a clean exit (code 0, one start): the log was not kept


def test_a_node_service_whose_vllm_core_dies_while_idle_ends_and_the_next_stage_starts_another(tmp_path,
                                                                                              monkeypatch):
    """orchestration=pools: the engine core of a node service dies while no stage uses it. The service's watch sees
    it and ends the process (before: it lived on, answered its health, and every later stage attached to it and got
    errors); the next stage on the node starts a new service, which answers."""
    from mars2.backends.engine import EngineClient

    _, ckpt = _stand_in_async_vllm(tmp_path, monkeypatch, versions=("v1",))
    killed = tmp_path / "kill"
    monkeypatch.setenv("FAKE_VLLM_KILL", str(killed))
    service_dir = tmp_path / "engines" / "run-1" / "node-a"
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    first = EngineClient(_stand_in_spec(ckpt["v1"]), service_dir=service_dir, idle_exit_s=60)
    pid = first.pid
    try:
        assert first.generate(["a"], params, [1])[0][0].text == f"{ckpt['v1']}|a"
    finally:
        first.close()  # the stage ends: disconnected, the service stays
    killed.write_text(str(pid))  # its engine core dies
    deadline = time.monotonic() + 15
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), "a service whose engine died lived on"
    second = EngineClient(_stand_in_spec(ckpt["v1"]), service_dir=service_dir, idle_exit_s=60)
    try:
        assert second.starts == 1 and second.pid != pid
        assert second.generate(["b"], params, [1])[0][0].text == f"{ckpt['v1']}|b"
    finally:
        second.close()
        (service_dir.parent / "STOP").write_text("")


def test_an_engine_that_dies_asleep_is_restarted_by_the_next_request_not_at_once(tmp_path, monkeypatch):
    """The engine core of a sleeping engine dies between stages (the update holds the accelerator): its client does
    not start it again at once (before: its reader did, and on a GPU the start fails for want of memory, failing the
    next stage, or takes the update's memory), nor when a stage that did not use it puts it to sleep again; the next
    request restarts it, from the version it held, and is answered."""
    import json

    from mars2.backends.engine import EngineClient

    log, ckpt = _stand_in_async_vllm(tmp_path, monkeypatch, versions=("v1",))
    killed = tmp_path / "kill"
    monkeypatch.setenv("FAKE_VLLM_KILL", str(killed))
    engine = EngineClient(_stand_in_spec(ckpt["v1"]))
    try:
        engine.sleep()
        pid = engine.pid
        killed.write_text(str(pid))  # its engine core dies; the server's watch sees it and exits
        deadline = time.monotonic() + 15
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), "the engine server outlived its engine"
        time.sleep(2.0)  # a restart by the reader would have started the new engine by now
        engine.sleep()  # a stage that used it not: released again, still no start
        starts = [e for e in map(json.loads, log.read_text().splitlines()) if e[0] == "start"]
        assert engine.starts == 1 and len(starts) == 1
        params = SamplingParams(temperature=1.0, max_new_tokens=16)
        assert engine.generate(["a"], params, [1])[0][0].text == f"{ckpt['v1']}|a"
        assert engine.starts == 2 and engine.pid != pid and engine.health()["version"] == "v1"
    finally:
        engine.close()


def test_an_engine_that_dies_in_its_sleep_is_restarted_by_the_next_request(tmp_path, monkeypatch):
    """The engine core dies during the sleep that frees the accelerator for the update: the sleep is done all the
    same (the engine holds nothing), and the engine is started again by the next request, not at once (before: the
    reader restarted it in full, weights and cache, and put it back to sleep, the update waiting meanwhile)."""
    import json

    from mars2.backends.engine import EngineClient

    log, ckpt = _stand_in_async_vllm(tmp_path, monkeypatch, versions=("v1",))
    _arm(tmp_path, monkeypatch, "FAKE_VLLM_SLEEP_DIES")
    engine = EngineClient(_stand_in_spec(ckpt["v1"]))
    try:
        engine.sleep()  # a restart by the reader would be answered before this returns
        events = [json.loads(line) for line in log.read_text().splitlines()]
        assert [e[0] for e in events].count("died in sleep") == 1
        assert engine.starts == 1 and [e[0] for e in events].count("start") == 1
        params = SamplingParams(temperature=1.0, max_new_tokens=16)
        assert engine.generate(["a"], params, [1])[0][0].text == f"{ckpt['v1']}|a"
        assert engine.starts == 2
    finally:
        engine.close()


def test_a_reload_folder_missing_a_tensor_of_the_served_model_is_refused(tiny_model_dir, tmp_path):
    """vLLM's in-place reload only warns about a tensor the new folder lacks and keeps that layer's old weights (a
    model half old, half new under the new version): the check refuses such a folder, naming the tensor; a tied
    output projection a folder leaves out is not missing."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from mars2.backends.base import CheckpointRefused
    from mars2.backends.vllm_engine import check_safetensors, tensor_names

    served = tensor_names(str(tiny_model_dir))
    check_safetensors(str(tiny_model_dir), served)  # the same folder passes
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    dropped = next(name for name in sorted(tensors) if "layers.1.mlp" in name)
    partial = tmp_path / "partial"
    shutil.copytree(tiny_model_dir, partial)
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(partial / "model.safetensors"))
    with pytest.raises(CheckpointRefused, match=f"lacks 1 tensor.*{dropped}"):
        check_safetensors(str(partial), served)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    untied = served | {"lm_head.weight"}
    for tied in (True, False):
        (partial / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": tied}))
        save_file({k: v for k, v in tensors.items() if k != "lm_head.weight"}, str(partial / "model.safetensors"))
        if tied:
            check_safetensors(str(partial), untied)
        else:
            with pytest.raises(CheckpointRefused, match="lm_head.weight"):
                check_safetensors(str(partial), untied)


def test_buffers_vllm_never_loads_are_not_required_of_a_reload_folder(tiny_model_dir, tmp_path):
    """A published first folder may hold non-persistent rotary buffers (``inv_freq``) that transformers does not save
    and vLLM skips: a folder saved by the trainer without them is not refused for it."""
    from mars2.backends.vllm_engine import check_safetensors, tensor_names

    served = tensor_names(str(tiny_model_dir)) | {"model.layers.0.self_attn.rotary_emb.inv_freq",
                                                  "model.rotary_emb.inv_freq"}
    check_safetensors(str(tiny_model_dir), served)
