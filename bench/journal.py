"""What resuming costs a rollout, on the same two engines, interleaved (each repeat starts with the other side,
against drift): (a) the search with every tree at once and no journal; (b) the search as the rollout stage runs it
(``resumable_search``: at most ``--trees-in-flight`` trees at once, 0: all, each finished tree written to a stage
journal).

    python bench/journal.py [--problems 128] [--max-nodes 8] [--max-new-tokens 64] [--batch-size 32]
                            [--trees-in-flight 64] [--repeats 3]

Prints each run's tokens/s and the ratio of the medians, journaled / plain (1.00 is free; the issue's bound is a 3%
slowdown), the journal's write time per tree, and whether both built the same trees.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rollout import build_agents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--max-nodes", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--trees-in-flight", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import os

    import pandas as pd
    import torch

    from mars2.backends import SamplingParams
    from mars2.config import GradingConfig
    from mars2.data import problem_from_lcb_row, toy_benchmark
    from mars2.journal import Journal
    from mars2.sandbox import GradeJob, grade_many
    from mars2.search.ab_mcts import ABMCTSA
    from mars2.config import SearchConfig
    from mars2.search.run import resumable_search
    from mars2.search.scheduler import run_tree_search

    threads = max(1, (os.cpu_count() or 1) // 2)
    torch.set_num_threads(threads)
    problems = [problem_from_lcb_row(r) for r in toy_benchmark(args.problems, 0)]
    agents = build_agents("cpu", problems, batch_size=args.batch_size, engine="process", threads=threads,
                          model="", dtype="float32", backend="transformers", heads=4)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)

    def grade(jobs):
        return grade_many([GradeJob(c, tuple(t), f) for c, t, f in jobs], grading=GradingConfig(workers=2))

    for runner in agents.values():
        runner.backend.generate([runner.chat("warm up")], SamplingParams(max_new_tokens=4))

    writes: list[float] = []

    def once(journaled: bool) -> tuple[float, list]:
        with tempfile.TemporaryDirectory() as tmp:
            journal = Journal(Path(tmp) / "rollout.journal", "bench")

            t0 = time.perf_counter()
            if journaled:  # what the rollout stage runs
                search = SearchConfig(max_nodes=args.max_nodes, trees_in_flight=args.trees_in_flight)
                table = resumable_search(problems, agents, search, sampling, grade, journal, "trees")
                took = time.perf_counter() - t0
                rows = table.to_dict(orient="records")
            else:
                rows = run_tree_search(problems, agents, policy=ABMCTSA(), max_nodes=args.max_nodes,
                                       sampling=sampling, grade=grade, seed=0)
                took = time.perf_counter() - t0
            if journaled:
                t1 = time.perf_counter()
                for pid, tree in pd.DataFrame(rows).groupby("problem_id", sort=False):
                    journal.write("timing", pid, tree)
                writes.append((time.perf_counter() - t1) / max(1, len(problems)))
        return sum(r["response_len"] for r in rows) / took, [tuple(r["response_ids"]) for r in rows]

    plain, journaled, same = [], [], True
    sides = [(plain, lambda: once(False)), (journaled, lambda: once(True))]
    for i in range(args.repeats):  # interleaved, and each repeat starts with the next side: drift hits all alike
        tokens = []
        for k in range(len(sides)):
            out, side = sides[(i + k) % len(sides)]
            tps, made = side()
            out.append(tps)
            tokens.append(made)
        same &= all(t == tokens[0] for t in tokens)
        print(f"run {i + 1}: plain {plain[-1]:.1f} tok/s, journaled (trees_in_flight={args.trees_in_flight}) "
              f"{journaled[-1]:.1f} tok/s ({journaled[-1] / plain[-1]:.3f})", flush=True)
    print(f"problems={args.problems} max_nodes={args.max_nodes} max_new_tokens={args.max_new_tokens} "
          f"batch_size={args.batch_size} repeats={args.repeats}")
    print(f"journaled/plain, ratio of medians: {statistics.median(journaled) / statistics.median(plain):.3f}")
    print(f"journal write per tree (encode + write, on the stage's writer thread): "
          f"{statistics.median(writes) * 1e3:.1f} ms")
    print(f"same tokens in both: {same}")
    for runner in agents.values():
        close = getattr(runner.backend, "close", None)
        if close is not None:
            close()


if __name__ == "__main__":
    main()
