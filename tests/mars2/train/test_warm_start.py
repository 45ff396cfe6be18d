"""Supervised warm-start (mars2.train.warm_start): data mix, packing, schedule, and that it fits its data."""

from __future__ import annotations

import math

import pytest
import torch

from mars2.data.toy import toy_benchmark
from mars2.data.lcb import load_problems
from mars2.models.tiny import build_tiny_model, train_tokenizer
from mars2.train.warm_start import (
    WarmStartExample,
    pack_sft_batch,
    reference_answer,
    supervised_warm_start,
    warm_start_examples,
    warm_start_lr,
    warm_start_mix,
)


def test_mix_is_a_seeded_share_in_input_order():
    ids = [f"p{i}" for i in range(20)]
    a = warm_start_mix(ids, 0.5, seed=0)
    assert len(a) == 10 and a == [i for i in ids if i in set(a)]
    assert warm_start_mix(ids, 0.5, seed=0) == a
    assert warm_start_mix(ids, 0.5, seed=1) != a
    assert warm_start_mix(ids, 1.0, seed=3) == ids
    assert warm_start_mix(ids, 0.01, seed=0) and len(warm_start_mix(ids, 0.01, seed=0)) == 1
    with pytest.raises(ValueError, match="data_fraction"):
        warm_start_mix(ids, 0.0, seed=0)


def test_pack_labels_only_the_response():
    ex = [WarmStartExample("a", [5, 6, 7], [8, 9]), WarmStartExample("b", [5], [4, 3, 2])]
    b = pack_sft_batch(ex, pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 4, 3, 2, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert b["labels"].tolist() == [[-100, -100, -100, 8, 9], [-100, 4, 3, 2, -100]]


def test_lr_warms_up_then_decays_to_a_tenth():
    lrs = [warm_start_lr(s, steps=100, lr=1.0, warmup_ratio=0.05) for s in range(100)]
    assert lrs[0] == pytest.approx(0.2) and lrs[4] == pytest.approx(1.0)
    assert lrs[5] == pytest.approx(1.0) and all(a >= b for a, b in zip(lrs[5:], lrs[6:]))
    assert lrs[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 94 / 95)))


def test_warm_start_fits_reference_solutions():
    rows = toy_benchmark(8, seed=0)
    problems, rejected = load_problems(rows, source="toy")
    assert not rejected
    from mars2.data.toy import toy_reference_solutions

    refs = toy_reference_solutions(8, 0)
    tok = train_tokenizer([p.statement for p in problems] + list(refs.values()), 512)
    examples = warm_start_examples(problems[:4], refs, tok, lambda p: p.statement[:200])
    assert [e.problem_id for e in examples] == [p.id for p in problems[:4]]
    assert examples[0].response_ids[-1] == tok.eos_token_id
    assert tok.decode(examples[0].response_ids[:-1]) == reference_answer(refs[problems[0].id])
    model = build_tiny_model("qwen2", vocab_size=len(tok), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_position_embeddings=1024, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    stats = supervised_warm_start(model, examples, pad_id=tok.pad_token_id, steps=40, lr=1e-2, batch_size=4, seed=0)
    assert stats["loss_last"] < 0.5 * stats["loss_first"]
    assert stats["n_examples"] == 4 and stats["response_tokens"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not model.training


def test_no_reference_solutions_is_a_clear_error():
    problems, _ = load_problems(toy_benchmark(2, seed=0), source="toy")
    with pytest.raises(ValueError, match="reference solution"):
        warm_start_examples(problems, {}, None, str)
    with pytest.raises(ValueError, match="steps"):
        supervised_warm_start(None, [], pad_id=0, steps=0, lr=1.0, batch_size=1, seed=0)


def test_one_token_faults_change_one_token_and_leave_comments_and_other_strings_alone():
    import random

    from mars2.train.warm_start import faulty_variants, mutate, mutation_sites

    source = 'n = int(input())  # read 3 numbers\nif n < 10 and s == "b":\n    print(min(n, 2), "Yes")\n'
    sites = mutation_sites(source)
    replaced = sorted(source.splitlines()[line - 1][start:end] for line, start, end, _ in sites)
    assert replaced == sorted(["<", "10", "10", "and", "==", '"b"', "min", "2", "2"])
    assert mutate(source, next(s for s in sites if s[3] == "<=")) == source.replace("n < 10", "n <= 10")
    assert mutate(source, next(s for s in sites if s[3] == '"c"')) == source.replace('"b"', '"c"')
    variants = faulty_variants(source, random.Random(0), 20)
    assert len(variants) == len(set(variants)) == len(sites) and source not in variants
    assert variants == faulty_variants(source, random.Random(0), 20)  # seeded
    assert all(v.count("# read 3 numbers") == 1 for v in variants)
    assert len(faulty_variants(source, random.Random(0), 2)) == 2


def test_faulty_attempts_keep_variants_that_fail_a_public_test_with_their_verdict():
    """Graded by the real sandbox on the toy problems' public tests: every kept variant fails, at most k per problem,
    and the refine example asks for the reference from the tree's refine prompt."""
    from mars2.config import GradingConfig
    from mars2.data.toy import toy_reference_solutions
    from mars2.search.prompts import refine_prompt, result_summary
    from mars2.search.run import public_grader
    from mars2.train.warm_start import faulty_attempts, refine_examples

    problems, _ = load_problems(toy_benchmark(6, seed=0), source="toy")
    refs = toy_reference_solutions(6, 0)
    grade = public_grader(GradingConfig(time_limit_s=2.0, workers=2, isolation="process"))
    cases, harmless = faulty_attempts(problems, refs, 2, 0, grade)
    assert cases and harmless >= 0
    per_problem = {}
    for p, code, verdict in cases:
        per_problem[p.id] = per_problem.get(p.id, 0) + 1
        assert code != refs[p.id] and verdict.status != "AC" and verdict.total == len(p.public_tests)
    assert max(per_problem.values()) <= 2 and len(per_problem) >= 4
    again = [g.status for g in grade([(code, p.public_tests, p.func_name) for p, code, _ in cases])]
    assert "AC" not in again
    tok = train_tokenizer([p.statement for p in problems] + list(refs.values()), 512)
    examples = refine_examples(cases, refs, tok, lambda p, code, v, i: refine_prompt(
        p, code, result_summary(v.status, v.passed, v.total, v.detail, detailed=i % 2 == 1)))
    assert len(examples) == len(cases)
    first_prompt = tok.decode(examples[0].prompt_ids)
    assert cases[0][1].strip() in first_prompt and "A previous attempt" in first_prompt
    assert tok.decode(examples[0].response_ids[:-1]) == reference_answer(refs[cases[0][0].id])


def test_own_failures_are_the_agents_samples_that_fail_a_public_test(tiny_model_dir):
    """A random tiny model's samples, from its own engine, graded by the real sandbox: every one fails, with its
    verdict; a stand-in grader that passes the second sample of each problem drops exactly those."""
    from mars2.backends.transformers_backend import load_transformers_backend
    from mars2.config import GradingConfig
    from mars2.search.prompts import generate_prompt
    from mars2.search.run import public_grader
    from mars2.train.warm_start import own_failures

    problems, _ = load_problems(toy_benchmark(3, seed=0), source="toy")
    backend, tok = load_transformers_backend(str(tiny_model_dir), str(tiny_model_dir))
    prompt = lambda p: tok.apply_chat_template([{"role": "user", "content": generate_prompt(p)}], tokenize=False,
                                               add_generation_prompt=True)
    grade = public_grader(GradingConfig(time_limit_s=2.0, workers=2, isolation="process"))
    failures = own_failures(problems, backend, prompt, n=2, temperature=1.0, max_new_tokens=12, seed=0, grade=grade)
    assert [p.id for p, _, _ in failures] == [p.id for p in problems for _ in range(2)]
    assert all(v.status != "AC" for _, _, v in failures)
    again = own_failures(problems, backend, prompt, n=2, temperature=1.0, max_new_tokens=12, seed=0, grade=grade)
    assert [c for _, c, _ in again] == [c for _, c, _ in failures]  # seeded

    class Verdict:
        def __init__(self, status):
            self.status = status

    calls = []
    some_pass = own_failures(problems, backend, prompt, n=2, temperature=1.0, max_new_tokens=12, seed=0,
                             grade=lambda jobs: calls.append(jobs) or [Verdict("AC" if i % 2 else "WA")
                                                                        for i in range(len(jobs))])
    assert len(calls[0]) == 6 and len(some_pass) == 3 and all(v.status == "WA" for _, _, v in some_pass)


def test_wrong_reading_attempts_are_the_other_readings_failing_a_public_test_with_their_verdict():
    """Graded by the real sandbox: every other reading of a known-answer problem fails exactly its pinning public test
    (passed = total − 1), and an AC program offered as a wrong reading is dropped."""
    from mars2.config import GradingConfig
    from mars2.data.known_answer import (known_answer_benchmark, known_answer_reference_solutions,
                                         known_answer_wrong_readings)
    from mars2.search.run import public_grader
    from mars2.train.warm_start import wrong_reading_attempts

    problems, _ = load_problems(known_answer_benchmark(6, seed=0), source="known_answer")
    refs, wrong = known_answer_reference_solutions(6, 0), known_answer_wrong_readings(6, 0)
    offered = {p.id: wrong[p.id] + [refs[p.id]] for p in problems}
    grade = public_grader(GradingConfig(time_limit_s=2.0, workers=2, isolation="process"))
    cases = wrong_reading_attempts(problems, offered, grade)
    assert [(p.id, code) for p, code, _ in cases] == [(p.id, w) for p in problems for w in wrong[p.id]]
    assert all(v.status == "WA" and v.passed == v.total - 1 for _, _, v in cases)
