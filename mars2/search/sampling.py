"""Independent sampling (the vanilla GRPO baseline): each agent writes ``n`` programs per problem from the
generate prompt. Rows share the tree schema (:data:`mars2.search.scheduler.NODE_COLUMNS`): every sample is a
child of the root, so the same grading, advantage and update stages serve both strategies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mars2.backends.base import Generation, SamplingParams, request_seed
from mars2.data.schema import Problem
from mars2.search.prompts import extract_code, generate_prompt
from mars2.search.scheduler import PUBLIC, AgentRunner, GradeFn, SearchSignal, node_row
from mars2.search.tree import ROOT


def run_independent_sampling(problems: Sequence[Problem], agents: Mapping[str, AgentRunner], *, n_samples: int,
                             sampling: SamplingParams, grade: GradeFn, signal: SearchSignal = PUBLIC,
                             progress: Callable[[int, int], None] | None = None,
                             on_tree: Callable[[str, list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """``n_samples`` programs per (problem, agent), graded and scored by ``signal`` like tree nodes; ``progress`` is told
    ``(programs drawn, programs in all)`` after each agent's batch; ``on_tree(problem id, rows)`` once per problem
    when all are graded (one batch per agent: nothing is finished before the end)."""
    drawn: dict[str, list[tuple[str, str, Generation, str | None]]] = {p.id: [] for p in problems}
    for k, (name, agent) in enumerate(agents.items()):
        texts = [agent.chat(generate_prompt(p)) for p in problems]
        params = dataclasses.replace(sampling, n=n_samples)
        outs = agent.backend.generate(texts, params, [request_seed(sampling.seed, p.id, name) for p in problems])
        for p, text, gens in zip(problems, texts, outs, strict=True):
            drawn[p.id] += [(name, text, g, extract_code(g.text)) for g in gens]
        if progress is not None:
            progress((k + 1) * n_samples * len(problems), len(agents) * n_samples * len(problems))
    flat = [(p, i, d) for p in problems for i, d in enumerate(drawn[p.id])]
    verdicts = grade([(code, signal.tests(p), p.func_name) for p, _, (_, _, _, code) in flat])
    rows = [node_row(p.id, i, parent=ROOT, depth=1, agent=name, parent_agent=None, wave=0, prompt=text, generation=g,
                     code=code, verdict=v, score=signal.score(v))
            for (p, i, (name, text, g, code)), v in zip(flat, verdicts, strict=True)]
    if on_tree is not None:
        for p in problems:
            on_tree(p.id, [r for r in rows if r["problem_id"] == p.id])
    return rows
