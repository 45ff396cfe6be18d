"""Rollout throughput: the batched multi-agent tree search vs the raw backend on the same prompts.

    python bench/rollout.py [--problems 64] [--max-nodes 8] [--max-new-tokens 64] [--device cpu] [--repeats 3]

(a) ``run_tree_search`` builds one tree per problem with two tiny agents (Qwen2- and Llama-style),
    grading every node on public tests in the sandbox; (b) each agent's backend generates from exactly the
    prompts the search sent it, in one ``generate`` call. Prints generated tokens/s of both and the ratio
    (search / raw); the search pays for waves (one node per tree per wave), prompt building and grading (on a CPU
    backend in turn with generation, which shares the cores; see ``grading_overlaps_generation``).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def build_agents(device: str, problems):
    from mars2.backends.transformers_backend import TransformersBackend
    from mars2.models.tiny import build_tiny_model, train_tokenizer
    from mars2.search.tree_search import AgentRunner

    texts = [p.statement for p in problems]
    agents = {}
    for name, arch, seed in (("qwen_tiny", "qwen2", 0), ("llama_tiny", "llama", 1)):
        tok = train_tokenizer(texts * 4, 512)
        model = build_tiny_model(arch, vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                 intermediate_size=128, max_position_embeddings=2048, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id, seed=seed)
        agents[name] = AgentRunner(TransformersBackend(model, tok, device=device, batch_size=64), tok)
    return agents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--max-nodes", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--expansions-per-wave", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="alternate search and raw runs; report medians")
    args = ap.parse_args()

    import torch

    from mars2.backends import SamplingParams
    from mars2.data import problem_from_lcb_row, toy_benchmark
    from mars2.sandbox import GradeJob, grade_many
    from mars2.search.ab_mcts import ABMCTSA
    from mars2.search.tree_search import run_tree_search

    torch.set_num_threads(os.cpu_count() or 1)
    problems = [problem_from_lcb_row(r) for r in toy_benchmark(args.problems, 0)]
    agents = build_agents(args.device, problems)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)

    def grade(jobs):
        return grade_many([GradeJob(c, tuple(t), f) for c, t, f in jobs], workers=2, time_limit_s=6)

    for runner in agents.values():  # warm-up: first-call overheads out of both timings
        runner.backend.generate([runner.chat("warm up")], SamplingParams(max_new_tokens=4))

    def search_once():
        t0 = time.perf_counter()
        rows = run_tree_search(problems, agents, policy=ABMCTSA(), max_nodes=args.max_nodes, sampling=sampling,
                               grade=grade, seed=0, expansions_per_wave=args.expansions_per_wave)
        return rows, time.perf_counter() - t0

    def raw_once(rows):
        tokens, seconds = 0, 0.0
        for name, runner in agents.items():
            prompts = [r["prompt"] for r in rows if r["agent"] == name]
            t0 = time.perf_counter()
            out = runner.backend.generate(prompts, sampling)
            seconds += time.perf_counter() - t0
            tokens += sum(len(g[0].response_ids) for g in out)
        return tokens, seconds

    search_runs, raw_runs = [], []
    for _ in range(args.repeats):  # interleaved, so background load hits both sides alike
        rows, s_sec = search_once()
        search_runs.append((sum(r["response_len"] for r in rows), s_sec))
        raw_runs.append(raw_once(rows))
    search_tokens, search_s = sorted(search_runs, key=lambda x: x[0] / x[1])[len(search_runs) // 2]
    raw_tokens, raw_s = sorted(raw_runs, key=lambda x: x[0] / x[1])[len(raw_runs) // 2]
    search_tps, raw_tps = search_tokens / search_s, raw_tokens / raw_s
    print(f"problems={args.problems} max_nodes={args.max_nodes} nodes={len(rows)} device={args.device} "
          f"threads={torch.get_num_threads()} expansions_per_wave={args.expansions_per_wave} repeats={args.repeats} (medians)")
    print(f"tree search : {search_tokens:7d} tokens in {search_s:6.2f} s = {search_tps:8.1f} tok/s (incl. public-test grading)")
    print(f"raw backend : {raw_tokens:7d} tokens in {raw_s:6.2f} s = {raw_tps:8.1f} tok/s (one generate call per agent)")
    print(f"ratio search/raw = {search_tps / raw_tps:.2f}")
    starts = sum(getattr(r.backend, "starts", 1) for r in {id(r.backend): r for r in agents.values()}.values())
    print(f"engine starts: {starts} (one backend per agent, kept for every search and raw run)")


if __name__ == "__main__":
    main()
