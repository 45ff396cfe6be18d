"""Rollout throughput: the asynchronous multi-agent tree search vs the raw engines on the same requests.

    python bench/rollout.py [--problems 128] [--max-nodes 8] [--max-new-tokens 64] [--batch-size 64]
                            [--engine process|inprocess] [--expansions-per-wave 1] [--device cpu] [--repeats 3]
                            [--model Qwen3-1.7B] [--dtype bfloat16] [--threads N] [--skip-wave]
                            [--backend transformers|vllm|both] [--concurrency]

Two tiny agents (Qwen2- and Llama-style; with ``--model``, two random-weight models of that shipped architecture,
e.g. ``Qwen3-1.7B`` from ``mars2/plan/model_configs`` with its real vocabulary), each behind its own continuously
batched engine: a persistent engine process (``--engine process``, what the flows use) or an in-process backend. (a)
``run_tree_search`` builds one tree per problem, grading every node on public tests in the sandbox; (b) the same
engines get every request the search sent (same prompts, same seeds, hence the same tokens) all at once: the
engines' raw throughput. Prints generated tokens/s of both, their ratio (search / raw: the ratio of the medians, and
each run's own ratio of its search and raw sides, which ran one after the other and so suffer less from a machine
whose speed drifts, in run order with their median), and engine starts; (c) the same search with the wave schedule
(the engines without ``submit``: one generate call per agent per wave, agents in turn), for the ratio of the
asynchronous search to it (``--skip-wave`` leaves it out: on a GPU it takes as long as (a) and (b) together).

``--backend vllm`` serves the agents from the real vLLM (its CPU build on a CPU: ``python -m mars2.backends.vllm_env``
makes its environment) through the same engine process; ``--backend both`` measures our transformers engine and
vLLM one after the other in the same invocation, on the same models (two heads of 32 dimensions: vLLM's CPU attention
refuses 16), and prints both ratios side by side.

Sequential AB-MCTS (k = 1) keeps at most one request per tree in flight, so an engine's batch can only be as full
as (trees asking it) allow: with two agents, ``--problems`` = 2 × ``--batch-size`` (the defaults) gives each engine
about as many trees as rows, and since a tree being graded or prompted has none in flight, rows stay empty whatever
the scheduler does (on 2 CPU cores: about 50 rows per step against the raw run's 57, docs/engines.md); at
8 × ``--batch-size`` (``--problems 512``) the search kept the engines nearly as full (58 rows per step against
61). Each side also prints the share of the cache columns its decode steps read that are padding (the rows of a
batch share one window as wide as the longest row).

``--concurrency`` runs the search once more counting each engine's requests in flight, then the raw side with at most
their time-weighted mean in flight per engine: how much of the gap to raw is the search's concurrency (trees in
flight per engine, against raw's every request at once) rather than its own overheads.

With engine processes it also prints the CPU seconds the engines and this process used per search and per raw
run: on a machine whose cores the engines fill, the search's own work (AB-MCTS, prompts, grading calls, IPC) and any
extra engine work per token come straight off the ratio. Each engine's decode thread also reports its CPU seconds in
prefills and in decode steps: with one torch thread per engine (the default on 2 cores) that is all of its compute;
torch's worker threads, used with more, are not in it, and on a GPU it is the host's share only.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import threading
import time
from dataclasses import replace

from common import shipped_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def shipped_model(name: str, tok, seed: int, device: str, dtype: str):
    """A random-weight causal LM of the shipped config ``name`` (:func:`common.shipped_config`), real vocabulary
    kept; its pad and end tokens are the local tokenizer's, whose ids are the vocabulary's first ones (the rest decode
    to nothing)."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = shipped_config(name, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))


def build_agents(device: str, problems, *, batch_size: int = 64, engine: str = "inprocess", threads: int = 0,
                 model: str = "", dtype: str = "float32", backend: str = "transformers", heads: int = 4):
    """Two agents: tiny Qwen2- and Llama-style models (``heads`` attention heads over 64 dimensions), or two
    random-weight ``model``s (see :func:`shipped_model`); ``engine="process"`` serves each from its own engine
    process (models saved to a temporary folder first), of ``backend`` (transformers, or vLLM)."""
    from dataclasses import asdict

    from mars2.backends.engine import EngineClient, EngineSpec
    from mars2.backends.vllm_backend import VLLMEngineArgs
    from mars2.backends.vllm_env import find_python
    from mars2.backends.transformers_backend import TransformersBackend
    from mars2.models.tiny import build_tiny_model, train_tokenizer
    from mars2.search.scheduler import AgentRunner

    texts = [p.statement for p in problems]
    folder = tempfile.mkdtemp(prefix="mars2-bench-")
    agents = {}
    stem = re.sub(r"\W", "_", os.path.basename(os.path.normpath(model)).lower())
    roster = (((f"{stem}_{i}", None, i) for i in (0, 1)) if model else
              (("qwen_tiny", "qwen2", 0), ("llama_tiny", "llama", 1)))
    for name, arch, seed in roster:
        tok = train_tokenizer(texts * 4, 512)
        if model:
            lm = shipped_model(model, tok, seed, device, dtype)
        else:
            lm = build_tiny_model(arch, vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=heads,
                                  num_kv_heads=max(1, heads // 2),
                                  intermediate_size=128, max_position_embeddings=2048, pad_token_id=tok.pad_token_id,
                                  eos_token_id=tok.eos_token_id, seed=seed)
        if engine == "process":
            path = os.path.join(folder, name)
            lm.save_pretrained(path)
            tok.save_pretrained(path)
            del lm
            if backend == "vllm":
                engine_args = VLLMEngineArgs(model=path, max_model_len=2048, enforce_eager=not device.startswith("cuda"),
                                             dtype=dtype, gpu_memory_utilization=0.4)
                served = EngineClient(EngineSpec(name, path, path, version="bench", device=device, dtype=dtype,
                                                 threads=threads, kind="vllm", python=find_python() or "python",
                                                 vllm=asdict(engine_args), stop_token_ids=(tok.eos_token_id,)))
            else:
                served = EngineClient(EngineSpec(name, path, path, version="bench", device=device, dtype=dtype,
                                                 batch_size=batch_size, threads=threads))
        else:
            served = TransformersBackend(lm, tok, device=device, batch_size=batch_size)
        agents[name] = AgentRunner(served, tok)
    return agents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--max-nodes", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64, help="rows each engine decodes together at most")
    ap.add_argument("--engine", choices=("process", "inprocess"), default="process")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--expansions-per-wave", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="alternate search and raw runs; report medians")
    ap.add_argument("--model", default="", help="a shipped config (e.g. Qwen3-1.7B) for both agents, random weights")
    ap.add_argument("--dtype", default=None, help="engine dtype; default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per engine; default half the cores")
    ap.add_argument("--skip-wave", action="store_true", help="leave out the wave-schedule search (c)")
    ap.add_argument("--backend", choices=("transformers", "vllm", "both"), default="transformers",
                    help="the engines: ours (transformers), vLLM, or both in turn on the same models")
    ap.add_argument("--concurrency", action="store_true",
                    help="also run the raw side with at most as many requests in flight per engine as the search "
                         "kept on average (where the search's gap to raw goes)")
    args = ap.parse_args()
    backends = ["transformers", "vllm"] if args.backend == "both" else [args.backend]
    if args.backend != "transformers" and args.engine != "process":
        ap.error("--backend vllm runs vLLM in its own engine process: use --engine process")
    ratios = {b: run(args, b, heads=2 if args.backend != "transformers" else 4) for b in backends}
    if len(ratios) > 1:
        print("search/raw, each run's own, median: " + ", ".join(f"{b} {r:.2f}" for b, r in ratios.items()))


def run(args, backend: str, *, heads: int) -> float:
    """One backend's measurement (printed); returns the median of each run's own search/raw."""

    import torch

    from mars2.backends import SamplingParams
    from mars2.backends.base import request_seed
    from mars2.config import GradingConfig
    from mars2.data import problem_from_lcb_row, toy_benchmark
    from mars2.sandbox import GradeJob, grade_many
    from mars2.search.ab_mcts import ABMCTSA
    from mars2.search.scheduler import AgentRunner, run_tree_search

    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores // 2)  # two engines side by side
    torch.set_num_threads(threads)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    problems = [problem_from_lcb_row(r) for r in toy_benchmark(args.problems, 0)]
    agents = build_agents(args.device, problems, batch_size=args.batch_size, engine=args.engine, threads=threads,
                          model=args.model, dtype=dtype, backend=backend, heads=heads)
    print(f"--- backend {backend}", flush=True)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)

    def grade(jobs):
        return grade_many([GradeJob(c, tuple(t), f) for c, t, f in jobs], grading=GradingConfig(workers=2))

    for runner in agents.values():  # warm-up: first-call overheads out of both timings
        runner.backend.generate([runner.chat("warm up")], SamplingParams(max_new_tokens=4))

    def search_once():
        t0 = time.perf_counter()
        rows = run_tree_search(problems, agents, policy=ABMCTSA(), max_nodes=args.max_nodes, sampling=sampling,
                               grade=grade, seed=0, expansions_per_wave=args.expansions_per_wave)
        return rows, time.perf_counter() - t0

    class OneCallPerWave:
        """The same engine without ``submit``: the search falls back to one generate call per agent per wave."""

        def __init__(self, backend):
            self.backend = backend

        def generate(self, prompts, params, seeds=None):
            return self.backend.generate(prompts, params, seeds)

    waves = {n: AgentRunner(OneCallPerWave(a.backend), a.tokenizer) for n, a in agents.items()}

    def waves_once():
        t0 = time.perf_counter()
        rows = run_tree_search(problems, waves, policy=ABMCTSA(), max_nodes=args.max_nodes, sampling=sampling,
                               grade=grade, seed=0, expansions_per_wave=args.expansions_per_wave)
        return sum(r["response_len"] for r in rows), time.perf_counter() - t0

    def raw_once(rows):
        """Every request of the search known up front: all agents' engines get all their requests at once."""
        t0 = time.perf_counter()
        futures = [agents[r["agent"]].backend.submit(r["prompt"], sampling,
                                                     request_seed(sampling.seed, r["problem_id"], r["node_id"]))
                   for r in sorted(rows, key=lambda r: len(r["prompt"]))]
        tokens = sum(len(f.result().response_ids) for f in futures)
        return tokens, time.perf_counter() - t0

    class InFlight:
        """An engine's requests in flight over time: ``mean()`` is their time-weighted mean since the last reset."""

        def __init__(self, backend):
            self.backend, self.lock = backend, threading.Lock()
            self.reset()

        def reset(self):
            self.n, self.area, self.t0 = 0, 0.0, time.perf_counter()
            self.t = self.t0

        def _count(self, d):
            with self.lock:
                now = time.perf_counter()
                self.area += self.n * (now - self.t)
                self.n, self.t = self.n + d, now

        def mean(self):
            self._count(0)
            return self.area / max(self.t - self.t0, 1e-9)

        def submit(self, prompt, params, seed):
            self._count(+1)
            future = self.backend.submit(prompt, params, seed)
            future.add_done_callback(lambda _: self._count(-1))
            return future

        def generate(self, prompts, params, seeds=None):
            return self.backend.generate(prompts, params, seeds)

    counted = {n: replace(a, backend=InFlight(a.backend)) for n, a in agents.items()}

    def search_counted():
        """The search with every engine's requests in flight counted; returns the mean per engine."""
        for a in counted.values():
            a.backend.reset()
        run_tree_search(problems, counted, policy=ABMCTSA(), max_nodes=args.max_nodes, sampling=sampling,
                        grade=grade, seed=0, expansions_per_wave=args.expansions_per_wave)
        return sum(a.backend.mean() for a in counted.values()) / len(counted)

    def raw_capped(rows, cap):
        """The raw side with at most ``cap`` requests in flight per engine (a new one as soon as one finishes)."""
        slots = {n: threading.BoundedSemaphore(cap) for n in agents}
        t0 = time.perf_counter()
        futures = []
        for r in sorted(rows, key=lambda r: len(r["prompt"])):
            slots[r["agent"]].acquire()
            f = agents[r["agent"]].backend.submit(r["prompt"], sampling,
                                                 request_seed(sampling.seed, r["problem_id"], r["node_id"]))
            f.add_done_callback(lambda _, s=slots[r["agent"]]: s.release())
            futures.append(f)
        tokens = sum(len(f.result().response_ids) for f in futures)
        return tokens, time.perf_counter() - t0

    def counters():
        """Σ over engines of (decode steps, rows stepped, requests waiting at a step, prefills, prefilled tokens,
        cache columns and context tokens read by decode steps, decode thread CPU seconds in prefills and in decode
        steps, engine process CPU seconds), and this process's CPU seconds (the search's host work: AB-MCTS, prompts,
        grading calls, IPC)."""
        out = []
        keys = ("steps", "rows_stepped", "waiting_stepped", "prefills", "prefill_tokens", "columns_stepped",
                "context_stepped", "prefill_s", "decode_s", "cpu_s")
        for runner in agents.values():
            b = runner.backend
            c = b.health() if hasattr(b, "health") else vars(b.batcher)
            out.append(tuple(c.get(k, 0) for k in keys))  # vLLM's engine reports no batcher counters
        return [*(sum(x) for x in zip(*out, strict=True)), time.process_time()]

    search_runs, raw_runs, wave_runs, batching = [], [], [], {"search": [0] * 11, "raw": [0] * 11}
    try:
        for _ in range(args.repeats):  # interleaved, so background load hits both sides alike
            c0 = counters()
            rows, s_sec = search_once()
            c1 = counters()
            search_runs.append((sum(r["response_len"] for r in rows), s_sec))
            print(f"run {len(search_runs)}: search {search_runs[-1][0] / s_sec:.1f} tok/s ({s_sec:.1f} s)", flush=True)
            raw_runs.append(raw_once(rows))
            c2 = counters()
            for side, (a, b) in (("search", (c0, c1)), ("raw", (c1, c2))):
                batching[side] = [t + y - x for t, x, y in zip(batching[side], a, b, strict=True)]
            if not args.skip_wave:
                wave_runs.append(waves_once())
            (st, ss), (rt, rs) = search_runs[-1], raw_runs[-1]
            wave = f", wave search {wave_runs[-1][0] / wave_runs[-1][1]:.1f} tok/s" if wave_runs else ""
            print(f"run {len(search_runs)}: search {st / ss:.1f} tok/s, raw {rt / rs:.1f} tok/s{wave} "
                  f"(search/raw {st / ss / (rt / rs):.2f})", flush=True)
        if args.concurrency:
            mean_in_flight = search_counted()
            cap = max(1, round(mean_in_flight))
            capped_tokens, capped_s = raw_capped(rows, cap)
            full_tokens, full_s = raw_runs[-1]
            print(f"concurrency: the search kept {mean_in_flight:.1f} requests in flight per engine on average; "
                  f"raw with at most {cap} in flight per engine {capped_tokens / capped_s:.1f} tok/s = "
                  f"{capped_tokens / capped_s / (full_tokens / full_s):.2f} of raw with every request at once "
                  f"(search/that: {search_runs[-1][0] / search_runs[-1][1] / (capped_tokens / capped_s):.2f})",
                  flush=True)
    finally:
        starts = sum(getattr(r.backend, "starts", 1) for r in agents.values())
        for runner in agents.values():
            getattr(runner.backend, "close", lambda: None)()
    search_tokens, search_s = sorted(search_runs, key=lambda x: x[0] / x[1])[len(search_runs) // 2]
    raw_tokens, raw_s = sorted(raw_runs, key=lambda x: x[0] / x[1])[len(raw_runs) // 2]
    search_tps, raw_tps = search_tokens / search_s, raw_tokens / raw_s
    print(f"backend={backend} model={args.model or f'tiny qwen2 + tiny llama, {heads} heads'} dtype={dtype} "
          f"problems={args.problems} "
          f"max_nodes={args.max_nodes} nodes={len(rows)} device={args.device} "
          f"engine={args.engine} batch_size={args.batch_size} threads/engine={threads} "
          f"expansions_per_wave={args.expansions_per_wave} repeats={args.repeats} (medians)")
    print(f"tree search : {search_tokens:7d} tokens in {search_s:6.2f} s = {search_tps:8.1f} tok/s (incl. public-test grading)")
    print(f"raw engines : {raw_tokens:7d} tokens in {raw_s:6.2f} s = {raw_tps:8.1f} tok/s (every request at once)")
    if wave_runs:
        wave_tokens, wave_s = sorted(wave_runs, key=lambda x: x[0] / x[1])[len(wave_runs) // 2]
        print(f"wave search : {wave_tokens:7d} tokens in {wave_s:6.2f} s = {wave_tokens / wave_s:8.1f} tok/s (one "
              f"generate call per agent per wave, the same engines)")
    print(f"ratio search/raw = {search_tps / raw_tps:.2f}" + (
        f"   ratio search/wave search = {search_tps * wave_s / wave_tokens:.2f}" if wave_runs else ""))
    # a machine's speed can drift within one invocation; a run's own search and raw sides are adjacent in time
    pairs = [(st / ss) / (rt / rs) for (st, ss), (rt, rs) in zip(search_runs, raw_runs, strict=True)]
    print(f"search/raw of each run: {' '.join(f'{r:.2f}' for r in pairs)} "
          f"(median {sorted(pairs)[len(pairs) // 2]:.2f})")
    for side, (steps, rows_stepped, waiting_stepped, prefills, prefill_tokens, columns, context, prefill_s, decode_s,
               _, _) in batching.items():
        if not steps:  # vLLM's engine counts none of these
            continue
        print(f"{side:6s}: mean rows per decode step {rows_stepped / max(steps, 1):5.1f} of {args.batch_size} "
              f"(requests at the engine {(rows_stepped + waiting_stepped) / max(steps, 1):6.1f}), "
              f"{(steps + prefills) / args.repeats:6.0f} forward passes per run ({prefills / args.repeats:.0f} prefills); "
              f"decode thread's CPU per run: prefills {prefill_s / args.repeats:5.2f} core-s "
              f"({prefill_tokens / args.repeats / max(prefills / args.repeats, 1):.0f} tokens each, padding included), "
              f"decode steps {decode_s / args.repeats:5.2f} core-s ({decode_s / max(steps, 1) * 1e3:.2f} ms each, "
              f"{1 - context / max(columns, 1):.0%} of the cache columns they read padding)")
    if args.engine == "process" and batching["raw"][-2] > 0:  # where the cores went: the engines' work, the search's
        (*_, engines_search, host_search), (*_, engines_raw, host_raw) = batching["search"], batching["raw"]
        print(f"CPU per run: engines {engines_search / args.repeats:5.2f} core-s in the search, "
              f"{engines_raw / args.repeats:5.2f} in the raw run (the same tokens; {engines_search / engines_raw:.2f}x); "
              f"this process {host_search / args.repeats:5.2f} and {host_raw / args.repeats:5.2f} core-s "
              f"({cores} cores, {threads} thread(s) per engine)")
    print(f"engine starts: {starts} (one engine per agent, kept for every search and raw run)")
    return sorted(pairs)[len(pairs) // 2]


if __name__ == "__main__":
    main()
