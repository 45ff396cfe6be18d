"""Where a transformers engine's decode step goes: launching work on the host, or running it on the device.

    python bench/engine_step.py [--model Qwen3-1.7B] [--device cuda:0] [--dtype bfloat16] [--rows 64]
                                [--prompt-tokens 512] [--new-tokens 32] [--top 12]

The engine is the :class:`~mars2.backends.continuous.ContinuousBatcher` an engine process runs (in-place KV cache,
per-request seeds, the sampler), on a random-weight model: with ``--model``, a shipped config (real vocabulary),
else a small Qwen3-architecture one. ``--rows`` requests of ``--prompt-tokens`` random tokens are admitted together
and each decodes exactly ``--new-tokens`` tokens (no stop token), so every decode step carries ``--rows`` rows. A
first pass warms up, the second is timed.

A third pass runs under ``torch.profiler``. Prints the wall time per forward pass (unprofiled); the decode thread's
CPU time per decode step; on a GPU, the device's busy time (Σ of kernel and copy time, profiled pass) as a share of
the wall, which says whether a step waits on the host (a low share) or on the device; and the ops with the most
self time on the host and on the device. The rollout engine's decode step took 36–42 ms on an H100 and 93–101 ms
on an H200 (Qwen3-1.7B, about 60 rows; docs/gpu.md): this bench says where that goes.
"""

from __future__ import annotations

import argparse
import contextlib
import time

from common import qwen3_config, shipped_config


def build_model(model: str, device: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = shipped_config(model) if model else qwen3_config(vocab=4096, hidden=256, layers=4)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype)).eval()


def every_thread() -> dict:
    """The profiler option that records the ops of every thread (the engine decodes on its own thread), where this
    torch has it; without it only device activity (recorded process-wide) and this thread's ops are seen."""
    from torch._C._profiler import _ExperimentalConfig

    try:
        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except TypeError:
        print("this torch's profiler records only the calling thread: the host table lacks the decode thread")
        return {}


def one_pass(batcher, rows: int, prompt_tokens: int, new_tokens: int, vocab: int, seed: int) -> float:
    """``rows`` requests admitted together, each ``new_tokens`` long → wall seconds until all are answered."""
    import random

    rng = random.Random(seed)
    requests = [([rng.randrange(1, vocab) for _ in range(prompt_tokens)], seed * 1000 + i) for i in range(rows)]
    t0 = time.perf_counter()
    futures = batcher.submit_many(requests, temperature=1.0, top_p=1.0, max_new_tokens=new_tokens)
    lengths = {len(f.result().response_ids) for f in futures}
    assert lengths == {new_tokens}, f"a request ended early: lengths {lengths}"
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="a shipped config (e.g. Qwen3-1.7B), random weights")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--top", type=int, default=12, help="ops listed per table")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from mars2.backends.continuous import ContinuousBatcher

    cuda = args.device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    model = build_model(args.model, args.device, dtype)
    vocab = model.config.vocab_size
    batcher = ContinuousBatcher(model, pad_id=0, stop_ids=[], device=args.device, max_batch=args.rows)

    def counted(seed: int, **profiler) -> tuple[float, int, int, float, object]:
        """One pass → (wall s, decode steps, prefills, decode thread CPU s, the profiler or None)."""
        before = batcher.steps, batcher.prefills, batcher.decode_s
        with profile(**profiler) if profiler else contextlib.nullcontext() as prof:
            wall = one_pass(batcher, args.rows, args.prompt_tokens, args.new_tokens, vocab, seed)
        time.sleep(0.3)  # the decode thread adds a step's CPU time after it has answered the step's requests
        return (wall, batcher.steps - before[0], batcher.prefills - before[1], batcher.decode_s - before[2], prof)

    try:
        one_pass(batcher, args.rows, args.prompt_tokens, args.new_tokens, vocab, seed=1)  # warm-up
        time.sleep(0.3)
        wall, steps, prefills, decode_s, _ = counted(2)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        wall_profiled, *_, prof = counted(3, activities=activities, **every_thread())
    finally:
        batcher.close()
    events = prof.key_averages()
    passes = steps + prefills
    print(f"model={args.model or 'small qwen3'} layers={model.config.num_hidden_layers} vocab={vocab} "
          f"device={args.device} dtype={dtype} rows={args.rows} prompt_tokens={args.prompt_tokens} "
          f"new_tokens={args.new_tokens}")
    print(f"forward passes: {steps} decode steps + {prefills} prefill(s) in {wall * 1e3:.0f} ms: "
          f"{wall / passes * 1e3:.2f} ms per pass; decode thread CPU {decode_s / max(steps, 1) * 1e3:.2f} ms per "
          f"decode step (on a GPU this includes launching kernels and waiting for them)")
    print(f"profiled pass: {wall_profiled * 1e3:.0f} ms; torch ops' own host time "
          f"{events.self_cpu_time_total / 1e3 / passes:.2f} ms per pass (summed over torch's threads)")
    if cuda:
        from torch.autograd import DeviceType

        # the kernels' own rows: the CPU op that launched a kernel carries its time too
        busy = sum(e.self_device_time_total for e in events
                   if e.device_type == DeviceType.CUDA and not e.is_user_annotation) / 1e6
        print(f"device busy {busy * 1e3:.0f} ms of the profiled pass's {wall_profiled * 1e3:.0f} ms "
              f"({busy / wall_profiled:.0%}; of the unprofiled pass's wall {busy / wall:.0%}): "
              + ("the device mostly waits on the host" if busy / wall < 0.5 else "the device is most of the step"))
        print(events.table(sort_by="self_device_time_total", row_limit=args.top))
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))

if __name__ == "__main__":
    main()
