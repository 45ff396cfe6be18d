"""The dataset-prep stage: its files, summary, metrics, fatal rejects, and its cache key (input-file hashes)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from mars2.config import DataConfig
from mars2.data import DatasetRejectsError, build_dataset
from mars2.data.tables import problems_from_frame
from tasks import data as data_stage
from stagekit.stage import StageContext, stage_digest
from tests.paths import FIXTURES



def run(tmp_path: Path, data: DataConfig, monkeypatch) -> object:
    """Run the stage's function body as Prefect would, without a Prefect server."""
    ctx = StageContext(root=str(tmp_path / "run"))
    params = {"ctx": ctx, "data": data, "input_hash": data_stage.source_hash(data)}
    monkeypatch.setattr(data_stage, "current_parameters", lambda: params)
    return data_stage.prepare_dataset.fn(**params)


def key(data: DataConfig) -> str:
    params = {"ctx": StageContext(root="/unused"), "data": data, "input_hash": data_stage.source_hash(data)}
    return stage_digest(data_stage.DECLARATION.name, data_stage.DECLARATION.modules, params)


@pytest.fixture()
def lcb_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "lcb"
    shutil.copytree(FIXTURES / "lcb", folder)
    return folder


def test_stage_writes_tables_rejects_and_summary(tmp_path: Path, lcb_copy: Path, monkeypatch):
    data = DataConfig(source="lcb", path=str(lcb_copy), release="release_v3", split="date", split_date="2024-09-01")
    record = run(tmp_path, data, monkeypatch)
    assert set(record.files) == {"train.parquet", "eval.parquet", "rejected.parquet", "summary.json"}
    train = problems_from_frame(pd.read_parquet(record.path("train.parquet")))
    held_out = problems_from_frame(pd.read_parquet(record.path("eval.parquet")))
    assert [p.id for p in train] == ["abc001_a", "1001", "abc010_a", "abc011_a"]
    assert [p.id for p in held_out] == ["2001", "abc020_a", "abc021_a", "abc022_a"]
    assert held_out[0].hidden_tests[0].input == "[10, -10]"  # decoded once, stored plain
    rejected = pd.read_parquet(record.path("rejected.parquet"))
    assert list(rejected.columns) == ["source", "line", "question_id", "error"]
    assert [(Path(s).name, int(n)) for s, n in zip(rejected["source"], rejected["line"])] == [
        ("test.jsonl", 3), ("test.jsonl", 4), ("test.jsonl", 5), ("test2.jsonl", 4), ("test3.jsonl", 4)]
    summary = json.loads(record.path("summary.json").read_text())
    assert (summary["n"], summary["n_train"], summary["n_eval"], summary["n_rejected"]) == (8, 4, 4, 5)
    assert summary["platform"] == {"atcoder": 5, "codeforces": 1, "leetcode": 2}
    assert summary["difficulty"] == {"easy": 6, "hard": 1, "medium": 1}
    assert summary["testtype"] == {"functional": 2, "stdin": 6}
    assert summary["contest_date"] == {"min": "2023-05-07T00:00:00", "max": "2025-03-01T00:00:00", "n_undated": 0}
    assert summary["rejected_by_file"] == {str(lcb_copy / "test.jsonl"): 3, str(lcb_copy / "test2.jsonl"): 1,
                                           str(lcb_copy / "test3.jsonl"): 1}
    assert [Path(f["path"]).name for f in summary["files"]] == ["test.jsonl", "test2.jsonl", "test3.jsonl"]
    assert summary["eval"]["contest_date"]["min"] == "2024-09-15T00:00:00"
    assert record.meta["content_hash"] == summary["content_hash"] and len(summary["content_hash"]) == 64
    m = record.metrics
    assert (m["n_train"], m["n_eval"], m["n_rejected"], m["n_problems"]) == (4, 4, 5, 8)
    assert m["platform/atcoder"] == 5 and m["testtype/functional"] == 2 and m["eval/platform/leetcode"] == 1
    assert m["tests/public"] == 16 and m["dropped/outside_window"] == 0
    # the second run reuses the folder
    assert run(tmp_path, data, monkeypatch) == record


def test_reject_fatal_stops_with_the_rejects_listed(tmp_path: Path, lcb_copy: Path, monkeypatch):
    data = DataConfig(source="lcb", path=str(lcb_copy), release="v3", reject_fatal=True)
    with pytest.raises(DatasetRejectsError) as e:
        run(tmp_path, data, monkeypatch)
    text = str(e.value)
    assert "1 row(s) rejected (3 good)" in text and f"{lcb_copy / 'test3.jsonl'}:4" in text
    assert "question_content" in text and "reject_fatal=false" in text
    assert not list((tmp_path / "run" / "artifacts" / "data").glob("[!.]*"))  # no stage folder was published
    # clean input passes with the flag on
    clean = lcb_copy / "clean.jsonl"
    clean.write_text("".join(line for line in (lcb_copy / "test3.jsonl").read_text().splitlines(True)[:3]))
    ds = build_dataset(replace(data, path=str(clean), release=None, split="date", split_date="2025-02-15"))
    assert ([p.id for p in ds.train], [p.id for p in ds.eval]) == (["abc020_a", "abc021_a"], ["abc022_a"])


def test_toy_and_humaneval_stages_write_reference_solutions(tmp_path: Path, monkeypatch):
    toy = run(tmp_path, DataConfig(n_problems=12), monkeypatch)
    refs = json.loads(toy.path("reference_solutions.json").read_text())
    assert len(refs) == 12 and json.loads(toy.path("summary.json").read_text())["platform"] == {"toy": 12}
    mini = DataConfig(source="humaneval", path=str(FIXTURES / "humaneval_mini.jsonl"), eval_fraction=0.5, seed=0)
    he = run(tmp_path, mini, monkeypatch)
    assert set(json.loads(he.path("reference_solutions.json").read_text())) == {"Mini/0", "Mini/1"}
    assert he.metrics["n_rejected"] == 3


# ------------------------------------------------------------------------------------------------ cache key

def test_key_follows_selected_file_contents_only(lcb_copy: Path):
    data = DataConfig(source="lcb", path=str(lcb_copy), release="release_v2")
    k0 = key(data)
    # unrelated changes: a README, a release file outside release_v2, a new non-data file, mtimes
    (lcb_copy / "README.md").write_text("edited notes\n")
    with open(lcb_copy / "test3.jsonl", "a") as f:
        f.write("\n")
    (lcb_copy / "notes.txt").write_text("scratch")
    os.utime(lcb_copy / "test.jsonl", (1, 1))
    assert key(data) == k0
    # an edit of a selected file changes it
    text = (lcb_copy / "test2.jsonl").read_text()
    (lcb_copy / "test2.jsonl").write_text(text.replace("abc010_a", "abc010_z"))
    k1 = key(data)
    assert k1 != k0
    (lcb_copy / "test2.jsonl").write_text(text)
    assert key(data) == k0  # content-addressed: restoring the file restores the key
    # so does any config field
    assert key(replace(data, end_date="2025-01-01")) != k0


def test_key_follows_the_eval_id_file_and_a_single_data_file(tmp_path: Path, lcb_copy: Path):
    ids = tmp_path / "eval_ids.txt"
    ids.write_text("abc011_a\n")
    data = DataConfig(source="lcb", path=str(lcb_copy / "test2.jsonl"), split="ids", eval_ids_file=str(ids))
    k0 = key(data)
    (lcb_copy / "test.jsonl").write_text("")  # not read by this config
    assert key(data) == k0
    ids.write_text("abc011_a\n2001\n")
    assert key(data) != k0
    assert data_stage.source_hash(DataConfig()) == ""  # toy: generated, nothing to hash


def test_stage_reruns_into_a_new_folder_when_data_changes(tmp_path: Path, lcb_copy: Path, monkeypatch):
    data = DataConfig(source="lcb", path=str(lcb_copy), release="release_v2", eval_fraction=0.5)
    first = run(tmp_path, data, monkeypatch)
    (lcb_copy / "README.md").write_text("unrelated\n")
    assert run(tmp_path, data, monkeypatch).dir == first.dir
    with open(lcb_copy / "test2.jsonl", "a") as f:
        f.write('{"question_id": "late", "broken": \n')
    second = run(tmp_path, data, monkeypatch)
    assert second.dir != first.dir and second.metrics["n_rejected"] == first.metrics["n_rejected"] + 1
