"""The known-answer benchmark: deterministic, valid rows; every statement admits several readings, its public tests
pin one, and the sandbox agrees (the true reading passes everything, every other reading fails a public test and
the hidden tests)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter

from mars2.config import GradingConfig
from mars2.data import problem_from_lcb_row
from mars2.data.known_answer import (KNOWN_ANSWER_TEMPLATES, _counterfactuals, _generate, known_answer_benchmark,
                                     known_answer_counterfactuals, known_answer_readings,
                                     known_answer_reference_solutions, known_answer_wrong_readings)
from mars2.data.lcb import load_problems
from tests.paths import ROOT

N = 2 * len(KNOWN_ANSWER_TEMPLATES)  # every template twice


def _digest(n: int, seed: int) -> str:
    return hashlib.sha256(json.dumps([known_answer_benchmark(n, seed), known_answer_reference_solutions(n, seed),
                                      known_answer_wrong_readings(n, seed)]).encode()).hexdigest()


def test_same_seed_is_identical_different_seeds_differ_and_problem_i_depends_on_seed_and_i_only():
    assert _digest(40, 0) == _digest(40, 0) != _digest(40, 1)
    assert known_answer_benchmark(10, 0) == known_answer_benchmark(40, 0)[:10]
    truths = [[r["reading"] for r in known_answer_readings(200, seed)] for seed in (0, 1)]
    assert truths[0] != truths[1]  # the seed redraws which reading is true, not only the inputs


def test_byte_identical_across_processes_and_hash_seeds():
    code = "from tests.mars2.data.test_known_answer import _digest; print(_digest(60, 3))"
    root = str(ROOT)
    digests = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": s}, check=True,
                              cwd=root, capture_output=True, text=True, timeout=120).stdout.strip()
               for s in ("0", "4242")}
    assert digests == {_digest(60, 3)}


def test_rows_are_valid_lcb_rows_of_both_kinds_and_every_template():
    rows = known_answer_benchmark(N, 0)
    problems, rejected = load_problems(rows, source="known_answer")
    assert rejected == [] and len(problems) == N
    assert {p.testtype for p in problems} == {"stdin", "functional"}
    assert Counter(r["template"] for r in known_answer_readings(N, 0)) == {t: 2 for t in KNOWN_ANSWER_TEMPLATES}
    for p in problems:
        assert 2 <= len(p.public_tests) <= 3 and 4 <= len(p.hidden_tests) <= 6
        inputs = [t.input for t in p.public_tests + p.hidden_tests]
        assert len(set(inputs)) == len(inputs)


def test_each_statement_admits_every_reading_and_the_public_tests_pin_the_true_one():
    """On the statement's examples every reading gives the shown output; the last public test (not shown) refutes
    every other reading, and at least two hidden tests refute each of them too."""
    for d in _generate(N, 0):
        spec, right, problem = d.spec, d.spec.readings[d.truth], problem_from_lcb_row(d.row)
        assert len(spec.readings) >= 2 and [t.input for t in problem.public_tests] == [spec.input(a) for a in d.public]
        examples, pinning = d.public[:-1], d.public[-1]
        for args in examples:
            assert spec.output(right, args).strip() in problem.statement
            assert spec.input(args).strip() in problem.statement or spec.functional
        assert spec.input(pinning).strip() not in problem.statement or spec.functional
        for reading in spec.readings:
            assert [spec.output(reading, a) for a in examples] == [spec.output(right, a) for a in examples], \
                f"{problem.id}: reading {reading.name} disagrees with a shown example"
            if reading is not right:
                assert spec.output(reading, pinning) != spec.output(right, pinning)
                assert sum(spec.output(reading, a) != spec.output(right, a) for a in d.hidden) >= 2


def test_a_counterfactual_has_the_same_statement_and_its_tests_pin_another_reading():
    """Problem i taken with another reading as the truth: same statement, examples and id; its pinning public test
    refutes the original truth (whose program is now the wrong one) and its solution is that other reading's."""
    wrong, counterfactuals = known_answer_wrong_readings(N, 0), known_answer_counterfactuals(N, 0)
    for i, d in enumerate(_generate(N, 0)):
        qid, spec = d.row["question_id"], d.spec
        assert [c["solution"] for c in counterfactuals[qid]] == wrong[qid]
        assert [c["row"] for c in counterfactuals[qid]] == [c.row for c in _counterfactuals(d, i, 0)]
        for c in _counterfactuals(d, i, 0):
            assert (c.row["question_id"], c.row["question_content"], c.row["starter_code"]) == \
                (qid, d.row["question_content"], d.row["starter_code"])
            assert c.public[:-1] == d.public[:-1] and c.truth != d.truth
            new, old = spec.readings[c.truth], spec.readings[d.truth]
            assert spec.output(new, c.public[-1]) != spec.output(old, c.public[-1])  # the old truth now fails
            assert problem_from_lcb_row(c.row).public_tests[-1].output == spec.output(new, c.public[-1])
    assert known_answer_benchmark(N, 0) == [d.row for d in _generate(N, 0)]  # drawing them changes nothing


def test_in_the_sandbox_the_reference_passes_everything_and_each_wrong_reading_fails_public_and_hidden_tests():
    from mars2.sandbox import GradeJob, grade_many

    rows = known_answer_benchmark(N, 0)
    problems = [problem_from_lcb_row(r) for r in rows]
    refs, wrong = known_answer_reference_solutions(N, 0), known_answer_wrong_readings(N, 0)
    grading = GradingConfig(workers=2, isolation="process")
    right = grade_many([GradeJob(refs[p.id], p.public_tests + p.hidden_tests, p.func_name) for p in problems],
                       grading=grading)
    assert [p.id for p, v in zip(problems, right) if not v.all_passed] == []
    jobs = [(p, code) for p in problems for code in wrong[p.id]]
    assert len(jobs) >= len(problems) and all(wrong[p.id] for p in problems)
    public = grade_many([GradeJob(c, p.public_tests, p.func_name) for p, c in jobs], grading=grading)
    hidden = grade_many([GradeJob(c, p.hidden_tests, p.func_name) for p, c in jobs], grading=grading)
    assert {v.status for v in public} == {"WA"} and {v.status for v in hidden} == {"WA"}
    # the statement's examples pass: the verdict names a test the statement does not show
    assert all(v.passed == v.total - 1 for v in public)


def test_sources_build_a_dataset_with_wrong_readings_for_the_training_problems_only_where_asked():
    from types import SimpleNamespace

    from mars2.data.sources import build_dataset

    base = dict(path=None, release=None, start_date=None, end_date=None, n_problems=40, seed=0, split="hash",
                eval_fraction=0.25, split_date=None, eval_ids_file=None, eval_source=None, eval_path=None,
                eval_release=None, eval_start_date=None, eval_end_date=None, reject_fatal=True)
    ds = build_dataset(SimpleNamespace(source="known_answer", **base))
    assert len(ds.train) + len(ds.eval) == 40 and ds.summary["source"] == "known_answer"
    assert set(ds.wrong_readings) == set(ds.reference_solutions) == {p.id for p in ds.train + ds.eval}
    assert build_dataset(SimpleNamespace(source="toy", **base)).wrong_readings is None
