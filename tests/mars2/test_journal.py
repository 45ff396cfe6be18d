"""The stage journal (mars2/journal.py): finished units kept atomically, read back only by the same stage key,
and a damaged shard redone instead of trusted."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from mars2.journal import Journal, journal_dir


def _rows(pid: str, n: int = 3) -> pd.DataFrame:
    return pd.DataFrame({"problem_id": [pid] * n, "node_id": list(range(n)), "code": [None, "print(1)", "x"],
                         "response_ids": [[1, 2], [], [3]], "logprobs": [[-0.5, -1.0], [], [-0.25]],
                         "score": [0.0, 0.5, 1.0]})


def test_units_come_back_as_written_and_the_journal_goes_when_closed(tmp_path):
    journal = Journal(journal_dir(tmp_path / "rollout" / "abc"), "k" * 64)
    assert journal.folder == tmp_path / "rollout" / "abc.journal"
    assert journal.finished("trees") == {}
    journal.write("trees", "p/1", _rows("p/1"))
    journal.write("trees", "p 2", _rows("p 2"))
    again = Journal(journal.folder, "k" * 64).finished("trees")  # a later run of the same key
    assert sorted(again) == ["p 2", "p/1"]
    got = again["p/1"]
    assert pd.isna(got["code"][0]) and got["code"].tolist()[1:] == ["print(1)", "x"]  # Parquet's null
    assert got["score"].tolist() == [0.0, 0.5, 1.0]
    assert [list(v) for v in got["response_ids"]] == [[1, 2], [], [3]]
    assert np.allclose(got["logprobs"][0], [-0.5, -1.0])
    journal.close()
    assert not journal.folder.exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "other_unit"])
def test_a_damaged_shard_is_deleted_and_its_unit_redone(tmp_path, caplog, damage):
    journal = Journal(tmp_path / "j", "key")
    journal.write("trees", "a", _rows("a"))
    journal.write("trees", "b", _rows("b"))
    shard_a, shard_b = sorted((tmp_path / "j" / "trees").glob("*.parquet"),
                              key=lambda p: Journal(tmp_path / "j", "key")._read(p)[0])
    if damage == "flip":
        data = bytearray(shard_a.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard_a.write_bytes(bytes(data))
    elif damage == "truncate":
        shard_a.write_bytes(shard_a.read_bytes()[:-40])
    else:  # b's bytes under a's name: whole and readable, but it says it is b
        shard_b_name = shard_b.name
        shard_a.write_bytes(shard_b.read_bytes())
        shard_a = shard_a.rename(shard_a.with_name(shard_a.name.split(".")[0] + "." + shard_b_name.split(".")[1]
                                                   + ".parquet"))
    with caplog.at_level(logging.WARNING, logger="mars2.journal"):
        kept = Journal(tmp_path / "j", "key").finished("trees")
    assert sorted(kept) == ["b"] and not shard_a.exists()
    assert "is corrupt" in caplog.text and "its unit runs again" in caplog.text


def test_a_journal_of_another_key_is_never_read(tmp_path, caplog):
    Journal(tmp_path / "j", "old key").write("trees", "a", _rows("a"))
    with caplog.at_level(logging.WARNING, logger="mars2.journal"):
        journal = Journal(tmp_path / "j", "new key")
    assert journal.finished("trees") == {} and "belongs to another stage key" in caplog.text
    assert (tmp_path / "j" / "KEY").read_text() == "new key"


def test_chunks_an_interrupted_run_finished_are_not_worked_again_and_the_result_is_the_same(tmp_path):
    from mars2.journal import in_chunks

    rows = pd.DataFrame({"x": range(10)})
    worked = []

    def work(part, progress):
        worked.append(int(part["x"].iloc[0]))
        if len(worked) == 3 and stop:
            raise KeyboardInterrupt  # a kill after two chunks
        progress(len(part), len(part))
        return part.assign(y=part["x"] * 2)

    stop = True
    with pytest.raises(KeyboardInterrupt):
        in_chunks(Journal(tmp_path / "j", "key"), "v", rows, work, size=3)
    stop, worked, seen = False, [], []
    table, resumed = in_chunks(Journal(tmp_path / "j", "key"), "v", rows, work, lambda d, t: seen.append((d, t)),
                               size=3)
    assert worked == [6, 9] and resumed == 2  # chunks 0:3 and 3:6 were kept
    assert table["y"].tolist() == [2 * x for x in range(10)] and seen[-1] == (10, 10) and seen[0] == (9, 10)
    whole, none = in_chunks(Journal(tmp_path / "fresh", "key"), "v", rows, work, size=3)
    assert whole.equals(table) and none == 0
