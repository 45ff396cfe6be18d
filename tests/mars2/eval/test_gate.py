"""The refine gate: attempts from agents, hidden-test rewards from the real sandbox, the gate's figures by hand."""

import numpy as np
import pandas as pd
import pytest

from mars2.backends import Generation, SamplingParams
from mars2.config import GradingConfig
from mars2.data import problem_from_lcb_row, toy_benchmark, toy_reference_solutions
from mars2.eval.gate import (ATTEMPT_COLUMNS, gate_attempts, gate_markdown, gate_metrics, gate_passes, gate_table,
                             refine_outcomes)
from mars2.rl.verdicts import unique_hidden_test_verdicts
from mars2.search.run import public_grader
from mars2.search.scheduler import AgentRunner

GRADING = GradingConfig(time_limit_s=2.0, workers=2, isolation="process")


class Scripted:
    """An agent whose answers are fixed functions of the prompt: ``fresh(problem, i)`` for the i-th sample of a
    generate prompt, ``refine(problem, parent_code)`` for a refine prompt (the parent's code is read from it)."""

    def __init__(self, problems, fresh, refine):
        self.problems, self.fresh, self.refine = problems, fresh, refine
        self.seeds: list[int] = []

    def generate(self, prompts, params, seeds=None):
        self.seeds += list(seeds or [])
        out = []
        for prompt in prompts:
            problem = next(p for p in self.problems if p.statement.strip()[:80] in prompt)
            if "A previous attempt:" in prompt:
                parent = prompt.split("A previous attempt:\n```python\n", 1)[1].split("\n```", 1)[0]
                texts = [self.refine(problem, parent)]
            else:
                texts = [self.fresh(problem, i) for i in range(params.n)]
            out.append([Generation([1], [2, 3], [-0.1, -0.2], f"```python\n{t}\n```", "stop") for t in texts])
        return out


class Chat:
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "\n".join(m["content"] for m in messages)


@pytest.fixture(scope="module")
def team():
    rows = toy_benchmark(4, 0)
    problems = [problem_from_lcb_row(r) for r in rows]
    refs = toy_reference_solutions(4, 0)
    wrong = "print(-12345)"
    # fixer never writes a right program afresh and always repairs a parent; copier writes the right program on its
    # first sample only and hands back the parent unchanged when asked to refine
    fixer = Scripted(problems, lambda p, i: wrong, lambda p, parent: refs[p.id])
    copier = Scripted(problems, lambda p, i: refs[p.id] if i == 0 else wrong, lambda p, parent: parent)
    runners = {"fixer": AgentRunner(fixer, Chat()), "copier": AgentRunner(copier, Chat())}
    seen = []
    attempts = gate_attempts(problems, runners, n_fresh=3, n_parents=2, grade=public_grader(GRADING),
                             sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=5),
                             progress=lambda done, total: seen.append((done, total)))
    graded = unique_hidden_test_verdicts(attempts, {p.id: p for p in problems}, GRADING, progress=None)
    return problems, runners, attempts, graded, seen


def test_attempts_hold_every_fresh_program_and_one_refine_per_refiner_and_failed_parent(team):
    problems, runners, attempts, _, seen = team
    assert list(attempts.columns) == list(ATTEMPT_COLUMNS)
    fresh, refines = attempts[attempts["kind"] == "fresh"], attempts[attempts["kind"] == "refine"]
    assert len(fresh) == len(attempts[attempts["kind"] == "pool"]) == 3 * 2 * len(problems)
    # parents, from the pool only: fixer's first 2 of 3 failures, copier's 2 failures, per problem; each refined by
    # both agents
    assert len(refines) == len(problems) * (2 + 2) * 2
    for pid, rows in attempts.groupby("problem_id", sort=False):
        assert rows["node_id"].tolist() == list(range(len(rows)))
        by_node = rows.set_index("node_id")
        for r in rows[rows["kind"] == "refine"].itertuples():
            parent = by_node.loc[r.parent]
            assert parent["kind"] == "pool" and parent["agent"] == r.author and parent["score"] < 1
    assert attempts["problem_id"].drop_duplicates().tolist() == [p.id for p in problems]
    assert seen[-1] == (len(attempts), len(attempts))
    seeds = runners["fixer"].backend.seeds
    assert len(set(seeds)) == len(seeds)  # every request its own seed


def test_the_gate_matches_each_refine_with_its_refiners_fresh_rate_on_the_same_problem(team):
    _, _, _, graded, _ = team
    table = gate_table(graded, n_boot=500).set_index("set")
    # fixer: refines always pass, fresh never → +1; copier: refines copy a failed parent → 0, fresh passes 1 in 3
    assert table.loc["fixer-refines-copier", "refine"] == 1 and table.loc["fixer-refines-copier", "fresh"] == 0
    assert table.loc["fixer-refines-fixer", "delta"] == pytest.approx(1.0)
    assert table.loc["copier-refines-fixer", "delta"] == pytest.approx(-1 / 3)
    assert table.loc["copier-refines-copier", "verdict"] == "does not hold"
    assert table.loc["fixer-refines-fixer", "verdict"] == "holds"
    # pooled: per problem, 4 fixer refines (Δ +1 each) and 4 copier refines (Δ −1/3 each) → +1/3
    assert table.loc["all", "delta"] == pytest.approx(1 / 3) and table.loc["all", "attempts"] == 32
    assert table.loc["all", "low"] <= table.loc["all", "delta"] <= table.loc["all", "high"]
    assert table.loc["cross", "attempts"] == table.loc["self", "attempts"] == 16
    metrics = gate_metrics(table.reset_index())
    assert metrics["fixer-refines-copier/delta"] == 1.0 and metrics["passes"] == float(gate_passes(table.reset_index()))
    text = gate_markdown(table.reset_index(), refine_outcomes(graded))
    assert "| fixer-refines-copier | 4 | 8 | 100.0 | 0.0 | +100.0 |" in text
    assert "| copier | fixer | 8 | 100.0 | 100.0 | 0.0 |" in text


def test_refine_outcomes_count_copies_compiles_and_passes(team):
    _, _, _, graded, _ = team
    out = refine_outcomes(graded).set_index(["agent", "author"])
    assert out.loc[("copier", "fixer"), "copied"] == 1.0 and out.loc[("copier", "fixer"), "passed"] == 0.0
    assert out.loc[("fixer", "copier"), "copied"] == 0.0 and out.loc[("fixer", "copier"), "passed"] == 1.0
    assert (out["compiles"] == 1.0).all()


def test_the_gate_passes_only_when_the_pooled_interval_is_above_zero():
    rng = np.random.default_rng(0)
    rows = []
    for p in range(30):
        rows += [{"problem_id": f"p{p}", "kind": "fresh", "agent": "a", "author": "a",
                  "reward": float(rng.random() < .2)} for _ in range(4)]
        rows += [{"problem_id": f"p{p}", "kind": "refine", "agent": "a", "author": "a", "reward": better}
                 for better in (1.0, float(rng.random() < .5))]
    table = gate_table(pd.DataFrame(rows), n_boot=1000)
    assert gate_passes(table) and table.set_index("set").loc["cross", "verdict"] == "no attempts"
    worse = pd.DataFrame(rows).assign(reward=lambda t: np.where(t["kind"] == "refine", 0.0, t["reward"]))
    assert not gate_passes(gate_table(worse, n_boot=1000))
    with pytest.raises(ValueError, match="reward"):
        gate_table(pd.DataFrame(rows).drop(columns="reward"))


def test_rollout_verdicts_report_the_pass_rate_of_refinements_and_of_cross_agent_ones():
    from mars2.rl.verdicts import verdict_metrics

    verdicts = pd.DataFrame({"agent": ["a", "a", "b", "b", "a"], "action": ["generate", "refine", "refine", "refine",
                                                                           "generate"],
                             "parent_agent": [None, "a", "a", "b", None], "reward": [1.0, 0.0, 1.0, 0.0, 0.0],
                             "status": ["AC", "WA", "AC", "WA", "WA"]})
    m = verdict_metrics(verdicts)
    assert m["generate_pass_rate"] == 0.5 and m["refine_pass_rate"] == pytest.approx(1 / 3)
    assert m["cross_refine_pass_rate"] == 1.0
    assert "refine_pass_rate" not in verdict_metrics(verdicts[verdicts["action"] == "generate"])
