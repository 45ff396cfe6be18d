"""A long stage resumes where it stopped: a process killed with SIGKILL part way, run again with the same command,
keeps what it had finished, says how many, does only the rest and ends with what an uninterrupted run writes
(the transformers engine on CPU draws the same tokens; log-probs agree to float rounding): the rollout's trees and the
evaluation's samples and trees (real flows), the gate's generation phases (a real flow), and grading's chunks of
programs (a real process grading real programs in the sandbox; the random team's flows write no code to grade)."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.flowenv import RANDOM_TEAM, flow_env
from tests.paths import ROOT

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
    # only the unfinished trees' nodes are built (every progress line says so; the last few trees may finish before
    # the first line, 0.5 s in: the clean clone's slow group at 1510e5f resumed 19/24 and printed none)
    assert totals <= {4 * (24 - int(m[1]))}, totals
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


def _kill_once_kept(run: subprocess.Popen, folder: Path, shards: str, timeout_s: float) -> None:
    """SIGKILL ``run`` as soon as its journal holds a shard (``folder.glob(shards)``); it must not end before."""
    try:
        deadline = time.monotonic() + timeout_s
        while not list(folder.glob(shards)):
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no unit was ever kept"
            time.sleep(0.05)
    finally:
        run.send_signal(signal.SIGKILL)
        run.communicate()


GRADE = """
import sys
import pandas as pd
from mars2.config import GradingConfig
from mars2.data.lcb import load_problems
from mars2.data.toy import toy_benchmark, toy_reference_solutions
from mars2.journal import Journal, in_chunks
from mars2.rl.verdicts import hidden_test_verdicts

folder, out = sys.argv[1], sys.argv[2]
problems, _ = load_problems(toy_benchmark(8, seed=0), source="toy")
refs = toy_reference_solutions(8, 0)
slow = "import time\\ntime.sleep(0.15)\\n"  # a program that takes its time, so the kill lands mid-chunk
codes = [slow + refs[p.id] if i % 3 == 0 else slow + "print(0)" if i % 3 == 1 else "print(" for i, p in
         enumerate(problems * 9)]
rows = pd.DataFrame({"problem_id": [p.id for p in problems * 9], "node_id": range(72), "code": codes})
by_id = {p.id: p for p in problems}

def chunk(part, progress):  # the grading stage's unit of work, as tasks/grading.py does it
    return hidden_test_verdicts(part, by_id, GradingConfig(workers=2, isolation="process"), progress=progress)

table, resumed = in_chunks(Journal(folder, "key"), "verdicts", rows, chunk, size=18)
table.to_parquet(out)
print(resumed)
"""


def test_grading_killed_between_chunks_keeps_the_chunks_it_finished_and_grades_the_same_verdicts(tmp_path):
    """A real process grading 72 real programs in the sandbox (4 chunks), killed with SIGKILL once its first chunk is
    in the journal: run again, it keeps the finished chunks (no torn shard is trusted), grades only the rest, and
    its verdicts are those of an uninterrupted run."""
    def grade(folder: Path, out: Path, **kw):
        return subprocess.Popen([sys.executable, "-c", GRADE, str(folder), str(out)], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

    journal = tmp_path / "killed.journal"
    _kill_once_kept(grade(journal, tmp_path / "unused.parquet"), journal, "verdicts/*.parquet", 300)
    kept = len(list(journal.glob("verdicts/*.parquet")))
    assert 1 <= kept < 4 and not (tmp_path / "unused.parquet").exists()
    again = grade(journal, tmp_path / "resumed.parquet")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert kept <= int(out.split()[-1]) < 4  # chunks resumed: the kept ones (a chunk may have landed after the poll)
    whole = grade(tmp_path / "whole.journal", tmp_path / "whole.parquet")
    out, err = whole.communicate(timeout=300)
    assert whole.returncode == 0 and int(out.split()[-1]) == 0, err[-3000:]
    resumed, uninterrupted = pd.read_parquet(tmp_path / "resumed.parquet"), pd.read_parquet(tmp_path / "whole.parquet")
    assert {"AC", "WA", "CE"} <= set(uninterrupted["status"])  # real verdicts of each kind
    pd.testing.assert_frame_equal(resumed, uninterrupted)


GATE = [*RANDOM_TEAM, "data.n_problems=24", "gate.max_problems=8", "gate.n_fresh=4", "gate.n_parents=1",
        "gate.n_boot=200", "search.max_new_tokens=24", "grading.time_limit_s=2"]


def test_a_gate_killed_after_a_generation_phase_resumes_the_phases_it_finished(tmp_path):
    """flows/gate.py on the random tiny team, killed with SIGKILL once a generation phase (fresh, pool, each agent's
    refines) is in its journal: the same command keeps the finished phases, says how many, and writes the attempts and
    the table an uninterrupted gate writes, whose figures reach MLflow."""
    def start(home: Path, **kw) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "flows/gate.py", *GATE], cwd=ROOT, env=flow_env(home),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)

    killed = tmp_path / "killed"
    _kill_once_kept(start(killed), killed / "artifacts" / "gate", "*.journal/attempts/*.parquet", 600)
    (journal,) = (killed / "artifacts" / "gate").glob("*.journal")
    kept = len(list(journal.glob("attempts/*.parquet")))
    again = start(killed)
    _, err = again.communicate(timeout=900)
    assert again.returncode == 0, err[-3000:]
    m = re.search(r"gate: resumed (\d+) finished phases and chunks", err)
    assert m and int(m[1]) >= kept, err[-3000:]
    assert not journal.exists()  # gone once the folder is complete
    whole = start(tmp_path / "whole")
    _, err = whole.communicate(timeout=900)
    assert whole.returncode == 0 and "resumed" not in err, err[-3000:]
    # the random team's refines never pass: the gate does not, the summary says so, MLflow has the figures and the
    # attempts (every fresh program is a parent: 1 per author and problem, refined by both agents)
    assert "Does not pass" in err and "qwen_tiny-refines-llama_tiny" in err
    with sqlite3.connect(tmp_path / "whole" / "mlflow.db") as db:
        metrics = dict(db.execute("select key, value from latest_metrics").fetchall())
    assert metrics["gate/passes"] == 0.0 and metrics["gate/all/attempts"] == 8 * 2 * 2
    artefacts = {p.name for p in (tmp_path / "whole" / "mlartifacts").rglob("*") if p.is_file()}
    assert {"gate.md", "attempts.parquet", "attempts.csv", "summary.md"} <= artefacts
    (a,), (b,) = ([p for p in (home / "artifacts" / "gate").iterdir() if (p / "MANIFEST.json").exists()]
                  for home in (killed, tmp_path / "whole"))
    assert a.name == b.name  # the same stage key
    for table in ("attempts", "gate"):
        pd.testing.assert_frame_equal(pd.read_parquet(a / f"{table}.parquet"), pd.read_parquet(b / f"{table}.parquet"))
