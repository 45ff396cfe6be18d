"""One policy update at long-response scale: our ``update_agent`` vs a plain DeepSpeed loop on the same batch.

    python bench/gpu_update.py [--model Qwen3-1.7B] [--response-tokens 16384] [--prompt-tokens 512] [--samples 2]
                               [--steps 1] [--profile zero3_bf16] [--chunk 1024] [--micro-batch-tokens N]
    python bench/gpu_update.py --model Qwen3-8B --profile zero3_bf16_offload
    python bench/gpu_update.py --repeats 3 --variants ours,plain,plain_chunked   # medians; the chunked path's share
    python bench/gpu_update.py --trace ours,plain --skip-save   # profiled runs first: where each loop's time goes
    python bench/gpu_update.py --tiny          # a tiny Qwen3 shape on CPU (the test suite runs this)
    python bench/gpu_update.py --shape 512,4 --fp32 --device cpu --prompt-tokens 128 --response-tokens 2048 \
        --repeats 2 --variants ours,plain,plain_chunked   # a head-heavy shape on CPU: the log-prob path's share

The model is built from ``mars2/plan/model_configs/<model>.json`` (or a folder's config.json) with random weights and saved once to a temporary
folder; both variants run in their own subprocess on the same samples (random tokens), under the same DeepSpeed
profile (``conf/deepspeed/<profile>.yaml``) and optimizer (:func:`mars2.train.update.build_optimizer`):

- ours: :func:`mars2.train.update_agent` (policy and reference built partitioned, π_ref computed before the policy
  exists, chunked log-probs, the profile's gradient checkpointing, token-budget micro-batches when given);
- plain: the policy loaded under ZeRO-3 the same way, gradient checkpointing on, one sample per micro-batch,
  log-probs through the full [L, vocab] fp32 logits (``token_logprobs``), GSPO loss without the KL term (no reference
  model), ``engine.backward``/``engine.step``.

- plain_chunked (on request): the plain loop with ours' chunked log-probs, to split ours/plain into the log-prob
  path's share and the rest.

Prints each variant's peak accelerator memory (CPU: peak RSS) and trained tokens/s of the optimizer loop (model
building and, for ours, the reference pass are outside the timed loop), and ratios to plain. With ``--repeats N``
there are N rounds (every variant once per round, each run in a fresh process) and the median run is reported. A
variant that runs out of memory is reported as such. ``--trace`` runs the named variants once more first, under
``torch.profiler`` from the policy engine's ``train()`` on: the loop's regions (``mars2.policy_logprobs``,
``mars2.backward``, ``mars2.optimizer_step``, which ``update_agent`` names too), the device's busy share and the ops
with the most (device) time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, python_path, qwen3_config, shipped_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def model_config(name: str, tiny: bool, shape: str | None = None):
    """The bench's model: the tiny shape, a Qwen3 of ``shape`` = "HIDDEN,LAYERS" with the real 151,936-token
    vocabulary (tied; a head-heavy model for CPU runs), or ``name``'s config (:func:`common.shipped_config`)."""
    from transformers import Qwen3Config

    if shape:
        hidden, layers = (int(x) for x in shape.split(","))
        return qwen3_config(151936, hidden, layers, tied=True)
    if tiny:
        return Qwen3Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                           tie_word_embeddings=True)
    return shipped_config(name)


def save_random_model(cfg, folder: str, device: str) -> int:
    """Random weights for ``cfg`` (bf16 on CUDA) saved to ``folder``; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the variants run in subprocesses on the same GPU
    return n


def make_samples(n: int, prompt: int, response: int, vocab: int, seed: int = 0):
    import math

    import torch

    from mars2.train import Sample

    g = torch.Generator().manual_seed(seed)
    # a random-weight model is close to uniform: rollout log-probs ≈ −log V keep truncated IS from vetoing
    return [Sample(torch.randint(1, vocab, (prompt,), generator=g).tolist(),
                   torch.randint(1, vocab, (response,), generator=g).tolist(), [-math.log(vocab)] * response,
                   1.0 if i % 2 == 0 else -1.0) for i in range(n)]


def peak_memory_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_ours(job: dict) -> dict:
    import shutil

    from mars2.train import UpdateHParams, update_agent

    samples = make_samples(job["samples"], job["prompt"], job["response"], job["vocab"])
    hp = UpdateHParams(lr=1e-6, micro_batch=1, dtype=job["dtype"], step_batch=job["step_batch"],
                       micro_batch_tokens=job["micro_batch_tokens"], logprob_chunk_tokens=job["chunk"])
    shutil.rmtree(job["out"], ignore_errors=True)  # an earlier repeat's checkpoint (tens of GB at 1.7B)
    m = update_agent(model_dir=job["model_dir"], ref_model_dir=job["model_dir"], prev_ds_dir=None, samples=samples,
                     out_dir=job["out"], profile=job["profile"], hp=hp, pad_id=0, device=job["device"])
    return {"tokens_per_s": m["tokens_per_s"], "seconds": m["step_seconds"], "loss": m["loss"]}


def run_plain(job: dict, chunked: bool = False) -> dict:
    """The plain DeepSpeed loop; ``chunked``: the same loop with :func:`chunked_token_logprobs` in place of the
    full-logits path (how much of ours/plain is the chunked log-prob path alone)."""
    import deepspeed
    import torch
    from torch.profiler import record_function

    from mars2.rl.losses import gspo_loss
    from mars2.train.update import (build_optimizer, chunked_token_logprobs, deepspeed_config, init_distributed,
                                    load_causal_lm, pack_batch, step_groups, token_logprobs)

    init_distributed()
    if job["device"].startswith("cuda"):
        torch.cuda.set_device(job["device"])
    samples = make_samples(job["samples"], job["prompt"], job["response"], job["vocab"])
    groups = step_groups(len(samples), job["step_batch"], 0)
    cfg = deepspeed_config(job["profile"], micro_batch=1, grad_accum=len(groups[0]), grad_clip=1.0)
    model = load_causal_lm(job["model_dir"], job["dtype"], job["device"], cfg)
    if job["profile"].get("gradient_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = build_optimizer(model.parameters(), job["profile"], lr=1e-6, betas=(0.9, 0.95), weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    engine.train()
    start, tokens, loss = time.perf_counter(), 0, 0.0
    for group in groups:
        for i in group:
            b = pack_batch([samples[i]], 0, engine.device)
            with record_function("mars2.policy_logprobs"):  # the regions of update_agent, to compare traces
                if chunked:
                    logp = chunked_token_logprobs(engine, b["input_ids"], b["attention_mask"], b["mask"],
                                                  chunk_tokens=job["chunk"])
                else:
                    logp = token_logprobs(engine, b["input_ids"], b["attention_mask"])
            out = gspo_loss(logp, logp.detach(), b["rollout_logp"], None, b["advantages"], b["mask"])
            with record_function("mars2.backward"):
                engine.backward(out.loss)
            with record_function("mars2.optimizer_step"):
                engine.step()
            tokens += b["input_ids"].numel()
            loss += float(out.loss) / len(samples)
    seconds = time.perf_counter() - start
    engine.destroy()
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "loss": loss}


VARIANTS = {"ours": run_ours, "plain": run_plain, "plain_chunked": lambda job: run_plain(job, chunked=True)}


def variant_job(variant: str, job: dict) -> tuple[str, dict]:
    """``name`` or ``name@CHUNK`` (the same variant with ``logprob_chunk_tokens`` = CHUNK) → (name, job)."""
    name, _, chunk = variant.partition("@")
    if name not in VARIANTS or (chunk and not chunk.isdigit()):
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}, optionally @CHUNK")
    return name, {**job, "chunk": int(chunk)} if chunk else job


def skip_saves() -> None:
    """No checkpoint is written (``--skip-save``): the writes are outside the timed loop, and at 1.7B ours' is 28 GB."""
    import deepspeed

    import mars2.train.update as update_module

    deepspeed.DeepSpeedEngine.save_checkpoint = lambda self, *a, **k: None
    update_module._save_hf = lambda *a, **k: None


def trace_training(prof) -> None:
    """Record ``prof`` from the policy engine's ``train()`` on (the optimizer loop of ours and of plain; model
    building and π_ref come before it) to the end of the run."""
    import deepspeed

    train = deepspeed.DeepSpeedEngine.train

    def start_then_train(self, mode=True):
        if mode and prof.profiler is None:  # eval() is train(False): the reference engine
            prof.start()
        return train(self, mode)

    deepspeed.DeepSpeedEngine.train = start_then_train


def trace_report(prof, seconds: float, device: str, top: int) -> str:
    """The traced loop's regions (mars2.*), the device's busy share and the ops with the most time."""
    from torch.autograd import DeviceType

    events = prof.key_averages()
    cuda = device.startswith("cuda")
    # a region's GPU-side row spans only the kernels of the thread that opened it (backward runs on autograd's own):
    # the host rows give each region's wall time, the busy share below the device's
    lines = ["regions (host wall ms, profiled):"]
    for e in sorted((e for e in events if e.key.startswith("mars2.") and e.device_type == DeviceType.CPU),
                    key=lambda e: e.key):
        lines.append(f"  {e.key:24s} x{e.count}: {e.cpu_time_total / 1e3:.0f}")
    sort = "self_cpu_time_total"
    if cuda:
        busy = sum(e.self_device_time_total for e in events
                   if e.device_type == DeviceType.CUDA and not e.is_user_annotation) / 1e6
        lines.append(f"device busy {busy:.2f} s of the traced loop's {seconds:.2f} s ({busy / seconds:.0%})")
        sort = "self_device_time_total"
    lines.append(events.table(sort_by=sort, row_limit=top))
    return "\n".join(lines)


def worker(variant: str, job_path: str, trace: bool = False) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mars2.shims.deepspeed_import import import_deepspeed

    import_deepspeed()  # first, so that no `import deepspeed` below brings MLflow in
    name, job = variant_job(variant, json.loads(Path(job_path).read_text()))
    if job["skip_save"]:
        skip_saves()
    prof = None
    if trace:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if job["device"].startswith("cuda") else [])
        prof = profile(activities=activities)
        trace_training(prof)
    try:
        res = VARIANTS[name](job)
        res["peak_mb"] = peak_memory_mb(job["device"])
    except torch.OutOfMemoryError as e:
        res = {"oom": str(e).splitlines()[0][:200], "peak_mb": peak_memory_mb(job["device"])}
    if prof is not None and prof.profiler is not None:
        prof.stop()
        if "oom" not in res:
            print(trace_report(prof, res["seconds"], job["device"], job["top"]), flush=True)
    print("RESULT " + json.dumps(res), flush=True)


def summary(runs: list[dict]) -> dict:
    """The median run by tokens/s (the upper middle one of an even count; an out-of-memory run wins), with every
    run's tokens/s and the largest peak."""
    if oom := [r for r in runs if "oom" in r]:
        return oom[0]
    med = sorted(runs, key=lambda r: r["tokens_per_s"])[len(runs) // 2]
    return {**med, "all_tokens_per_s": [r["tokens_per_s"] for r in runs], "peak_mb": max(r["peak_mb"] for r in runs)}


def main() -> None:
    if len(sys.argv) in (4, 5) and sys.argv[1] == "_worker":
        worker(sys.argv[2], sys.argv[3], trace=sys.argv[4:] == ["trace"])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen3-1.7B", help="a shipped config's name (mars2/plan/model_configs) or a folder "
                                                           "with a config.json")
    ap.add_argument("--response-tokens", type=int, default=16384)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1, help="optimizer steps in the update")
    ap.add_argument("--profile", default=None, help="conf/deepspeed profile; default zero3_bf16, or "
                                                    "zero3_bf16_offload for models of 8B parameters and more")
    ap.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_tokens")
    ap.add_argument("--micro-batch-tokens", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeats", type=int, default=1, help="rounds of runs (every variant once per round, "
                                                                  "each in its own process); medians reported")
    ap.add_argument("--variants", default="ours,plain", help="comma-separated: ours, plain, plain_chunked (the plain "
                                                             "loop with chunked log-probs); NAME@CHUNK runs NAME with "
                                                             "CHUNK-token log-prob chunks")
    ap.add_argument("--trace", default="", help="comma-separated variants to run once under torch.profiler before "
                                                "the rounds (their optimizer loop): regions, device busy share, top "
                                                "ops; not in the medians")
    ap.add_argument("--top", type=int, default=15, help="ops listed per trace")
    ap.add_argument("--skip-save", action="store_true", help="write no checkpoint (outside the timed loop; saves "
                                                             "device time: ours' is 28 GB at 1.7B)")
    ap.add_argument("--tiny", action="store_true", help="tiny Qwen3 shape on CPU, ZeRO-3 fp32, 96-token responses")
    ap.add_argument("--shape", default=None, help="HIDDEN,LAYERS: a Qwen3 of that shape with the real vocabulary "
                                                  "instead of --model")
    ap.add_argument("--fp32", action="store_true", help="the profile with bf16 off (for CPU runs)")
    a = ap.parse_args()
    import torch
    import yaml

    device = a.device or ("cuda:0" if torch.cuda.is_available() and not a.tiny else "cpu")
    cfg = model_config(a.model, a.tiny, a.shape)
    if a.tiny:
        a.response_tokens, a.prompt_tokens, a.samples = 96, 16, 2
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env["PYTHONPATH"] = python_path()
    with tempfile.TemporaryDirectory() as tmp:
        n_params = save_random_model(cfg, f"{tmp}/model", device)
        name = a.profile or ("zero3_bf16_offload" if n_params >= 7e9 else "zero3_bf16")
        profile = yaml.safe_load((ROOT / "conf" / "deepspeed" / f"{name}.yaml").read_text())
        if a.tiny:
            profile = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": False}, "gradient_checkpointing": True}
            name = "zero3 fp32 (tiny)"
        if a.fp32:
            profile = {**profile, "bf16": {"enabled": False}}
            name += " with bf16 off"
        bf16 = bool(profile.get("bf16", {}).get("enabled"))
        job = {"model_dir": f"{tmp}/model", "out": f"{tmp}/out", "profile": profile, "device": device,
               "dtype": "bfloat16" if bf16 else "float32", "samples": a.samples, "prompt": a.prompt_tokens,
               "response": a.response_tokens, "vocab": cfg.vocab_size, "chunk": a.chunk,
               "micro_batch_tokens": a.micro_batch_tokens, "skip_save": a.skip_save, "top": a.top,
               "step_batch": None if a.steps <= 1 else max(1, a.samples // a.steps)}
        Path(f"{tmp}/job.json").write_text(json.dumps(job))
        what = "tiny Qwen3" if a.tiny else f"Qwen3 (hidden, layers) = ({a.shape}), vocab 151936" if a.shape else a.model
        print(f"model {what}: {n_params / 1e9:.3f} B parameters, profile {name}, "
              f"device {device}, {a.samples} samples x ({a.prompt_tokens} prompt + {a.response_tokens} response) "
              f"tokens, {a.steps} optimizer step(s), {a.repeats} run(s) per variant", flush=True)
        unit = "GPU memory (max allocated)" if device.startswith("cuda") else "peak RSS"
        runs: dict[str, list[dict]] = {v: [] for v in a.variants.split(",")}
        traced = [v for v in a.trace.split(",") if v]
        for v in [*runs, *traced]:
            variant_job(v, job)

        def run(variant: str, *trace: str) -> dict:
            out = subprocess.run([sys.executable, __file__, "_worker", variant, f"{tmp}/job.json", *trace], env=env,
                                 capture_output=True, text=True)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                raise SystemExit(f"{variant} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
            if trace:
                print("\n".join(ln for ln in out.stdout.splitlines() if not ln.startswith("RESULT ")), flush=True)
            return json.loads(lines[-1][len("RESULT "):])

        for variant in traced:  # first: a device call cut short by its time limit still brings back the profile
            print(f"== trace of {variant} (its own run, not in the medians)", flush=True)
            t0 = time.perf_counter()
            r = run(variant, "trace")
            if "oom" not in r:
                print(f"   traced loop {r['seconds']:.2f} s, {r['tokens_per_s']:.1f} tokens/s "
                      f"(run {time.perf_counter() - t0:.0f} s)", flush=True)
        for rep in range(a.repeats):  # rounds of every variant, each run in a fresh process (nothing carried over)
            for variant in runs:
                t0 = time.perf_counter()
                r = run(variant)
                runs[variant].append(r)
                print(f"  run {rep + 1} {variant}: " + (f"out of memory, {r['peak_mb']:.0f} MB" if "oom" in r else
                      f"{unit} {r['peak_mb']:.0f} MB, {r['tokens_per_s']:.1f} tokens/s") +
                      f" (run {time.perf_counter() - t0:.0f} s)", flush=True)
        res = {v: summary(rs) for v, rs in runs.items()}
    for v, r in res.items():
        if "oom" in r:
            print(f"{v:13s}: out of memory ({r['oom']}); {unit} {r['peak_mb']:.0f} MB at the failure")
        else:
            tps = ", ".join(f"{t:.0f}" for t in r["all_tokens_per_s"])
            print(f"{v:13s}: {unit} {r['peak_mb']:.0f} MB, {r['tokens_per_s']:.1f} tokens/s (median of [{tps}]; "
                  f"{r['seconds']:.2f} s in the optimizer loop), loss {r['loss']:.5f}")
    for v in res:
        if v == "plain" or "plain" not in res:
            continue
        if "oom" not in res[v] and "oom" not in res["plain"]:
            print(f"{v}/plain: memory {res[v]['peak_mb'] / res['plain']['peak_mb']:.2f}x, "
                  f"tokens/s {res[v]['tokens_per_s'] / res['plain']['tokens_per_s']:.2f}x")
        else:
            print(f"{v}/plain: no ratio (a variant ran out of memory)")


if __name__ == "__main__":
    main()
