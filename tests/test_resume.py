"""A long stage resumes where it stopped: a flow killed with SIGKILL half way through its rollout, run again with the
same command, keeps the trees it had finished, says how many, builds only the others and ends with the rollout table
an uninterrupted run writes (the transformers engine on CPU draws the same tokens; log-probs agree to float
rounding). Grading and evaluation resume through
the same journal (tests/test_journal.py checks its chunks)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flowenv import RANDOM_TEAM, flow_env

ROOT = Path(__file__).resolve().parents[1]
# 24 trees of 4 nodes, 4 at a time (search.trees_in_flight): trees finish all along the rollout; the flow stops at
# grading (fault injection), so each run is data, agents and the rollout
RUN = [*RANDOM_TEAM, "train.cycles=1", "data.max_train_problems=24", "search.max_nodes=4", "search.trees_in_flight=4",
       "search.max_new_tokens=32", "eval.before=false", "progress_every_s=0.5", "debug.fail_at=grading"]
PROGRESS = re.compile(r"rollout c0: (\d+)/(\d+) nodes")

pytestmark = pytest.mark.slow


def _run(home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "flows/train_cycle.py", *RUN], cwd=ROOT, env=flow_env(home),
                          capture_output=True, text=True, timeout=900)


def _kill_at(home: Path, fraction: float) -> str:
    """Start the run and SIGKILL it once its rollout's progress line passes ``fraction``; its stderr so far."""
    run = subprocess.Popen([sys.executable, "flows/train_cycle.py", *RUN], cwd=ROOT, env=flow_env(home),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        deadline = time.monotonic() + 600
        for line in run.stderr:
            seen.append(line)
            m = PROGRESS.search(line)
            if m and int(m[1]) >= fraction * int(m[2]):
                break
            assert time.monotonic() < deadline, "the rollout never got that far"
        else:
            pytest.fail("the run ended before it was killed:\n" + "".join(seen)[-3000:])
    finally:
        run.send_signal(signal.SIGKILL)
        run.communicate()
    return "".join(seen)


def _rollout_table(home: Path) -> Path:
    (folder,) = [p for p in (home / "artifacts" / "rollout").iterdir() if (p / "MANIFEST.json").exists()]
    return folder / "trees.parquet"


def test_a_rollout_killed_half_way_resumes_its_finished_trees_and_ends_as_an_uninterrupted_run(tmp_path):
    whole = _run(tmp_path / "whole")
    assert "fault injected in stage 'grading'" in whole.stderr, whole.stderr[-3000:]
    assert "resumed" not in whole.stderr

    killed = tmp_path / "killed"
    before = _kill_at(killed, 0.4)
    assert "resumed" not in before
    journals = list((killed / "artifacts" / "rollout").glob("*.journal"))
    assert len(journals) == 1 and not list((killed / "artifacts" / "rollout").glob("*/MANIFEST.json"))
    shards = list((journals[0] / "trees").glob("*.parquet"))
    assert 0 < len(shards) < 24  # finished trees kept, the others not

    again = _run(killed)
    assert "fault injected in stage 'grading'" in again.stderr, again.stderr[-3000:]
    m = re.search(r"rollout c0: resumed (\d+)/24 trees", again.stderr)
    assert m and int(m[1]) >= len(shards), again.stderr[-3000:]
    built = [int(x[1]) for x in PROGRESS.finditer(again.stderr)]
    totals = {int(x[2]) for x in PROGRESS.finditer(again.stderr)}
    assert totals == {4 * (24 - int(m[1]))}, totals  # only the unfinished trees' nodes are built
    assert re.search(r"✓ ran .*rollout .*resumed \d+/24 trees", again.stderr)
    assert not built or max(built) <= 4 * (24 - int(m[1]))

    resumed, uninterrupted = _rollout_table(killed), _rollout_table(tmp_path / "whole")
    assert resumed.parent.name == uninterrupted.parent.name  # the same stage key
    a, b = pd.read_parquet(resumed), pd.read_parquet(uninterrupted)
    assert len(a) == 24 * 4
    # node for node the same trees, prompts, tokens, programs and verdicts; the rollout log-probs equal up to float
    # rounding (a row's arithmetic is batched with other trees' rows: 5e-7 measured)
    pd.testing.assert_frame_equal(a.drop(columns="logprobs"), b.drop(columns="logprobs"))
    assert all(np.allclose(x, y, rtol=0, atol=1e-5) for x, y in zip(a["logprobs"], b["logprobs"], strict=True))
    assert not list((killed / "artifacts" / "rollout").glob("*.journal"))  # gone once the folder is complete


EVAL = [*RANDOM_TEAM, "data.max_eval_problems=12", "eval.max_nodes=4", "eval.n_samples=1", "eval.per_agent_trees=false",
        "eval.tplus=[false]", "search.trees_in_flight=2", "progress_every_s=0.5"]
EVAL_PROGRESS = re.compile(r"eval c0: generate: (\d+)/(\d+) programs")


def test_an_evaluation_killed_in_its_trees_resumes_its_samples_and_finished_trees(tmp_path):
    """flows/evaluate.py killed with SIGKILL once its samples are in and some trees are finished: the same command
    keeps them (each problem's samples and each finished tree), says how many, and writes the results an
    uninterrupted evaluation writes."""
    def start(home: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "flows/evaluate.py", *EVAL], cwd=ROOT, env=flow_env(home),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    killed = tmp_path / "killed"
    run, seen = start(killed), []
    try:
        for line in run.stderr:  # samples: 12 problems x 2 agents = 24 programs, then 12 trees of 4 nodes
            seen.append(line)
            m = EVAL_PROGRESS.search(line)
            if m and int(m[1]) >= 24 + 20:
                break
        else:
            pytest.fail("the evaluation ended before it was killed:\n" + "".join(seen)[-3000:])
    finally:
        run.send_signal(signal.SIGKILL)
        run.communicate()
    again = subprocess.run([sys.executable, "flows/evaluate.py", *EVAL], cwd=ROOT, env=flow_env(killed),
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    m = re.search(r"eval c0: resumed (\d+)/24 problems' samples and trees", again.stderr)
    assert m and int(m[1]) > 12, again.stderr[-3000:]  # every problem's samples and at least one tree

    whole = subprocess.run([sys.executable, "flows/evaluate.py", *EVAL], cwd=ROOT, env=flow_env(tmp_path / "whole"),
                           capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0 and "resumed" not in whole.stderr, whole.stderr[-3000:]
    folders = [[p for p in (home / "artifacts" / "evaluation").iterdir() if (p / "MANIFEST.json").exists()]
               for home in (killed, tmp_path / "whole")]
    (a,), (b,) = folders
    assert a.name == b.name  # the same stage key
    for table in ("samples", "results"):
        pd.testing.assert_frame_equal(pd.read_parquet(a / f"{table}.parquet"), pd.read_parquet(b / f"{table}.parquet"))
    trees_a, trees_b = (pd.read_parquet(x / "eval_trees.parquet") for x in (a, b))
    pd.testing.assert_frame_equal(trees_a, trees_b)
    assert not list((killed / "artifacts" / "evaluation").glob("*.journal"))
