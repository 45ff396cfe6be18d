"""Decode-step cost of the engine's KV cache: written in place (``SlackLayer``) vs transformers' ``DynamicLayer``.

    python bench/kv_cache.py [--rows 32] [--widths 256,1024,4096] [--steps 32] [--hidden 512] [--layers 2]
                             [--model Qwen3-1.7B] [--device cpu] [--dtype float32] [--repeats 3]

``DynamicLayer.update`` concatenates each step's keys and values to the cache, i.e. copies the whole cache
([B, H_kv, L, D] per layer, twice) every decode step: O(B·L) per step, O(B·L²) per response. The continuous
batcher's ``SlackLayer`` writes the step into a spare column of a preallocated buffer and attends over a view of it.
For each cache width L the bench prefills ``--rows`` random prompts of L tokens and times ``--steps`` decode steps
with both caches (from one prefill; alternating, medians of ``--repeats``), checking that both give the same logits. Prints ms per
step and the ratio dynamic / slack. The model is a random-weight Qwen3-architecture model (``--hidden``,
``--layers``) or, with ``--model``, a shipped config with ``--layers`` of its layers.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import qwen3_config, shipped_config


def build_model(args):
    import torch
    from transformers import AutoModelForCausalLM

    if args.model:
        cfg = shipped_config(args.model, num_hidden_layers=args.layers)
    else:
        cfg = qwen3_config(vocab=4096, hidden=args.hidden, layers=args.layers)
    torch.manual_seed(0)
    with torch.device(args.device):
        return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, args.dtype)).eval()


def prefill(model, prompt):
    """The prompt's [B, L] forward pass → (its DynamicCache, the first greedy tokens [B])."""
    import torch

    with torch.no_grad():
        out = model(input_ids=prompt, attention_mask=torch.ones_like(prompt), use_cache=True, logits_to_keep=1)
    return out.past_key_values, out.logits[:, -1].argmax(-1)


def decode(model, prefilled, steps: int, slack: bool, sync):
    """``steps`` greedy decode steps after a prefill (its cache copied, so each run starts from the same one) →
    (seconds per step, logits [steps, B, V])."""
    import copy

    import torch

    from mars2.backends.continuous import join_rows, slack_cache

    cache, last = copy.deepcopy(prefilled[0]), prefilled[1]
    rows, width = last.shape[0], cache.get_seq_length()
    if slack:
        dynamic, cache = cache, slack_cache(cache, rows)
        join_rows(cache, [dynamic], width)
    mask = torch.ones((rows, width), dtype=torch.long, device=last.device)
    pos, logits = torch.full((rows,), width, device=last.device), []
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=-1)
        with torch.no_grad():
            out = model(input_ids=last[:, None], attention_mask=mask, position_ids=pos[:, None],
                        past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        last, pos = out.logits[:, -1].argmax(-1), pos + 1
    sync()
    return (time.perf_counter() - t0) / steps, torch.stack(logits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--widths", default="256,1024,4096", help="cache widths (prompt tokens) to measure at")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--model", default="", help="a shipped config (e.g. Qwen3-1.7B), --layers of its layers")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    model = build_model(args)
    cfg = model.config
    print(f"model={args.model or 'qwen3-architecture'} hidden={cfg.hidden_size} layers={cfg.num_hidden_layers} "
          f"kv_heads={cfg.num_key_value_heads} head_dim={getattr(cfg, 'head_dim', None)} rows={args.rows} "
          f"steps={args.steps} device={args.device} dtype={args.dtype} repeats={args.repeats} (medians)")
    print(f"{'width':>6} {'dynamic ms/step':>16} {'slack ms/step':>14} {'dynamic/slack':>14} {'max |Δ logit|':>14}")
    for width in (int(w) for w in args.widths.split(",")):
        g = torch.Generator().manual_seed(width)
        prompt = torch.randint(0, cfg.vocab_size, (args.rows, width), generator=g).to(args.device)
        prefilled, times = prefill(model, prompt), {False: [], True: []}
        for _ in range(args.repeats):
            for slack in (False, True):
                seconds, logits = decode(model, prefilled, args.steps, slack, sync)
                times[slack].append(seconds)
                if slack:
                    diff = float((logits.float() - reference.float()).abs().max())
                else:
                    reference = logits
        dynamic, slack = statistics.median(times[False]), statistics.median(times[True])
        print(f"{width:6d} {dynamic * 1e3:16.2f} {slack * 1e3:14.2f} {dynamic / slack:14.2f} {diff:14.2e}", flush=True)


if __name__ == "__main__":
    main()
