"""Host memory of the policy update on CPU: (a) chunked vs full-logits log-probs, (b) ZeRO-3 partitions from construction.

    python bench/update_memory.py logprobs [--tokens 8192] [--vocab 151936] [--hidden 256] [--layers 1] [--chunk 1024]
                                           [--check-tokens 1024] [--device cpu|cuda] [--dtype float32|bfloat16]
    python bench/update_memory.py zero3 [--hidden 1024] [--layers 4] [--vocab 151936]

(a) One tiny Qwen3-architecture model (real vocabulary) and one sequence of ``--tokens`` response tokens: log-probs +
    GSPO loss, forward and backward, once through the full-logits path (``token_logprobs``: [L, vocab] fp32 logits,
    a log_softmax copy and their gradients) and once through ``chunked_token_logprobs``. Each variant runs in its own
    subprocess and reports its peak RSS (``ru_maxrss``) above the RSS it had before the log-probs. Both variants then
    run at ``--check-tokens`` (small enough for the full path anywhere) in float32 and their masked log-probs, loss
    and gradient are compared (max |difference| must be < 1e-5); at the full length the losses are printed side by
    side. With ``--device cuda`` the model sits on the GPU in ``--dtype`` and memory is the peak allocated GPU memory
    above what the model held before the log-probs (``torch.cuda.max_memory_allocated``); a variant that runs out of
    GPU memory is reported as such.
(b) A Qwen3-architecture model saved to a temporary folder is built by ``load_causal_lm`` under ZeRO-3 on two gloo
    ranks (torchrun, CPU) and, as the baseline, by one process without DeepSpeed. Prints each process's peak RSS
    above its starting RSS (held once built, and the peak while building) and the parameters it holds locally.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

from common import python_path, qwen3_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# (a) log-probs

def logprob_worker(variant: str, tokens: int, vocab: int, hidden: int, layers: int, chunk: int, dump: str,
                   device: str = "cpu", dtype: str = "float32") -> dict:
    """One variant's log-probs + loss, forward and backward, on one sequence (64 prompt + ``tokens`` response).
    Memory: peak RSS on the CPU, peak allocated GPU memory on CUDA, each above what was held before the log-probs."""
    import torch
    from transformers import Qwen3ForCausalLM

    from mars2.rl.losses import gspo_loss
    from mars2.train.update import Sample, chunked_token_logprobs, pack_batch, token_logprobs

    cuda = device.startswith("cuda")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config(vocab, hidden, layers)).to(device=device, dtype=getattr(torch, dtype))
    g = torch.Generator().manual_seed(1)
    prompt, response = (torch.randint(0, vocab, (n,), generator=g).tolist() for n in (64, tokens))
    batch = {k: v.to(device) for k, v in pack_batch([Sample(prompt, response, [0.0] * tokens, 1.0)], pad_id=0).items()}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / 2**20 if cuda else current_rss_mb()
    res = {"variant": variant, "tokens": tokens, "device": device, "dtype": dtype, "rss_before_mb": before}
    try:
        if variant == "full":
            logp = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
        else:
            logp = chunked_token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["mask"],
                                          chunk_tokens=chunk)
        logp = logp * batch["mask"]
        with torch.no_grad():
            rollout = logp.detach() - 0.01 * batch["mask"]
        out = gspo_loss(logp, logp.detach(), rollout, rollout, batch["advantages"], batch["mask"])
        out.loss.backward()
    except torch.OutOfMemoryError as e:
        peak = torch.cuda.max_memory_allocated() / 2**20
        return {**res, "oom": str(e).splitlines()[0][:160], "peak_rss_mb": peak, "peak_above_mb": peak - before}
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb()
    grad = torch.cat([p.grad.float().flatten() for p in model.parameters()]).cpu()
    torch.save({"logp": logp.detach()[batch["mask"] == 1].cpu(), "grad": grad}, dump)
    return {**res, "loss": float(out.loss), "peak_rss_mb": peak, "peak_above_mb": peak - before}


def run_worker(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": python_path()})
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(a: str, b: str) -> tuple[float, float]:
    import torch

    x, y = torch.load(a), torch.load(b)
    return float((x["logp"] - y["logp"]).abs().max()), float((x["grad"] - y["grad"]).abs().max())


def bench_logprobs(a) -> None:
    shape = ["--vocab", str(a.vocab), "--hidden", str(a.hidden), "--layers", str(a.layers), "--chunk", str(a.chunk),
             "--device", a.device]
    unit = "peak GPU memory (allocated)" if a.device.startswith("cuda") else "peak RSS"
    with tempfile.TemporaryDirectory() as tmp:
        check = {v: run_worker(["_logprob", v, "--tokens", str(a.check_tokens), "--dump", f"{tmp}/{v}-check.pt",
                                "--dtype", "float32", *shape]) for v in ("full", "chunked")}
        dlogp, dgrad = compare(f"{tmp}/full-check.pt", f"{tmp}/chunked-check.pt")
        print(f"check at {a.check_tokens} response tokens: max|Δ log-prob| = {dlogp:.2e}, max|Δ grad| = {dgrad:.2e}, "
              f"loss full {check['full']['loss']:.8f} chunked {check['chunked']['loss']:.8f} -> "
              f"{'same to 1e-5' if max(dlogp, dgrad) < 1e-5 else 'DIFFERENT'}")
        runs = {}
        for v in ("chunked", "full"):  # one at a time: the full path needs several GB at 8K tokens
            runs[v] = run_worker(["_logprob", v, "--tokens", str(a.tokens), "--dump", f"{tmp}/{v}.pt",
                                  "--dtype", a.dtype, *shape])
            r = runs[v]
            print(f"{v:8s} {a.tokens} response tokens, vocab {a.vocab}, {a.dtype} on {a.device}: {unit} "
                  f"{r['peak_rss_mb']:.0f} MB, {r['peak_above_mb']:.0f} MB above the model ({r['rss_before_mb']:.0f} MB)"
                  + (f"; OUT OF MEMORY ({r['oom']})" if "oom" in r else f"; loss {r['loss']:.8f}"))
        if any("oom" in r for r in runs.values()):
            print(f"at {a.tokens} tokens: no comparison (a variant ran out of memory); the chunked path's log-prob "
                  f"memory {runs['chunked']['peak_above_mb']:.0f} MB")
            return
        dlogp, dgrad = compare(f"{tmp}/full.pt", f"{tmp}/chunked.pt")
    print(f"at {a.tokens} tokens: max|Δ log-prob| = {dlogp:.2e}, max|Δ grad| = {dgrad:.2e}; log-prob memory full/chunked "
          f"= {runs['full']['peak_above_mb'] / max(runs['chunked']['peak_above_mb'], 1):.1f}x "
          f"({runs['full']['peak_above_mb']:.0f} vs {runs['chunked']['peak_above_mb']:.0f} MB)")


# (b) ZeRO-3 built partitioned

def zero3_worker(model_dir: str, partitioned: bool) -> None:
    """Build the model (ZeRO-3 under torchrun, or whole) and print this process's memory and local parameters."""
    import torch

    from mars2.train.update import deepspeed_config, init_distributed, load_causal_lm

    before = current_rss_mb()
    if partitioned:
        init_distributed()
        before = current_rss_mb()
        cfg = deepspeed_config({"zero_optimization": {"stage": 3}}, micro_batch=1, grad_accum=1, grad_clip=1.0)
        model = load_causal_lm(model_dir, "float32", "cpu", cfg)
        local = sum(p.ds_tensor.numel() for p in model.parameters())
        total = sum(p.ds_numel for p in model.parameters())
    else:
        model = load_causal_lm(model_dir, "float32", "cpu")
        for p in model.parameters():  # from_pretrained may leave weights on the file's pages: hold them, as training does
            p.data = p.data.clone()
        local = total = sum(p.numel() for p in model.parameters())
    rank = os.environ.get("RANK", "-")
    print(json.dumps({"rank": rank, "partitioned": partitioned, "local_numel": local, "total_numel": total,
                      "rss_before_mb": before, "peak_rss_mb": peak_rss_mb(), "held_above_mb": current_rss_mb() - before,
                      "peak_above_mb": peak_rss_mb() - before, "param_mb": local * 4 / 2**20}), flush=True)
    del model, torch


def bench_zero3(a) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        Qwen3ForCausalLM(qwen3_config(a.vocab, a.hidden, a.layers)).save_pretrained(tmp)
        env = {**os.environ, "PYTHONPATH": python_path(), "OMP_NUM_THREADS": "1"}
        env = {k: v for k, v in env.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        whole = subprocess.run([sys.executable, __file__, "_zero3", tmp, "--whole"], capture_output=True, text=True,
                               env=env, check=True)
        two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                              __file__, "_zero3", tmp], capture_output=True, text=True, env=env)
        if two.returncode != 0:
            raise RuntimeError(two.stderr[-3000:])
    rows = [json.loads(m) for out in (whole.stdout, two.stdout) for m in re.findall(r"\{[^{}]*\}", out)]
    base = rows[0]
    print(f"model: Qwen3 architecture, hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}: "
          f"{base['total_numel'] / 1e6:.1f} M parameters ({base['param_mb']:.0f} MB fp32)")
    for r in rows:
        who = "one process, whole model" if not r["partitioned"] else f"ZeRO-3 rank {r['rank']} of 2"
        print(f"{who:26s}: local parameters {r['local_numel'] / 1e6:7.1f} M ({r['local_numel'] / r['total_numel']:.0%}),"
              f" RSS above its start: {r['held_above_mb']:.0f} MB held after the build "
              f"({r['held_above_mb'] / max(base['held_above_mb'], 1):.2f}x the whole model's), peak "
              f"{r['peak_above_mb']:.0f} MB ({r['peak_above_mb'] / max(base['peak_above_mb'], 1):.2f}x)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_logprob":
        ap = argparse.ArgumentParser()
        ap.add_argument("variant")
        ap.add_argument("--tokens", type=int)
        ap.add_argument("--vocab", type=int)
        ap.add_argument("--hidden", type=int)
        ap.add_argument("--layers", type=int)
        ap.add_argument("--chunk", type=int)
        ap.add_argument("--dump")
        ap.add_argument("--device", default="cpu")
        ap.add_argument("--dtype", default="float32")
        w = ap.parse_args(sys.argv[2:])
        print(json.dumps(logprob_worker(w.variant, w.tokens, w.vocab, w.hidden, w.layers, w.chunk, w.dump, w.device,
                                        w.dtype)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_zero3":
        zero3_worker(sys.argv[2], partitioned="--whole" not in sys.argv)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=("logprobs", "zero3"))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--check-tokens", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=None, help="default 256 (logprobs), 1024 (zero3)")
    ap.add_argument("--layers", type=int, default=None, help="default 1 (logprobs), 4 (zero3)")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--device", default="cpu", help="logprobs: cpu, or cuda (GPU memory instead of RSS)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="logprobs: the model's dtype in the memory runs (the check runs in float32)")
    a = ap.parse_args()
    if a.part == "logprobs":
        a.hidden, a.layers = a.hidden or 256, a.layers or 1
        bench_logprobs(a)
    else:
        a.hidden, a.layers = a.hidden or 1024, a.layers or 4
        bench_zero3(a)


if __name__ == "__main__":
    main()
