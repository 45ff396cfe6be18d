"""Train/eval splits (hash, date, id list): no eval problem ever reaches training."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import date, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from mars2.data import Problem, build_dataset, split_by_date, split_by_ids
from mars2.data import TestCase as Case
from mars2.data.splits import drop_train_duplicates, read_id_list
from mars2.data.tables import split_by_hash
from tests.paths import FIXTURES


def make_problems(n: int, seed: int = 0) -> list[Problem]:
    rng = random.Random(seed)
    day0 = date(2023, 5, 1)
    out = []
    for i in range(n):
        d = day0 + timedelta(days=rng.randrange(800))
        out.append(Problem(id=f"p{i}", title=f"t{i}", statement=f"statement {i} {rng.random()}",
                           public_tests=(Case("1\n", "1\n"),), hidden_tests=(Case("2\n", "2\n"),),
                           contest_date=f"{d.isoformat()}T00:00:00", platform=rng.choice(["atcoder", "leetcode"])))
    return out


def no_leak(train: list[str], held_out: list[str], all_ids: list[str]) -> None:
    assert not set(train) & set(held_out)
    assert sorted(train + held_out) == sorted(all_ids)


@pytest.mark.parametrize("seed", range(5))
def test_hash_split_is_disjoint_complete_and_stable(seed: int):
    problems = make_problems(200, seed)
    ids = [p.id for p in problems]
    train, held_out = split_by_hash(ids, 0.3, seed)
    no_leak(train, held_out, ids)
    assert 30 < len(held_out) < 90
    # a problem's side depends only on its id: removing others does not move it
    sub_train, sub_eval = split_by_hash(ids[::3], 0.3, seed)
    assert set(sub_eval) == set(held_out) & set(ids[::3])


@pytest.mark.parametrize("seed", range(5))
def test_date_split_puts_everything_on_or_after_the_cut_in_eval(seed: int):
    problems = make_problems(150, seed)
    train, held_out = split_by_date(problems, "2024-06-01")
    no_leak(train, held_out, [p.id for p in problems])
    by_id = {p.id: p for p in problems}
    assert all(by_id[i].contest_date < "2024-06-01" for i in train)
    assert all(by_id[i].contest_date >= "2024-06-01" for i in held_out)


def test_date_split_refuses_undated_problems():
    problems = make_problems(5) + [replace(make_problems(1)[0], id="undated", contest_date="")]
    with pytest.raises(ValueError, match="no contest date"):
        split_by_date(problems, "2024-01-01")


def test_id_split_and_id_files(tmp_path: Path):
    ids = [f"p{i}" for i in range(10)]
    train, held_out, missing = split_by_ids(ids, ["p3", "p7", "zz"])
    no_leak(train, held_out, ids)
    assert held_out == ["p3", "p7"] and missing == ["zz"]
    (tmp_path / "ids.txt").write_text("# eval problems\np3\n\np7  # a comment\n")
    (tmp_path / "ids.json").write_text(json.dumps(["p3", 7]))
    assert read_id_list(tmp_path / "ids.txt") == ["p3", "p7"]
    assert read_id_list(tmp_path / "ids.json") == ["p3", "7"]
    (tmp_path / "bad.json").write_text(json.dumps({"p3": 1}))
    with pytest.raises(ValueError):
        read_id_list(tmp_path / "bad.json")


def test_same_statement_under_another_id_is_dropped_from_train():
    a, b, c = make_problems(3)
    twin = replace(c, id="twin", statement="  " + c.statement.replace(" ", "\n ") + "\n")
    kept, dropped = drop_train_duplicates([a, b, twin], [c])
    assert [p.id for p in kept] == ["p0", "p1"] and dropped == ["twin"]


def _cfg(**kw) -> SimpleNamespace:
    base = dict(source="toy", path=None, release=None, start_date=None, end_date=None, n_problems=80, seed=0,
                split="hash", eval_fraction=0.25, split_date=None, eval_ids_file=None, reject_fatal=False)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw", [
    dict(split="hash", eval_fraction=0.3, seed=4),
    dict(split="date", split_date="2023-09-01"),
    dict(split="ids"),
])
def test_no_eval_problem_leaks_into_training_through_build_dataset(tmp_path: Path, kw):
    if kw["split"] == "ids":
        ids_file = tmp_path / "eval_ids.txt"
        ids_file.write_text("\n".join(f"toy_{i:04d}" for i in range(4, 81, 4)) + "\nmissing_id\n")
        kw = {**kw, "eval_ids_file": str(ids_file)}
    ds = build_dataset(_cfg(**kw))
    train_ids, eval_ids = {p.id for p in ds.train}, {p.id for p in ds.eval}
    assert train_ids and eval_ids and not train_ids & eval_ids
    assert not {p.statement for p in ds.train} & {p.statement for p in ds.eval}
    assert len(train_ids) + len(eval_ids) + ds.summary["dropped"]["train_duplicates_of_eval"] == 80
    if kw["split"] == "date":
        assert max(p.contest_date for p in ds.train) < "2023-09-01" <= min(p.contest_date for p in ds.eval)
    if kw["split"] == "ids":
        assert len(eval_ids) == 20 and ds.summary["split"]["eval_ids_missing"] == ["missing_id"]


def test_a_split_with_an_empty_side_is_an_error():
    with pytest.raises(ValueError, match="both sides"):
        build_dataset(_cfg(split="date", split_date="2030-01-01"))


def test_cycles_visit_consecutive_windows_or_repeat_the_first():
    from mars2.data.tables import cycle_subset

    ids = [f"p{i}" for i in range(5)]
    assert [cycle_subset(ids, c, 2) for c in range(3)] == [["p0", "p1"], ["p2", "p3"], ["p4", "p0"]]
    assert [cycle_subset(ids, c, 2, rotate=False) for c in range(3)] == [["p0", "p1"]] * 3
    assert cycle_subset(ids, 7, None) == ids and cycle_subset(ids, 7, 9, rotate=False) == ids


def test_eval_from_its_own_source_with_a_window_and_statement_dedup(tmp_path: Path):
    """split=source: train on DeepCoder-style records, evaluate on an LCB release window; a training record with an
    eval problem's statement under another id is dropped from training."""
    fixtures = FIXTURES
    from mars2.data.files import read_rows
    from mars2.data.lcb import load_problems

    lcb_problems, _ = load_problems(read_rows(fixtures / "lcb" / "test.jsonl"), source="test.jsonl")
    leaked = lcb_problems[0]
    train_file = tmp_path / "train.jsonl"
    train_file.write_text((fixtures / "deepcoder" / "train.jsonl").read_text().rstrip("\n") + "\n" + json.dumps(
        {"id": "leak-1", "prompt": leaked.statement, "label": {"inputs": ["1\n"], "outputs": ["1\n"]}}) + "\n")
    cfg = SimpleNamespace(source="deepcoder", path=str(train_file), release=None, start_date=None, end_date=None,
                          n_problems=0, seed=0, split="source", eval_fraction=0.25, split_date=None, eval_ids_file=None,
                          reject_fatal=False, eval_source="lcb", eval_path=str(fixtures / "lcb"),
                          eval_release="release_v1", eval_start_date=None, eval_end_date=None)
    ds = build_dataset(cfg)
    assert {p.id for p in ds.eval} == {p.id for p in lcb_problems}  # release_v1 = test.jsonl's valid rows
    assert "leak-1" not in {p.id for p in ds.train} and ds.summary["dropped"]["train_duplicates_of_eval"] == 1
    assert ds.summary["eval_source"]["source"] == "lcb"
    assert len(ds.summary["files"]) == 2  # both sides' files key the data stage
    dates = sorted(p.contest_date for p in lcb_problems)
    windowed = build_dataset(replace_ns(cfg, eval_start_date=dates[-1][:10]))
    assert {p.contest_date for p in windowed.eval} == {d for d in dates if d[:10] >= dates[-1][:10]}


def replace_ns(ns: SimpleNamespace, **kw) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(ns), **kw})
