"""Host memory of the policy update on CPU: (a) chunked vs full-logits log-probs, (b) ZeRO-3 partitions from construction.

    python bench/update_memory.py logprobs [--tokens 8192] [--vocab 151936] [--hidden 256] [--layers 1] [--chunk 1024]
                                           [--check-tokens 1024]
    python bench/update_memory.py zero3 [--hidden 1024] [--layers 4] [--vocab 151936]

(a) One tiny Qwen3-architecture model (real vocabulary) and one sequence of ``--tokens`` response tokens: log-probs +
    GSPO loss, forward and backward, once through the full-logits path (``token_logprobs``: [L, vocab] fp32 logits,
    a log_softmax copy and their gradients) and once through ``chunked_token_logprobs``. Each variant runs in its own
    subprocess and reports its peak RSS (``ru_maxrss``) above the RSS it had before the log-probs. Both variants then
    run at ``--check-tokens`` (small enough for the full path anywhere) and their masked log-probs, loss and gradient
    are compared (max |difference| must be < 1e-5); at the full length the losses are printed side by side.
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
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
ROOT = Path(__file__).resolve().parents[1]


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def qwen3_config(vocab: int, hidden: int, layers: int, tied: bool = False):
    from transformers import Qwen3Config

    heads = max(1, hidden // 64)
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
                       max_position_embeddings=65536, tie_word_embeddings=tied, rope_theta=1e6)


# (a) log-probs

def logprob_worker(variant: str, tokens: int, vocab: int, hidden: int, layers: int, chunk: int, dump: str) -> dict:
    """One variant's log-probs + loss, forward and backward, on one sequence (64 prompt + ``tokens`` response)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from mars2.rl.losses import gspo_loss
    from mars2.train.engine import Sample, chunked_token_logprobs, pack_batch, token_logprobs

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config(vocab, hidden, layers))
    g = torch.Generator().manual_seed(1)
    prompt, response = (torch.randint(0, vocab, (n,), generator=g).tolist() for n in (64, tokens))
    batch = pack_batch([Sample(prompt, response, [0.0] * tokens, 1.0)], pad_id=0)
    before = current_rss_mb()
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
    peak = peak_rss_mb()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.save({"logp": logp.detach()[batch["mask"] == 1], "grad": grad}, dump)
    return {"variant": variant, "tokens": tokens, "loss": float(out.loss), "rss_before_mb": before,
            "peak_rss_mb": peak, "peak_above_mb": peak - before}


def run_worker(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(a: str, b: str) -> tuple[float, float]:
    import torch

    x, y = torch.load(a), torch.load(b)
    return float((x["logp"] - y["logp"]).abs().max()), float((x["grad"] - y["grad"]).abs().max())


def bench_logprobs(a) -> None:
    shape = ["--vocab", str(a.vocab), "--hidden", str(a.hidden), "--layers", str(a.layers), "--chunk", str(a.chunk)]
    with tempfile.TemporaryDirectory() as tmp:
        check = {v: run_worker(["_logprob", v, "--tokens", str(a.check_tokens), "--dump", f"{tmp}/{v}-check.pt", *shape])
                 for v in ("full", "chunked")}
        dlogp, dgrad = compare(f"{tmp}/full-check.pt", f"{tmp}/chunked-check.pt")
        print(f"check at {a.check_tokens} response tokens: max|Δ log-prob| = {dlogp:.2e}, max|Δ grad| = {dgrad:.2e}, "
              f"loss full {check['full']['loss']:.8f} chunked {check['chunked']['loss']:.8f} -> "
              f"{'same to 1e-5' if max(dlogp, dgrad) < 1e-5 else 'DIFFERENT'}")
        runs = {}
        for v in ("chunked", "full"):  # one at a time: the full path needs several GB at 8K tokens
            runs[v] = run_worker(["_logprob", v, "--tokens", str(a.tokens), "--dump", f"{tmp}/{v}.pt", *shape])
            print(f"{v:8s} {a.tokens} response tokens, vocab {a.vocab}: peak RSS {runs[v]['peak_rss_mb']:.0f} MB, "
                  f"{runs[v]['peak_above_mb']:.0f} MB above the model ({runs[v]['rss_before_mb']:.0f} MB); "
                  f"loss {runs[v]['loss']:.8f}")
        dlogp, dgrad = compare(f"{tmp}/full.pt", f"{tmp}/chunked.pt")
    print(f"at {a.tokens} tokens: max|Δ log-prob| = {dlogp:.2e}, max|Δ grad| = {dgrad:.2e}; log-prob memory full/chunked "
          f"= {runs['full']['peak_above_mb'] / max(runs['chunked']['peak_above_mb'], 1):.1f}x "
          f"({runs['full']['peak_above_mb']:.0f} vs {runs['chunked']['peak_above_mb']:.0f} MB)")


# (b) ZeRO-3 built partitioned

def zero3_worker(model_dir: str, partitioned: bool) -> None:
    """Build the model (ZeRO-3 under torchrun, or whole) and print this process's memory and local parameters."""
    import torch

    from mars2.train.engine import deepspeed_config, init_distributed, load_causal_lm

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
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
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
        w = ap.parse_args(sys.argv[2:])
        print(json.dumps(logprob_worker(w.variant, w.tokens, w.vocab, w.hidden, w.layers, w.chunk, w.dump)))
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
    a = ap.parse_args()
    if a.part == "logprobs":
        a.hidden, a.layers = a.hidden or 256, a.layers or 1
        bench_logprobs(a)
    else:
        a.hidden, a.layers = a.hidden or 1024, a.layers or 4
        bench_zero3(a)


if __name__ == "__main__":
    main()
