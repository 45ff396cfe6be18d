"""Batched multi-tree search with real tiny models and the real sandbox grader."""

import threading
import time

import pandas as pd
import pytest

from mars2.config import GradingConfig
from mars2.backends import SamplingParams
from mars2.backends.transformers_backend import load_transformers_backend
from mars2.data import problem_from_lcb_row, toy_benchmark
from mars2.sandbox import GradeJob, grade_many
from mars2.search.ab_mcts import ABMCTSA
from mars2.search.prompts import refine_prompt, result_summary
from mars2.search.sampling import run_independent_sampling
from mars2.search.scheduler import NODE_COLUMNS, AgentRunner, run_tree_search
from mars2.search.tree_stats import plot_trees, tree_stats


class CountingBackend:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, params, seeds=None):
        self.calls.append(len(prompts))
        return self.inner.generate(prompts, params, seeds)


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    problems = [problem_from_lcb_row(r) for r in toy_benchmark(3, 0)]
    seen_tests = []

    def grade(jobs):
        seen_tests.extend(t for _, t, _ in jobs)
        return grade_many([GradeJob(c, tuple(t), f) for c, t, f in jobs],
                          grading=GradingConfig(workers=2, time_limit_s=2))

    agents = {"a": AgentRunner(CountingBackend(backend), tok, "role A"),
              "b": AgentRunner(CountingBackend(backend), tok, "role B")}
    rows = run_tree_search(problems, agents, policy=ABMCTSA(), max_nodes=4,
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=1), grade=grade, seed=0)
    return problems, agents, rows, seen_tests, grade


def test_every_tree_has_max_nodes_with_valid_structure(setup):
    problems, _, rows, _, _ = setup
    nodes = pd.DataFrame(rows)
    assert list(nodes.columns) == list(NODE_COLUMNS)
    assert len(nodes) == 4 * len(problems)
    for _, t in nodes.groupby("problem_id"):
        assert t["node_id"].tolist() == [0, 1, 2, 3]
        depth = dict(zip(t["node_id"], t["depth"], strict=True))
        for r in t.itertuples():
            assert r.parent < r.node_id
            assert r.depth == (1 if r.parent == -1 else depth[r.parent] + 1)
            assert len(r.logprobs) == len(r.response_ids) == r.response_len
            assert r.action == ("generate" if r.parent == -1 else "refine")


def test_generation_is_batched_across_trees_per_agent(setup):
    problems, agents, rows, _, _ = setup
    waves = pd.DataFrame(rows)["wave"].nunique()
    calls = agents["a"].backend.calls + agents["b"].backend.calls
    assert waves == 4 and len(calls) <= 2 * waves and sum(calls) == len(rows)


def test_search_sees_only_public_tests(setup):
    problems, _, _, seen, _ = setup
    public = {t for p in problems for t in p.public_tests}
    hidden = {t for p in problems for t in p.hidden_tests}
    flat = {t for tests in seen for t in tests}
    assert flat <= public and not (flat & (hidden - public))


def test_refine_prompts_contain_the_problem_statement(setup):
    problems, _, rows, _, _ = setup
    statements = {p.id: p.statement.strip()[:80] for p in problems}
    refines = [r for r in rows if r["action"] == "refine"]
    assert refines, "a 4-node search over 3 trees should refine at least once"
    assert all(statements[r["problem_id"]] in r["prompt"] for r in refines)
    text = refine_prompt(problems[0], "print(1)", result_summary("WA", 1, 3, "input: 5", detailed=True))
    assert problems[0].statement.strip() in text and "print(1)" in text and "passed 1 of 3" in text and "input: 5" in text
    assert "input: 5" not in result_summary("WA", 1, 3, "input: 5")  # training feedback: aggregate only


def test_trees_round_trip_through_parquet_and_stats(setup, tmp_path):
    _, _, rows, _, _ = setup
    nodes = pd.DataFrame(rows)
    nodes.to_parquet(tmp_path / "t.parquet", index=False)
    back = pd.read_parquet(tmp_path / "t.parquet")
    assert back.drop(columns=["prompt_ids", "response_ids", "logprobs"]).equals(
        nodes.drop(columns=["prompt_ids", "response_ids", "logprobs"]))
    for col in ("prompt_ids", "response_ids", "logprobs"):
        assert [list(x) for x in back[col]] == [list(x) for x in nodes[col]]
    stats = tree_stats(nodes)
    assert stats["a/nodes_per_tree"] + stats["b/nodes_per_tree"] == 4
    assert sum(v for k, v in stats.items() if k.startswith("depth/")) == len(nodes)
    assert plot_trees(nodes, tmp_path / "trees.png").stat().st_size > 1000


def test_independent_sampling_uses_the_same_schema(setup):
    problems, agents, _, _, grade = setup
    rows = run_independent_sampling(problems[:2], agents, n_samples=2,
                                    sampling=SamplingParams(max_new_tokens=8, seed=0), grade=grade)
    nodes = pd.DataFrame(rows)
    assert list(nodes.columns) == list(NODE_COLUMNS) and len(nodes) == 2 * 2 * 2
    assert (nodes["parent"] == -1).all() and (nodes.groupby("problem_id")["node_id"].apply(list) == [[0, 1, 2, 3]] * 2).all()


def test_several_expansions_per_wave_halve_the_waves(setup):
    problems, agents, _, _, grade = setup
    rows = run_tree_search(problems, agents, policy=ABMCTSA(), max_nodes=5,
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=2), grade=grade, seed=0,
                           expansions_per_wave=2)
    nodes = pd.DataFrame(rows)
    assert nodes.groupby("problem_id").size().tolist() == [5] * len(problems)
    assert nodes["wave"].max() == 2  # waves of 2, 2, 1 expansions
    assert (nodes["parent"] < nodes["node_id"]).all()
    assert (nodes[nodes["wave"] == 0]["parent"] == -1).all()  # the first wave can only generate at the root


def same_trees(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Node for node the same trees and texts; log-probs equal up to float rounding (a row's arithmetic may be
    batched differently)."""
    pd.testing.assert_frame_equal(a.drop(columns="logprobs").reset_index(drop=True),
                                  b.drop(columns="logprobs").reset_index(drop=True))
    for x, y in zip(a["logprobs"], b["logprobs"], strict=True):
        assert x == pytest.approx(y, abs=1e-4)


def test_a_streaming_engine_builds_the_trees_that_one_call_per_wave_builds(setup):
    """The asynchronous search (requests submitted one by one as trees ask, continuously batched) and the wave
    schedule of a backend without ``submit`` (one generate call per agent whenever nothing else is in flight) build
    the same trees: a tree's history depends on its seeds, not on timing."""
    problems, agents, rows, _, grade = setup
    streaming = {n: AgentRunner(a.backend.inner, a.tokenizer, a.role_prompt) for n, a in agents.items()}
    again = run_tree_search(problems, streaming, policy=ABMCTSA(), max_nodes=4,
                            sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=1), grade=grade, seed=0)
    same_trees(pd.DataFrame(again), pd.DataFrame(rows))


class HeldBack:
    """A streaming backend that holds back the answers to prompts containing ``marker`` until ``fast_needed`` other
    answers have been given (or 60 s have passed: what a wave barrier would cause), and logs every answer."""

    def __init__(self, inner, marker, fast_needed, log):
        self.inner, self.marker, self.fast_needed, self.log = inner, marker, fast_needed, log
        self.release = threading.Event()

    def generate(self, prompts, params, seeds=None):  # every backend has it; this search streams through submit
        return self.inner.generate(prompts, params, seeds)

    def submit(self, prompt, params, seed):
        from concurrent.futures import Future

        slow = self.marker in prompt
        out = Future()

        def deliver(f):
            if slow:
                self.release.wait(timeout=60)
            self.log.append(("slow" if slow else "fast", time.perf_counter()))
            if sum(kind == "fast" for kind, _ in self.log) >= self.fast_needed:
                self.release.set()
            out.set_result(f.result())

        self.inner.submit(prompt, params, seed).add_done_callback(
            lambda f: threading.Thread(target=deliver, args=(f,)).start())
        return out


def test_no_tree_waits_for_another(setup):
    """No wave barrier: while one tree's first generation is held back, the other trees ask, generate, are graded
    and finish all their nodes; the held-back tree then finishes with the same nodes as without the delay."""
    problems, agents, rows, _, grade = setup
    log = []
    held = HeldBack(agents["a"].backend.inner, problems[0].statement[:40], 4 * (len(problems) - 1), log)
    slow = {n: AgentRunner(held, a.tokenizer, a.role_prompt) for n, a in agents.items()}
    again = pd.DataFrame(run_tree_search(problems, slow, policy=ABMCTSA(), max_nodes=4, grade=grade, seed=0,
                                         sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=1)))
    kinds = [kind for kind, _ in sorted(log, key=lambda x: x[1])]
    assert kinds == ["fast"] * (4 * (len(problems) - 1)) + ["slow"] * 4  # the other trees finished first
    same_trees(again, pd.DataFrame(rows))


def test_progress_counts_every_node_and_program_up_to_the_total(setup):
    """One display per stage: the search and the evaluation tell their progress as (done, total), ending at total."""
    from mars2.config import EvalConfig, SearchConfig
    from mars2.eval.run import evaluation_rollouts

    problems, agents, _, _, grade = setup
    seen = []
    rows = run_tree_search(problems, agents, policy=ABMCTSA(), max_nodes=3, grade=grade, seed=0,
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=3),
                           progress=lambda done, total: seen.append((done, total)))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and {t for _, t in seen} == {3 * len(problems)}
    assert seen[-1] == (3 * len(problems), 3 * len(problems)) and len(rows) == 3 * len(problems)

    seen.clear()
    evaluation = EvalConfig(n_samples=2, max_nodes=2, tree=True, tplus=[False], per_agent_trees=True,
                            max_new_tokens=8)
    samples, trees = evaluation_rollouts(problems[:2], evaluation, SearchConfig(), grade, agents,
                                         progress=lambda done, total: seen.append((done, total)))
    total = 2 * 2 * 2 + 2 * 2 * 3  # samples: 2 per agent per problem; trees: team, a, b of 2 nodes per problem
    assert len(samples) + len(trees) == total
    assert {t for _, t in seen} == {total} and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_trees_history_does_not_depend_on_which_trees_share_its_batches(tiny_model_dir):
    """k = 1: every request's seed is (run seed, problem, node index), so three trees searched together build the
    same trees, node for node, as each searched alone."""
    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    problems = [problem_from_lcb_row(r) for r in toy_benchmark(3, 1)]
    agents = {"a": AgentRunner(backend, tok, "role A"), "b": AgentRunner(backend, tok, "role B")}

    def grade(jobs):
        return grade_many([GradeJob(c, tuple(t), f) for c, t, f in jobs],
                          grading=GradingConfig(workers=2, time_limit_s=2))

    def search(group):
        rows = run_tree_search(group, agents, policy=ABMCTSA(), max_nodes=4, grade=grade, seed=0,
                               sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=5))
        return pd.DataFrame(rows)[["problem_id", "node_id", "parent", "agent", "response", "score"]]

    together = search(problems)
    alone = pd.concat([search([p]) for p in problems], ignore_index=True)
    pd.testing.assert_frame_equal(together.reset_index(drop=True), alone)
    assert together["response"].nunique() > 1


def test_the_search_score_option_grades_on_all_tests_and_scores_binary(setup):
    """search.score=all_tests_binary (MARTI's): nodes are graded on public + hidden tests and score 1 only when all
    pass; the default grades the public tests and scores the fraction passed."""
    from types import SimpleNamespace

    from mars2.search.scheduler import SIGNALS

    problems, agents, _, _, _ = setup
    public = {t for p in problems for t in p.public_tests}

    def passes_public_only(seen):  # every program passes the public tests and fails the others
        def grade(jobs):
            seen.extend(tests for _, tests, _ in jobs)
            passed = [sum(t in public for t in tests) for _, tests, _ in jobs]
            return [SimpleNamespace(status="AC" if n == len(tests) else "WA", passed=n, total=len(tests), detail="")
                    for n, (_, tests, _) in zip(passed, jobs, strict=True)]
        return grade

    scores = {}
    for name, signal in SIGNALS.items():
        seen: list = []
        rows = run_tree_search(problems, agents, policy=ABMCTSA(), max_nodes=2, sampling=SamplingParams(
            temperature=1.0, max_new_tokens=8, seed=1), grade=passes_public_only(seen), seed=0, signal=signal)
        scores[name] = {r["score"] for r in rows}
        hidden_seen = any(set(t) & (set(p.hidden_tests) - set(p.public_tests)) for t in seen for p in problems)
        assert hidden_seen == (name == "all_tests_binary")
    assert scores == {"public_fraction": {1.0}, "all_tests_binary": {0.0}}


def test_a_hidden_test_search_score_cannot_feed_t_plus_detail_into_prompts():
    from mars2.config import ConfigError
    from pipeline.config import load_cfg, resolve

    assert resolve(load_cfg(["search.score=all_tests_binary"])).search.score == "all_tests_binary"
    with pytest.raises(ConfigError, match="hidden tests"):
        resolve(load_cfg(["search.score=all_tests_binary", "search.detailed_feedback=true"]))
    with pytest.raises(ConfigError, match="search.score"):
        resolve(load_cfg(["search.score=hidden"]))


def test_every_search_score_the_config_allows_has_a_signal():
    from mars2.config import SEARCH_SCORES
    from mars2.search.scheduler import SIGNALS

    assert sorted(SIGNALS) == sorted(SEARCH_SCORES)


def test_a_window_of_trees_in_flight_finishes_trees_all_along_and_builds_the_same_trees(setup):
    """trees_in_flight=1: one tree at a time, each handed to on_tree as it is finished and before the next starts; the
    trees are those of all at once (a tree depends on its seeds, not on which trees share the engine)."""
    problems, agents, rows, _, grade = setup
    streaming = {n: AgentRunner(a.backend.inner, a.tokenizer, a.role_prompt) for n, a in agents.items()}
    finished, progress = [], []
    again = run_tree_search(problems, streaming, policy=ABMCTSA(), max_nodes=4, grade=grade, seed=0,
                            sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=1), trees_in_flight=1,
                            on_tree=lambda pid, tree: finished.append((pid, len(tree), progress[-1][0])),
                            progress=lambda done, total: progress.append((done, total)))
    # tree i is handed on when its 4th node is told (before that node's progress): 4i + 3 nodes were built before
    assert finished == [(p.id, 4, 4 * i + 3) for i, p in enumerate(problems)]
    same_trees(pd.DataFrame(again), pd.DataFrame(rows))
    with pytest.raises(ValueError, match="trees_in_flight must be >= 0"):
        run_tree_search(problems, streaming, policy=ABMCTSA(), max_nodes=4, grade=grade, trees_in_flight=-1,
                        sampling=SamplingParams(seed=1))
