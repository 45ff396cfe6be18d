"""Many trees searched at once, asynchronously: no tree waits for another.

Each tree asks its strategy (:class:`mars2.search.tree.TreePolicy`: AB-MCTS-A, sequential refinement, ...) for its
next expansion as soon as its previous node is scored: ask → prompt → the agent's
engine (``backend.submit``) → public-test grading in the sandbox pool → tell → ask again. Every agent's engine
batches whatever requests are in flight (continuous batching), so all owners generate at the same time and
grading overlaps generation. The only ordering is within a tree, so with per-request seeds
(``request_seed(run seed, problem, node index)``) a tree's history does not depend on timing or on the other trees.

``expansions_per_wave`` = k asks k expansions of a tree before telling their scores (TreeQuest's ``ask_batch``):
k = 1 asks after every score, as the strategy is written. A backend without ``submit`` (one call per batch: a cold
vLLM worker, a test's recorder) gets its requests in one ``generate`` call whenever nothing else is in flight, which
is the wave schedule of a static batch; the trees are the same either way.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mars2.backends.base import Generation, GenerationBackend, SamplingParams, StreamingBackend, request_seed
from mars2.data.schema import Problem, TestCase
from mars2.search.prompts import chat_messages, extract_code, generate_prompt, refine_prompt, result_summary
from mars2.search.tree import ROOT, Expansion, TreePolicy

# (code, tests, func_name) jobs → one verdict-like object per job with status/passed/total/detail
GradeFn = Callable[[list[tuple[str | None, tuple[TestCase, ...], str | None]]], list[Any]]


@dataclass
class AgentRunner:
    """What the search needs of an agent: its backend, its own tokenizer (chat template) and role prompt."""

    backend: GenerationBackend
    tokenizer: Any
    role_prompt: str = ""
    chat_kwargs: dict[str, Any] = field(default_factory=dict)  # chat-template switches, e.g. enable_thinking

    def chat(self, user_prompt: str) -> str:
        return self.tokenizer.apply_chat_template(chat_messages(user_prompt, self.role_prompt), tokenize=False,
                                                  add_generation_prompt=True, **self.chat_kwargs)


def public_score(verdict: Any) -> float:
    """s_v = passed / total over the public tests; 0 when there are none (docs/algorithm.md §2)."""
    return verdict.passed / verdict.total if verdict.total else 0.0


def all_tests_score(verdict: Any) -> float:
    """s_v = 1 iff every test passed (public and hidden), else 0: MARTI's search score."""
    return float(verdict.total > 0 and verdict.passed == verdict.total)


@dataclass(frozen=True)
class SearchSignal:
    """What a node is graded on during the search (``tests(problem)``) and the score s_v it gets (``score(verdict)``,
    in [0, 1]). :data:`SIGNALS` maps ``search.score`` to one."""

    tests: Callable[[Problem], tuple[TestCase, ...]]
    score: Callable[[Any], float]


SIGNALS = {"public_fraction": SearchSignal(lambda p: p.public_tests, public_score),
           "all_tests_binary": SearchSignal(lambda p: p.public_tests + p.hidden_tests, all_tests_score)}
PUBLIC = SIGNALS["public_fraction"]


def tree_seed(seed: int, problem_id: str) -> np.random.Generator:
    """Per-tree RNG: a tree's choices depend on (seed, problem), not on which trees share its batch."""
    return np.random.default_rng([seed, *problem_id.encode()])


@dataclass
class Round:
    """The k expansions of one tree asked together: (expansion, request seed, chat text) each, and what came back."""

    asks: list[tuple[Expansion, int, str]]
    generations: list[Generation | None]
    codes: list[str | None]
    verdicts: list[Any]
    left: int


def run_tree_search(problems: Sequence[Problem], agents: Mapping[str, AgentRunner], *, policy: TreePolicy,
                    max_nodes: int, sampling: SamplingParams, grade: GradeFn, seed: int = 0,
                    detailed_feedback: bool = False, expansions_per_wave: int = 1, signal: SearchSignal = PUBLIC,
                    progress: Callable[[int, int], None] | None = None,
                    on_tree: Callable[[str, list[dict[str, Any]]], None] | None = None,
                    trees_in_flight: int = 0) -> list[dict[str, Any]]:
    """Build one ``max_nodes``-node tree per problem, each node graded and scored by ``signal``; returns one row per
    node (see :data:`NODE_COLUMNS`), by problem then node id. A row's ``wave`` is the round of its tree that made it.
    ``on_tree(problem id, rows)`` is called as each tree is finished (a stage's journal keeps it).

    ``trees_in_flight`` = W > 0 searches at most W trees at once, in problem order, the next starting as one
    finishes (0: all at once): trees then finish all along the rollout instead of together at its end, and a tree's
    nodes do not depend on W.

    ``expansions_per_wave`` = k asks of ``policy`` per tree before the round's tells: k = 1 is the strategy as written
    (sequential AB-MCTS-A); k > 1 keeps k requests of a tree in flight at the price of k−1 selections that do not
    yet see each other's scores.
    """
    if expansions_per_wave < 1:
        raise ValueError(f"expansions_per_wave must be >= 1, got {expansions_per_wave}")
    if trees_in_flight < 0:
        raise ValueError(f"trees_in_flight must be >= 0 (0: all at once), got {trees_in_flight}")
    search = TreeSearch(problems, agents, policy=policy, max_nodes=max_nodes, sampling=sampling, grade=grade,
                        seed=seed, detailed_feedback=detailed_feedback, expansions_per_wave=expansions_per_wave,
                        signal=signal, progress=progress, on_tree=on_tree, trees_in_flight=trees_in_flight)
    return search.run()


class TreeSearch:
    """The trees of one search and what is in flight for them. A tree goes round by round: ``start_round`` asks its
    next expansions and sends their prompts, ``on_generated`` extracts each program for grading, ``on_graded``
    tells the round's scores once all of them are in and starts the next round. Every completion (a generation, a
    grading call) arrives as an event on one queue, and ``run`` handles what has arrived together, so the programs
    that came back meanwhile are graded in one call."""

    def __init__(self, problems: Sequence[Problem], agents: Mapping[str, AgentRunner], *, policy: TreePolicy,
                 max_nodes: int, sampling: SamplingParams, grade: GradeFn, seed: int, detailed_feedback: bool,
                 expansions_per_wave: int, signal: SearchSignal, progress: Callable[[int, int], None] | None,
                 on_tree: Callable[[str, list[dict[str, Any]]], None] | None = None, trees_in_flight: int = 0):
        self.problems, self.agents, self.policy, self.grade, self.signal = problems, agents, policy, grade, signal
        self.on_tree = on_tree
        self.waiting = collections.deque(p.id for p in problems) if max_nodes > 0 else collections.deque()
        self.window = trees_in_flight or len(problems)
        self.max_nodes, self.k, self.detailed_feedback, self.progress = (max_nodes, expansions_per_wave,
                                                                          detailed_feedback, progress)
        self.names = tuple(agents)
        self.by_id = {p.id: p for p in problems}
        self.trees = {p.id: policy.new_tree(self.names) for p in problems}
        self.rngs = {p.id: tree_seed(seed, p.id) for p in problems}
        self.rows: dict[str, list[dict[str, Any]]] = {p.id: [] for p in problems}
        self.rounds: dict[str, Round] = {}
        self.finished_rounds = dict.fromkeys(self.by_id, 0)
        self.params = dataclasses.replace(sampling, n=1)
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # ("generated", [(pid, j, Future)]) | ("graded", keys, F)
        self.held: dict[str, list[tuple[str, int]]] = {a: [] for a in self.names}  # for backends without submit
        self.outstanding = 0  # generations and grading calls sent whose event has not been handled yet
        self.total, self.built = max_nodes * len(problems), 0

    def run(self) -> list[dict[str, Any]]:
        while self.waiting and len(self.rounds) < self.window:
            self.start_round(self.waiting.popleft())
        with ThreadPoolExecutor(max_workers=max(1, len(self.names))) as graders:
            while self.rounds:
                if not self.outstanding:
                    self.send_held()
                jobs = []
                for kind, payload, *rest in self.arrived():
                    if kind == "generated":
                        jobs += self.on_generated(payload)
                    else:
                        self.on_graded(payload, rest[0].result())
                if jobs:
                    keys = [k for k, _ in jobs]
                    self.outstanding += 1
                    graders.submit(self.grade, [job for _, job in jobs]).add_done_callback(
                        lambda f, keys=keys: self.events.put(("graded", keys, f)))
        return [r for p in self.problems for r in self.rows[p.id]]

    def arrived(self) -> list[tuple]:
        """The next event (waiting for it) and every other one already there."""
        batch = [self.events.get()]
        while True:
            try:
                batch.append(self.events.get_nowait())
            except queue.Empty:
                break
        self.outstanding -= len(batch)
        return batch

    def start_round(self, pid: str) -> None:
        """Ask the tree's next expansions (k, or the nodes it has left) and send their prompts."""
        tree = self.trees[pid]
        asks = []
        for j in range(min(self.k, self.max_nodes - len(tree))):
            exp = self.policy.ask(tree, self.rngs[pid])
            text = self.agents[exp.agent].chat(_prompt(self.by_id[pid], exp, self.rows[pid], self.detailed_feedback))
            asks.append((exp, request_seed(self.params.seed, pid, len(tree) + j), text))
        n = len(asks)
        self.rounds[pid] = Round(asks, [None] * n, [None] * n, [None] * n, n)
        for j, (exp, request, text) in enumerate(asks):
            backend = self.agents[exp.agent].backend
            if isinstance(backend, StreamingBackend):
                self.outstanding += 1
                backend.submit(text, self.params, request).add_done_callback(
                    lambda f, key=(pid, j): self.events.put(("generated", [(*key, f)])))
            else:
                self.held[exp.agent].append((pid, j))

    def send_held(self) -> None:
        """Nothing else can come back: each batch-only backend gets its waiting requests in one call."""
        for agent in self.names:
            keys, self.held[agent] = self.held[agent], []
            if not keys:
                continue
            asks = [self.rounds[pid].asks[j] for pid, j in keys]
            gens = self.agents[agent].backend.generate([t for _, _, t in asks], self.params, [s for _, s, _ in asks])
            self.outstanding += 1
            self.events.put(("generated", [(pid, j, _done(g[0])) for (pid, j), g in zip(keys, gens, strict=True)]))

    def on_generated(self, batch: list[tuple[str, int, Future]]) -> list:
        """Record each generation and its program; returns the grading jobs ((pid, j), (code, tests, func_name))."""
        jobs = []
        for pid, j, future in batch:
            g = future.result()  # an engine's error ends the search here, naming its agent
            r = self.rounds[pid]
            r.generations[j], r.codes[j] = g, extract_code(g.text)
            jobs.append(((pid, j), (r.codes[j], self.signal.tests(self.by_id[pid]), self.by_id[pid].func_name)))
        return jobs

    def on_graded(self, keys: list[tuple[str, int]], verdicts: list[Any]) -> None:
        """Record the verdicts; a tree whose round is complete tells its scores, writes its rows and goes on."""
        for (pid, j), v in zip(keys, verdicts, strict=True):
            r = self.rounds[pid]
            r.verdicts[j], r.left = v, r.left - 1
            if not r.left:
                self.tell_round(pid, r)
        if self.progress is not None:
            self.progress(self.built, self.total)

    def tell_round(self, pid: str, r: Round) -> None:
        tree, rows = self.trees[pid], self.rows[pid]
        for (exp, _, text), g, code, verdict in zip(r.asks, r.generations, r.codes, r.verdicts, strict=True):
            score = self.signal.score(verdict)
            node_id = self.policy.tell(tree, exp, score)
            parent_agent = rows[exp.parent]["agent"] if exp.parent != ROOT else None
            rows.append(node_row(pid, node_id, parent=exp.parent, depth=tree.nodes[node_id].depth, agent=exp.agent,
                                 parent_agent=parent_agent, wave=self.finished_rounds[pid], prompt=text,
                                 generation=g, code=code, verdict=verdict, score=score))
        self.finished_rounds[pid] += 1
        self.built += len(r.asks)
        del self.rounds[pid]
        if len(tree) < self.max_nodes:
            self.start_round(pid)
            return
        if self.on_tree is not None:
            self.on_tree(pid, rows)
        if self.waiting:
            self.start_round(self.waiting.popleft())


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _prompt(problem: Problem, exp: Expansion, rows: list[dict[str, Any]], detailed: bool) -> str:
    if exp.parent == ROOT:
        return generate_prompt(problem)
    parent = rows[exp.parent]
    result = result_summary(parent["public_status"], parent["public_passed"], parent["public_total"],
                            parent["public_detail"], detailed=detailed)
    return refine_prompt(problem, parent["code"], result)


def node_row(problem_id: str, node_id: int, *, parent: int, depth: int, agent: str, parent_agent: str | None,
             wave: int, prompt: str, generation: Generation, code: str | None, verdict: Any,
             score: float) -> dict[str, Any]:
    """One row of the node table (:data:`NODE_COLUMNS`): the node's place in its tree, the agent's generation
    (token ids, rollout log-probs), its search verdict (``public_*``: the tests the search grades on, public ones
    unless ``search.score=all_tests_binary``) and its search score. A child of the root is a ``generate``."""
    return {
        "problem_id": problem_id, "node_id": node_id, "parent": parent, "depth": depth, "agent": agent,
        "action": "generate" if parent == ROOT else "refine", "parent_agent": parent_agent, "wave": wave,
        "prompt": prompt, "response": generation.text, "code": code, "prompt_ids": generation.prompt_ids,
        "response_ids": generation.response_ids, "logprobs": generation.logprobs,
        "finish_reason": generation.finish_reason, "response_len": len(generation.response_ids),
        "public_status": verdict.status, "public_passed": verdict.passed, "public_total": verdict.total,
        "public_detail": verdict.detail[:2000], "score": score,
    }


NODE_COLUMNS = ("problem_id", "node_id", "parent", "depth", "agent", "action", "parent_agent", "wave", "prompt",
                "response", "code", "prompt_ids", "response_ids", "logprobs", "finish_reason", "response_len",
                "public_status", "public_passed", "public_total", "public_detail", "score")
