"""LiveCodeBench folders: release tags, Parquet stand-ins, the contest-date window, fixture rejects, real data."""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from mars2.config import GradingConfig
from mars2.data import build_dataset, data_files, filter_by_date, load_problems, read_rows
from mars2.data.files import release_numbers
from mars2.data.splits import contest_datetime
from mars2.data.sources import _load
from tests.paths import FIXTURES, SHARED

LCB = FIXTURES / "lcb"

# Good problems per release file of the fixture folder (see tests/fixtures/make_fixtures.py).
GOOD = {
    "test.jsonl": ["abc001_a", "1001"],
    "test2.jsonl": ["abc010_a", "abc011_a", "2001"],  # its abc001_a repeats release 1: rejected when both load
    "test3.jsonl": ["abc020_a", "abc021_a", "abc022_a"],
}


def data_cfg(**kw) -> SimpleNamespace:
    base = dict(source="lcb", path=str(LCB), release=None, start_date=None, end_date=None, n_problems=0, seed=0,
                split="hash", eval_fraction=0.5, split_date=None, eval_ids_file=None, reject_fatal=False)
    return SimpleNamespace(**{**base, **kw})


# ------------------------------------------------------------------------------------------------ release tags

def _hf_allowed_files() -> dict[str, list[str]]:
    """The tag → files table of LiveCodeBench's code_generation_lite loading script, rebuilt from its rules."""
    stem = lambda n: "test.jsonl" if n == 1 else f"test{n}.jsonl"  # noqa: E731
    table = {f"release_v{n}": [stem(i) for i in range(1, n + 1)] for n in range(1, 7)}
    table["release_latest"] = table["release_v6"]
    table.update({f"v{n}": [stem(n)] for n in range(1, 7)})
    table.update({f"v{a}_v{b}": [stem(i) for i in range(a, b + 1)] for a in range(1, 7) for b in range(a + 1, 7)})
    return table


def test_release_tags_select_the_same_files_as_lcb():
    stem = lambda n: "test.jsonl" if n == 1 else f"test{n}.jsonl"  # noqa: E731
    for tag, files in _hf_allowed_files().items():
        assert [stem(n) for n in release_numbers(tag, list(range(1, 7)))] == files, tag


@pytest.mark.parametrize("tag", ["release_v0", "v3_v3", "v5_v4", "release-v1", "latest", "", "v1_v2_v3"])
def test_bad_release_tags_are_errors(tag: str):
    with pytest.raises(ValueError):
        release_numbers(tag, [1, 2, 3])


@pytest.mark.parametrize("tag, files", [
    (None, ["test.jsonl", "test2.jsonl", "test3.jsonl"]),
    ("release_v1", ["test.jsonl"]),
    ("release_v2", ["test.jsonl", "test2.jsonl"]),
    ("release_latest", ["test.jsonl", "test2.jsonl", "test3.jsonl"]),
    ("v2", ["test2.jsonl"]),
    ("v2_v3", ["test2.jsonl", "test3.jsonl"]),
])
def test_release_files_of_a_folder(tag, files):
    assert [f.name for f in data_files(LCB, release=tag)] == files


def test_missing_release_files_are_named():
    with pytest.raises(FileNotFoundError, match="test4.jsonl, test5.jsonl"):
        data_files(LCB, release="release_v5")
    with pytest.raises(ValueError, match="not a folder"):
        data_files(LCB / "test.jsonl", release="release_v1")


@pytest.mark.parametrize("tag, expected", [
    ("release_v1", GOOD["test.jsonl"]),
    ("v2", GOOD["test2.jsonl"] + ["abc001_a"]),  # alone, test2's abc001_a is not a duplicate
    ("v2_v3", GOOD["test2.jsonl"] + ["abc001_a"] + GOOD["test3.jsonl"]),
    ("release_v3", GOOD["test.jsonl"] + GOOD["test2.jsonl"] + GOOD["test3.jsonl"]),
])
def test_release_loads_exactly_its_problems(tag, expected):
    problems, _, _, _ = _load(data_cfg(release=tag))
    assert sorted(p.id for p in problems) == sorted(expected)


def test_parquet_file_stands_in_for_jsonl(tmp_path: Path):
    folder = tmp_path / "lcb"
    shutil.copytree(LCB, folder)
    rows = [{k: v for k, v in r.items() if not k.startswith("__")} for r in read_rows(folder / "test3.jsonl")]
    pd.DataFrame(rows).to_parquet(folder / "test3.parquet")
    (folder / "test3.jsonl").unlink()
    assert [f.name for f in data_files(folder, release="release_v3")][-1] == "test3.parquet"
    problems, rejected, _, _ = _load(data_cfg(path=str(folder), release="v3"))
    assert sorted(p.id for p in problems) == sorted(GOOD["test3.jsonl"])
    # the row without question_content is rejected with its file and row number
    assert [(Path(r["source"]).name, r["line"]) for r in rejected] == [("test3.parquet", 4)]
    assert "question_content" in rejected[0]["error"]


# ------------------------------------------------------------------------------------------------ fixture rows

def test_fixture_folder_loads_with_every_bad_row_reported():
    os.environ.pop("MARS2_FIXTURE_PWNED", None)
    problems, rejected, _, files = _load(data_cfg())
    assert [f.name for f in files] == ["test.jsonl", "test2.jsonl", "test3.jsonl"]
    assert [p.id for p in problems] == GOOD["test.jsonl"] + GOOD["test2.jsonl"] + GOOD["test3.jsonl"]
    where = [(Path(r["source"]).name, r["line"], r["question_id"]) for r in rejected]
    assert where == [("test.jsonl", 3, None), ("test.jsonl", 4, "abc002_b"), ("test.jsonl", 5, "abc003_c"),
                     ("test2.jsonl", 4, "abc001_a"), ("test3.jsonl", 4, "abc023_a")]
    reasons = [r["error"] for r in rejected]
    assert "not valid JSON" in reasons[0]
    assert "private_test_cases" in reasons[1] and "refusing to load global builtins.exec" in reasons[1]
    assert "no tests" in reasons[2]
    assert "duplicate" in reasons[3] and "test.jsonl" in reasons[3]
    assert "question_content" in reasons[4] and "missing" in reasons[4]
    # the malicious pickle was refused, not run
    assert "MARS2_FIXTURE_PWNED" not in os.environ


def test_fixture_encoded_private_tests_are_decoded():
    problems, _ = load_problems(read_rows(LCB / "test.jsonl"), source="t")
    p = next(p for p in problems if p.id == "1001")
    assert p.testtype == "functional" and p.func_name == "sumAll" and p.difficulty == "medium"
    assert [(t.input, t.output) for t in p.hidden_tests] == [("[4, 4]", "8"), ("[0, 0, 1]", "1")]
    assert len(p.public_tests) == 2


def test_fixture_problems_pass_with_a_correct_program():
    from mars2.sandbox import GradeJob, grade_many

    problems, _, _, _ = _load(data_cfg())
    stdin = "n = int(input())\nprint(sum(map(int, input().split())))\n"
    functional = {p.func_name: f"class Solution:\n    def {p.func_name}(self, nums):\n        return sum(nums)\n"
                  for p in problems if p.func_name}
    jobs = [GradeJob(functional[p.func_name] if p.func_name else stdin, p.public_tests + p.hidden_tests, p.func_name)
            for p in problems if p.id in ("abc001_a", "1001", "2001")]
    assert [v.status for v in grade_many(jobs, grading=GradingConfig(workers=2))] == ["AC", "AC", "AC"]


# ------------------------------------------------------------------------------------------------ date window

def test_window_is_inclusive_at_midnight_like_lcb():
    problems, _, _, _ = _load(data_cfg())
    kept, counts = filter_by_date(problems, "2024-08-01", "2025-02-01")
    # 2024-07-31T23:59:59 is before the start; 2025-02-01T00:00 is on the end day at midnight (kept);
    # 2025-02-01T12:00 is after the end bound (LCB compares datetimes, the bound is midnight)
    assert [p.id for p in kept] == ["abc011_a", "2001", "abc020_a"]
    assert counts == {"outside_window": len(problems) - 3, "undated": 0}
    # LCB's own rule, applied independently
    start, end = datetime(2024, 8, 1), datetime(2025, 2, 1)
    assert [p.id for p in kept] == [p.id for p in problems
                                    if start <= datetime.fromisoformat(p.contest_date) <= end]


def test_open_windows_and_undated_problems():
    problems, _, _, _ = _load(data_cfg())
    assert filter_by_date(problems, None, None)[0] == problems
    assert [p.id for p in filter_by_date(problems, "2025-02-02", None)[0]] == ["abc022_a"]
    assert [p.id for p in filter_by_date(problems, None, "2023-05-07")[0]] == ["abc001_a"]
    from dataclasses import replace

    undated = [replace(problems[0], id="x", contest_date="")]
    assert filter_by_date(undated, "2020-01-01", None) == ([], {"outside_window": 0, "undated": 1})
    with pytest.raises(ValueError, match="after"):
        filter_by_date(problems, "2025-01-02", "2025-01-01")
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        filter_by_date(problems, "2025/01/02", None)


def test_aware_contest_dates_compare_in_utc():
    assert contest_datetime("2025-02-01T01:00:00+02:00") == datetime(2025, 1, 31, 23, 0)
    assert contest_datetime("not a date") is None and contest_datetime("") is None


def test_window_through_build_dataset():
    ds = build_dataset(data_cfg(release="release_v3", start_date="2024-08-01", end_date="2025-02-01",
                                split="date", split_date="2024-09-01"))
    assert [p.id for p in ds.train] == ["abc011_a"]
    assert [p.id for p in ds.eval] == ["2001", "abc020_a"]
    assert ds.summary["dropped"]["outside_window"] == 5
    assert ds.summary["n_rejected"] == 5


# ------------------------------------------------------------------------------------------------ real data

def _shared_problems_file() -> Path | None:
    candidates = []
    if os.environ.get("MARS2_SHARED_DATA"):
        candidates.append(Path(os.environ["MARS2_SHARED_DATA"]) / "lcb_v5_public/problems.jsonl")
    candidates.append(SHARED / "data/lcb_v5_public/problems.jsonl")
    return next((c for c in candidates if c.is_file()), None)


@pytest.fixture(scope="module")
def shared_lcb():
    path = _shared_problems_file()
    if path is None:
        pytest.skip("shared/data/lcb_v5_public/problems.jsonl not found (set MARS2_SHARED_DATA)")
    return path


def test_shared_lcb_v5_public_window_selects_the_279(shared_lcb: Path):
    problems, rejected, _, _ = _load(data_cfg(path=str(shared_lcb)))
    # zero rejects except rows without tests (this copy has none)
    assert [r for r in rejected if "no tests" not in r["error"]] == []
    assert len(problems) == 879
    kept, counts = filter_by_date(problems, "2024-08-01", "2025-02-01")
    assert len(kept) == 279 and counts == {"outside_window": 600, "undated": 0}
    # the same set as LCB's rule and as the README's half-open window (the data ends on 2025-01-04)
    start, end = datetime(2024, 8, 1), datetime(2025, 2, 1)
    lcb = {p.id for p in problems if start <= datetime.fromisoformat(p.contest_date) <= end}
    half_open = {p.id for p in problems if start <= datetime.fromisoformat(p.contest_date) < end}
    assert {p.id for p in kept} == lcb == half_open
    assert sum(p.platform == "leetcode" for p in kept) == 104


def test_shared_lcb_v5_public_preset(shared_lcb: Path):
    from pipeline.config import load_cfg, resolve

    cfg = resolve(load_cfg(["data=lcb_v5_public", f"data.path={shared_lcb}"]))
    ds = build_dataset(cfg.data)
    assert (len(ds.train), len(ds.eval), len(ds.rejected)) == (600, 279, 0)
    assert max(p.contest_date for p in ds.train) < "2024-08-01" <= min(p.contest_date for p in ds.eval)
    assert ds.summary["platform"] == {"atcoder": 489, "codeforces": 9, "leetcode": 381}
    assert ds.summary["difficulty"] == {"easy": 279, "hard": 270, "medium": 330}
    assert ds.summary["testtype"] == {"functional": 381, "stdin": 498}
    assert ds.summary["tests"]["public"] == 2299
