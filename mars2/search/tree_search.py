"""Many AB-MCTS-A trees advancing together, with each agent's expansions batched across trees.

One *wave* asks every unfinished tree for one expansion, sends each agent all of its prompts in one
backend call, grades the new programs on the public tests (the search signal; hidden tests are never
shown to the search) while the next agent generates, then tells every tree its node's score. No tree
waits on another tree for longer than one wave.

Grading runs in the sandbox pool on the host's cores, so it overlaps generation only when no agent generates
on those cores (GPU, vLLM): beside a CPU backend the two only contend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mars2.backends.base import Generation, GenerationBackend, SamplingParams, request_seed
from mars2.data.schema import Problem, TestCase
from mars2.search.ab_mcts import ABMCTSA, ROOT, Expansion, SearchTree
from mars2.search.prompts import chat_messages, extract_code, generate_prompt, refine_prompt, result_summary

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


def grading_overlaps_generation(agents: Mapping[str, AgentRunner]) -> bool:
    """True unless some agent's backend generates on the host CPU (``uses_host_cpu``).

    There, torch's OpenMP threads and the grader's processes share the same cores, and a thread that loses its
    core stalls its peers at every barrier: ``bench/rollout.py`` measured 0.77x of raw throughput with
    overlapped grading against 0.80-0.84x grading after each generate call.
    """
    return not any(getattr(a.backend, "uses_host_cpu", False) for a in agents.values())


def _graded_now(grade: GradeFn, jobs) -> Future:
    done: Future = Future()
    done.set_result(grade(jobs))
    return done


def tree_seed(seed: int, problem_id: str) -> np.random.Generator:
    """Per-tree RNG: a tree's choices depend on (seed, problem), not on which trees share its batch."""
    return np.random.default_rng([seed, *problem_id.encode()])


def run_tree_search(problems: Sequence[Problem], agents: Mapping[str, AgentRunner], *, policy: ABMCTSA,
                    max_nodes: int, sampling: SamplingParams, grade: GradeFn, seed: int = 0,
                    detailed_feedback: bool = False, expansions_per_wave: int = 1,
                    progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Build one ``max_nodes``-node tree per problem; returns one row per node (see :data:`NODE_COLUMNS`).

    ``expansions_per_wave`` = k asks per tree before the wave's tells (TreeQuest's ``ask_batch``): k = 1 is
    sequential AB-MCTS-A; k > 1 makes fewer, larger generation batches at the price of k−1 selections per
    wave that do not yet see each other's scores.
    """
    names = tuple(agents)
    trees = {p.id: SearchTree(agents=names) for p in problems}
    rngs = {p.id: tree_seed(seed, p.id) for p in problems}
    rows: dict[str, list[dict[str, Any]]] = {p.id: [] for p in problems}
    by_id = {p.id: p for p in problems}
    wave = 0
    overlap = grading_overlaps_generation(agents)
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as graders:
        submit = graders.submit if overlap else _graded_now
        while True:
            todo = [p.id for p in problems if len(trees[p.id]) < max_nodes]
            if not todo:
                break
            # each request's seed names its node: (run seed, problem, node index), whatever shares its batch
            asks = [(pid, policy.ask(trees[pid], rngs[pid]), request_seed(sampling.seed, pid, len(trees[pid]) + j))
                    for pid in todo for j in range(min(expansions_per_wave, max_nodes - len(trees[pid])))]
            pending = []
            for agent in names:
                mine_asks = [(pid, e) for pid, e, _ in asks if e.agent == agent]
                if not mine_asks:
                    continue
                mine = [pid for pid, _ in mine_asks]
                prompts = [_prompt(by_id[pid], e, rows[pid], detailed_feedback) for pid, e in mine_asks]
                texts = [agents[agent].chat(p) for p in prompts]
                params = SamplingParams(n=1, temperature=sampling.temperature, top_p=sampling.top_p,
                                        max_new_tokens=sampling.max_new_tokens, seed=sampling.seed)
                seeds = [s for _, e, s in asks if e.agent == agent]
                gens = [g[0] for g in agents[agent].backend.generate(texts, params, seeds)]
                codes = [extract_code(g.text) for g in gens]
                jobs = [(c, by_id[pid].public_tests, by_id[pid].func_name) for pid, c in zip(mine, codes, strict=True)]
                pending.append((mine_asks, texts, gens, codes, submit(grade, jobs)))
            for mine_asks, texts, gens, codes, future in pending:
                for (pid, exp), text, g, code, v in zip(mine_asks, texts, gens, codes, future.result(), strict=True):
                    node_id = policy.tell(trees[pid], exp, public_score(v))
                    parent_agent = rows[pid][exp.parent]["agent"] if exp.parent != ROOT else None
                    rows[pid].append(node_row(pid, node_id, parent=exp.parent, depth=trees[pid].nodes[node_id].depth,
                                              agent=exp.agent, parent_agent=parent_agent, wave=wave, prompt=text,
                                              generation=g, code=code, verdict=v))
            wave += 1
            if progress is not None:
                progress(sum(len(t) for t in trees.values()), max_nodes * len(problems))
    return [r for p in problems for r in rows[p.id]]


def _prompt(problem: Problem, exp: Expansion, rows: list[dict[str, Any]], detailed: bool) -> str:
    if exp.parent == ROOT:
        return generate_prompt(problem)
    parent = rows[exp.parent]
    result = result_summary(parent["public_status"], parent["public_passed"], parent["public_total"],
                            parent["public_detail"], detailed=detailed)
    return refine_prompt(problem, parent["code"], result)


def public_score(verdict: Any) -> float:
    """s_v = passed / total over the public tests; 0 when there are none (docs/algorithm.md §2)."""
    return verdict.passed / verdict.total if verdict.total else 0.0


def node_row(problem_id: str, node_id: int, *, parent: int, depth: int, agent: str, parent_agent: str | None,
             wave: int, prompt: str, generation: Generation, code: str | None, verdict: Any) -> dict[str, Any]:
    """One row of the node table (:data:`NODE_COLUMNS`): the node's place in its tree, the agent's generation
    (token ids, rollout log-probs) and its public verdict and score. A child of the root is a ``generate``."""
    return {
        "problem_id": problem_id, "node_id": node_id, "parent": parent, "depth": depth, "agent": agent,
        "action": "generate" if parent == ROOT else "refine", "parent_agent": parent_agent, "wave": wave,
        "prompt": prompt, "response": generation.text, "code": code, "prompt_ids": generation.prompt_ids,
        "response_ids": generation.response_ids, "logprobs": generation.logprobs,
        "finish_reason": generation.finish_reason, "response_len": len(generation.response_ids),
        "public_status": verdict.status, "public_passed": verdict.passed, "public_total": verdict.total,
        "public_detail": verdict.detail[:2000], "score": public_score(verdict),
    }


NODE_COLUMNS = ("problem_id", "node_id", "parent", "depth", "agent", "action", "parent_agent", "wave", "prompt",
                "response", "code", "prompt_ids", "response_ids", "logprobs", "finish_reason", "response_len",
                "public_status", "public_passed", "public_total", "public_detail", "score")
