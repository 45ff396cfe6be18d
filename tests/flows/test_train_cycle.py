"""The whole train cycle through the real CLI: embedded Prefect (the first run), SQLite MLflow, tiny CPU agents.

One module-scoped sequence of runs in a fresh run folder:
  A  fault injected in grading → the run fails, finished stages are persisted;
  B  same command without the fault → only grading and what depends on it run, into A's MLflow run (resumed);
  C  same again → nothing runs, and no MLflow run is added;
  D  a finished stage's folder is deleted, and another's verdicts.parquet is rewritten → both run again (a new MLflow
     run; the rewritten file is named), their dependents come back from cache.
"""

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mars2.procs import kill_group, wait_exit
from tests.flowenv import RANDOM_TEAM, flow_env
from tests.paths import ROOT
from tests.pids import engines_under

SMALL = [*RANDOM_TEAM, "data.n_problems=24", "data.max_train_problems=3", "data.max_eval_problems=3", "search.max_nodes=4",
         "search.max_new_tokens=24", "eval.max_new_tokens=24", "train.train_batch=2", "train.micro_batch=4",
         "train.cycles=2", "grading.time_limit_s=2", "progress_every_s=0.2"]
UPSTREAM_OF_GRADING = {"data", "agents", "rollout"}
DATA_PARALLEL = "agents.members.0.update_procs=2"  # qwen_tiny's updates run on two torchrun ranks, llama_tiny's on one
# the run's CPU budget: 4 cores, whatever the machine has (the flow process and each of the two update ranks get
# their share: 4 and 2 threads); outside every cache key
BUDGET = "cpus=4"


def _run(home: Path, *overrides: str, embedded: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "flows/train_cycle.py", *SMALL, *overrides], cwd=ROOT,
                          env=flow_env(home, embedded=embedded), capture_output=True, text=True, timeout=600)


def _stage_table(home: Path, run_id: str) -> pd.DataFrame:
    return pd.read_parquet(home / "runs" / f"{run_id}.parquet")


def _mlflow(home: Path, sql: str, *args):
    with sqlite3.connect(home / "mlflow.db") as db:
        return db.execute(sql, args).fetchall()


def _latest_run_id(home: Path) -> str:
    return _mlflow(home, "select run_uuid from runs order by start_time desc limit 1")[0][0]


def _run_count(home: Path) -> int:
    return _mlflow(home, "select count(*) from runs")[0][0]


def _snapshot(home: Path, stages) -> dict[str, tuple[int, float]]:
    files = {}
    for stage in stages:
        for p in (home / "artifacts" / stage).rglob("*"):
            if p.is_file():
                st = p.stat()
                files[str(p)] = (st.st_ino, st.st_mtime_ns)
    return files


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    home = tmp_path_factory.mktemp("mars2_home")
    # A as a user's first run (Prefect's temporary server); B-D report to the tests' server (where the Prefect
    # server lives does not change what is cached: the cache is the run folder's)
    a = _run(home, DATA_PARALLEL, BUDGET, "debug.fail_at=grading", embedded=True)
    run_a = _latest_run_id(home)
    status_a = _mlflow(home, "select status from runs where run_uuid=?", run_a)[0][0]
    snap_a = _snapshot(home, UPSTREAM_OF_GRADING)
    b = _run(home, DATA_PARALLEL, BUDGET)
    run_b = _latest_run_id(home)
    snap_b = _snapshot(home, UPSTREAM_OF_GRADING)
    count_b = _run_count(home)
    c = _run(home, DATA_PARALLEL, BUDGET)
    run_c = _latest_run_id(home)
    count_c = _run_count(home)
    grading_dirs = sorted((home / "artifacts" / "grading").iterdir())
    shutil.rmtree(grading_dirs[0])
    tampered = grading_dirs[1] / "verdicts.parquet"
    pd.read_parquet(tampered).assign(reward=1.0).to_parquet(tampered)  # every program "passes"
    d = _run(home, DATA_PARALLEL, BUDGET)
    run_d = _latest_run_id(home)
    return dict(home=home, a=a, b=b, c=c, d=d, ids=(run_a, run_b, run_c, run_d), snaps=(snap_a, snap_b),
                status_a=status_a, counts=(count_b, count_c, _run_count(home)))


def test_a_run_whose_output_is_not_a_terminal_prints_plain_progress_lines(runs):
    import re

    lines = re.findall(r"^(rollout c\d|grading c\d|eval c\d|eval before|update/\w+ c\d)(?:: [\w ]+)?: "
                       r"(?:\d+/\d+ \w+, \d+\.\d \w+/s, \d+ s elapsed, ETA \d+ s|\d+ \w+ so far, \d+\.\d \w+/s, "
                       r"\d+ s elapsed|0/\d+ \w+, \d+ s elapsed|no \w+ done yet, \d+ s elapsed)$",
                       runs["a"].stderr + runs["b"].stderr, re.M)
    # this small run's stages last a second or two each (generation, updates): a few intervals in all
    assert len(lines) >= 3, (runs["a"].stderr + runs["b"].stderr)[-3000:]
    assert "\x1b[" not in runs["b"].stderr  # no live display drawn into a file


def test_injected_fault_fails_the_run_clearly(runs):
    import re

    a = runs["a"]
    assert a.returncode != 0
    assert "fault injected in stage 'grading'" in a.stderr
    assert "run the same command again" in a.stderr
    # quiet: the summary names the failed stage, the console has no traceback, the run's log file has it
    assert any(line.startswith("│ grading-c0 ") and "FAILED" in line for line in a.stderr.splitlines()), a.stderr
    assert "Traceback" not in a.stderr and "Setting accelerator" not in a.stderr + a.stdout
    log = Path(a.stderr.split("The traceback is in ")[1].split()[0].rstrip("."))
    assert log.parent == runs["home"] / "logs" and "StageFault: fault injected in stage 'grading'" in log.read_text()
    # Prefect's INFO lines: in the file, not on the console, each naming its run
    assert re.search(r" - grading-c0: Finished in state Failed", log.read_text()), log.read_text()[-3000:]
    assert re.search(r" - data-\w+: Finished in state (?:Completed|Cached)\(", log.read_text()), log.read_text()[-3000:]
    assert runs["status_a"] == "FAILED"


def test_the_rerun_resumes_the_failed_mlflow_run_and_a_cached_rerun_adds_none(runs):
    run_a, run_b, run_c, run_d = runs["ids"]
    home = runs["home"]
    assert run_b == run_a and "(resumed" in runs["b"].stderr  # one MLflow run for the failed attempt and its fix
    assert _mlflow(home, "select status from runs where run_uuid=?", run_b)[0][0] == "FINISHED"
    tags = dict(_mlflow(home, "select key, value from tags where run_uuid=?", run_b))
    assert tags["mars2.resumed"] == "1" and len(tags["mars2.config_hash"]) == 16
    count_b, count_c, count_d = runs["counts"]
    assert count_b == 1 and count_c == 1 and run_c == run_b  # everything from cache: no second run
    assert "no new MLflow run" in runs["c"].stderr and run_b in runs["c"].stderr  # and it says where the run is
    assert count_d == 2 and run_d != run_b  # a stage ran again: that is a new run


def test_rerun_executes_only_the_failed_stage_and_its_dependents(runs):
    assert runs["b"].returncode == 0, runs["b"].stderr[-3000:]
    table = _stage_table(runs["home"], runs["ids"][1])
    c0 = table[table["cycle"] == 0].set_index("stage")["status"].to_dict()
    assert {s: c0[s] for s in UPSTREAM_OF_GRADING} == {s: "cached" for s in UPSTREAM_OF_GRADING}
    assert c0["grading"] == "ran" and c0["advantage"] == "ran" and c0["eval"] == "ran"
    assert c0["update/qwen_tiny"] == "ran" and c0["update/llama_tiny"] == "ran"
    assert set(table[table["cycle"] == 1]["status"]) == {"ran"}  # cycle 1 never ran before


def test_finished_artefacts_are_not_rewritten(runs):
    snap_a, snap_b = runs["snaps"]
    assert snap_a and set(snap_a) <= set(snap_b)
    assert {k: snap_b[k] for k in snap_a} == snap_a


def test_identical_rerun_executes_nothing(runs):
    assert runs["c"].returncode == 0, runs["c"].stderr[-3000:]
    lines = [line for line in runs["c"].stderr.splitlines() if "✓ ran" in line or "↺ cached" in line]
    assert all("↺ cached" in line for line in lines)
    assert len(lines) == 3 + 2 * 6  # data, agents, eval before + per cycle: rollout, grading, advantage, 2 updates, eval


def test_deleted_or_altered_artefacts_are_rebuilt_and_dependents_stay_cached(runs):
    assert runs["d"].returncode == 0, runs["d"].stderr[-3000:]
    table = _stage_table(runs["home"], runs["ids"][3])
    ran = set(map(tuple, table[table["status"] == "ran"][["cycle", "stage"]].values.tolist()))
    assert ran == {(0, "grading"), (1, "grading")}  # rebuilt identically → their consumers hit cache
    assert "verdicts.parquet (modified)" in runs["d"].stderr
    for verdicts in (runs["home"] / "artifacts" / "grading").glob("*/verdicts.parquet"):
        if ".altered-" not in str(verdicts):
            assert (pd.read_parquet(verdicts)["reward"] < 1).any()  # the computed rewards, not the rewritten ones


def test_mlflow_run_has_params_metrics_tags_and_artefacts(runs):
    home, run_id = runs["home"], runs["ids"][1]
    assert "MLflow run" in runs["b"].stderr and "mlflow ui --backend-store-uri" in runs["b"].stderr
    assert f"/runs/{run_id}?workflowType=machine_learning" in runs["b"].stderr  # the model-training view
    params = dict(_mlflow(home, "select key, value from params where run_uuid=?", run_id))
    assert params["train.cycles"] == "2" and params["agents.members.0.name"] == "qwen_tiny"
    assert params["sandbox.isolation"] in ("bwrap", "process") and params["grading.parity"] == "script"
    tags = dict(_mlflow(home, "select key, value from tags where run_uuid=?", run_id))
    assert len(tags["prefect.flow_run_id"]) == 36
    assert tags["mlflow.source.name"] == "train_cycle.py" and "agents=tiny_cpu" in tags["mlflow.note.content"]
    assert len(tags.get("mlflow.source.git.commit", "0" * 40)) == 40  # a clean clone is a git checkout
    kind = dict(_mlflow(home, "select key, value from experiment_tags"))
    assert kind["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on runs and charts
    from mlflow.tracking import MlflowClient

    inputs = MlflowClient(f"sqlite:///{home / 'mlflow.db'}").get_run(run_id).inputs.dataset_inputs
    assert sorted(i.dataset.name for i in inputs) == ["toy-eval", "toy-train"]
    assert {t.value for i in inputs for t in i.tags if t.key == "mlflow.data.context"} == {"train", "eval"}
    steps = _mlflow(home, "select step from metrics where run_uuid=? and key='eval/qwen_tiny/pass_at_1'", run_id)
    assert sorted(s for (s,) in steps) == [-1, 0, 1]  # -1: the starting weights (eval.before)
    starts = _mlflow(home, "select value from metrics where run_uuid=? and key='engine_starts'", run_id)
    assert starts and all(v <= 2 for (v,) in starts)  # one engine per weight owner per attempt, reused by every stage
    data = _mlflow(home, "select step from metrics where run_uuid=? and key='data/seconds'", run_id)
    assert data == [(0,)]  # logged by the failed attempt, not again by the resumed one (it came from cache)
    keys = {k for (k,) in _mlflow(home, "select distinct key from metrics where run_uuid=?", run_id)}
    assert {"grading/pass_rate", "advantage/mean_reward", "update/qwen_tiny/loss", "eval/team/pass_at_n"} <= keys
    threads = dict(_mlflow(home, "select key, value from metrics where run_uuid=? and key like 'update/%/cpu_threads'",
                           run_id))  # each update's threads: a torchrun rank's share, the flow process's budget
    assert threads == {"update/qwen_tiny/cpu_threads": 2.0, "update/llama_tiny/cpu_threads": 4.0}
    assert params["cpus"] == "4"
    art = home / "mlartifacts"
    assert list(art.rglob("config.yaml")) and list(art.rglob("verdicts.parquet")) and list(art.rglob("summary/*.parquet"))
    assert list(art.rglob("trees.png"))
    # what the MLflow UI can show: a CSV preview beside each table, one readable image per tree, the trees' table
    mine = [p.as_posix().split(f"/{run_id}/artifacts/", 1)[1] for p in art.rglob("*")
            if p.is_file() and f"/{run_id}/artifacts/" in p.as_posix()]
    assert {"cycle_1/grading/verdicts.csv", "cycle_1/rollout/trees.parquet", "cycle_1/rollout/trees.csv",
            "cycle_1/evaluation/results.csv", f"summary/{run_id}.csv", "summary.md"} <= set(mine), sorted(mine)
    assert len([p for p in mine if p.startswith("cycle_1/trees/") and p.endswith(".png")]) == 3  # 3 problems a cycle
    assert "code" in pd.read_csv(next(art.rglob("cycle_1/rollout/trees.csv"))).columns  # token ids left out
    # dataset and parameter counts are params (they never move): the metrics are the numbers that change
    assert int(params["data/n_train"]) > 0 and "agents/qwen_tiny/params" in params
    assert not {k for k in keys if k.startswith(("data/", "agents/"))} - {"data/seconds", "agents/seconds"}
    import json

    (summary,) = [p for p in art.rglob("cycle_1/summary.json") if run_id in str(p)]
    stages = {r["stage"]: r for r in json.loads(summary.read_text())}
    assert {"rollout", "grading", "advantage", "eval"} <= set(stages) and "mean_reward" in stages["advantage"]["metrics"]


def test_the_prefect_run_shows_the_summary_and_links_to_the_mlflow_run(runs):
    """The Prefect flow run page (run B reported to a lasting server): the summary as a markdown artifact, a link
    artifact to the MLflow run, the tag ``mlflow:<run id>``; the MLflow run carries the flow run's URL and the same
    summary as ``summary.md``."""
    import httpx
    from tests.flowenv import prefect_api_url

    home, run_id = runs["home"], runs["ids"][1]
    tags = dict(_mlflow(home, "select key, value from tags where run_uuid=?", run_id))
    flow_run_id, api = tags["prefect.flow_run_id"], prefect_api_url()
    url = tags["prefect.flow_run_url"]  # Prefect's own URL for it (prefect.runtime.flow_run.ui_url)
    assert url.startswith(api.removesuffix("/api") + "/") and url.endswith(f"/flow-run/{flow_run_id}")
    flow_run = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=10).json()
    assert f"mlflow:{run_id}" in flow_run["tags"]
    artifacts = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}},
                           timeout=10).json()
    (summary,) = [a["data"] for a in artifacts if a["data"].startswith("# mars2 train cycle: FINISHED")]
    # the summary and its artefact say what the run is: its preset and the overrides that set it apart
    label = tags["mars2.overrides"]
    assert label != "(none)" and f"tiny_cpu, overrides: {label}" in summary
    (described,) = [a["description"] for a in artifacts if a["data"] == summary]
    assert f"overrides: {label}" in described and tags["mlflow.note.content"].startswith(f"overrides: {label}. ")
    (link,) = [a["data"] for a in artifacts if a["data"].startswith(f"[MLflow run {run_id}](")]  # Prefect's markdown
    url = link.split("](")[1].removesuffix(")")
    assert url.endswith(f"/runs/{run_id}?workflowType=machine_learning") and len(artifacts) == 2
    assert f"MLflow run [{run_id}]({url})" in summary
    assert "| grading " in summary and "**per cycle**" in summary and "**held-out evaluation" in summary
    team = next(line for line in summary.splitlines() if line.startswith("| team"))
    assert team.count("→") == 3  # before → after, as on the console
    (logged,) = [p for p in (home / "mlartifacts").rglob("summary.md") if run_id in str(p)]
    assert logged.read_text() == summary


def test_grading_verdicts_come_from_the_sandbox(runs):
    verdicts = pd.concat(pd.read_parquet(p) for p in (runs["home"] / "artifacts" / "grading").rglob("verdicts.parquet")
                         if ".altered-" not in str(p))  # the folder D's rewritten file was moved to
    assert set(verdicts["status"]) <= {"AC", "WA", "TLE", "RE", "CE", "MLE", "NO_CODE"}
    assert ((verdicts["reward"] == 1.0) == (verdicts["status"] == "AC")).all()
    assert (verdicts["total"] >= 4).all()


def _wait_until(condition, timeout_s: float, what: str) -> None:
    import time

    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.05)


def _start_flow(home: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "MARS2_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_API_URL", None)
    return subprocess.Popen([sys.executable, "flows/train_cycle.py", *SMALL, *overrides], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.slow
def test_a_run_killed_mid_rollout_leaves_no_engine_and_resumes_from_finished_stages(tmp_path):
    """SIGKILL of the flow's process while its engines generate the rollout (no exit handler runs): the kernel stops
    every engine it started, and the rerun reuses every stage that had finished. (SIGTERM mid-rollout:
    tests/flows/test_train_cycle_paradigms.py.)"""
    import signal

    proc = _start_flow(tmp_path, "train.cycles=1", "search.max_new_tokens=64")
    try:
        _wait_until(lambda: engines_under(tmp_path) or proc.poll() is not None, 300, "no engine started")
        assert proc.poll() is None and not list((tmp_path / "artifacts" / "rollout").glob("*/MANIFEST.json"))
        engines = engines_under(tmp_path)
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_exit(proc, 60) == -signal.SIGKILL
        _wait_until(lambda: not engines_under(tmp_path), 20, f"engines {engines} outlived the killed run")
    finally:
        kill_group(proc)  # whatever else of the run is left (the sandbox's workers)
    finished = {p.parent.parent.name for p in (tmp_path / "artifacts").glob("*/*/MANIFEST.json")}
    assert {"data", "agents"} <= finished and "rollout" not in finished

    rerun = _run(tmp_path, "train.cycles=1", "search.max_new_tokens=64")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    table = _stage_table(tmp_path, _latest_run_id(tmp_path)).set_index("stage")["status"]
    assert all(table[s] == "cached" for s in finished if s in table.index), (finished, table.to_dict())
    assert table["rollout"] == "ran"
    leftovers = [p for p in (tmp_path / "artifacts").glob("*/*") if p.name.endswith(".tmp")]
    assert all(not (p / "MANIFEST.json").exists() for p in leftovers)  # partial folders are never final


def test_updates_change_every_agents_weights_through_its_engine(runs):
    """With the DAPO overlong penalty in the reward, trees are not flat even when no program passes yet."""
    import json

    from safetensors.torch import load_file

    home = runs["home"]
    (agents,) = [json.loads(p.read_text()) for p in (home / "artifacts" / "agents").glob("*/MANIFEST.json")]
    last = {}  # each agent's latest step (a step on flat trees alone has zero advantages and moves nothing)
    for p in (home / "artifacts" / "update").glob("*/MANIFEST.json"):
        m = json.loads(p.read_text())
        (owner,) = m["weights"]
        step = m["metrics"].get("update_step", 0.0)
        if step > last.get(owner, (0.0, None))[0]:
            last[owner] = (step, m)
    assert set(last) == {"qwen_tiny", "llama_tiny"}
    stepped = {owner: Path(m["dir"]) / "model" / "model.safetensors" for owner, (_, m) in last.items()}
    assert all(m["metrics"]["grad_norm"] > 0 for o, (_, m) in last.items())
    assert {o: m["metrics"]["processes"] for o, (_, m) in last.items()} == {"qwen_tiny": 2, "llama_tiny": 1}
    assert not any((Path(m["dir"]) / "job").exists() for _, m in last.values())
    for owner, path in stepped.items():
        before = load_file(Path(agents["dir"]) / owner / "model" / "model.safetensors")
        after = load_file(path)
        moved = sum(int(not (before[k] == after[k]).all()) for k in before)
        assert moved > 0, f"{owner}: no weight changed"


def test_every_model_folder_the_run_wrote_gives_the_projects_token_ids(runs):
    """agents and update folders, loaded the standard way (AutoTokenizer on the model folder), tokenize as the
    project's own tokenizer folder does."""
    import json

    from tests.mars2.backends.test_continuous import project_ids

    home = runs["home"]
    (agents,) = [json.loads(p.read_text()) for p in (home / "artifacts" / "agents").glob("*/MANIFEST.json")]
    folders = [("qwen_tiny", Path(agents["dir"]) / "qwen_tiny" / "model"),
               ("llama_tiny", Path(agents["dir"]) / "llama_tiny" / "model")]
    for p in sorted((home / "artifacts" / "update").glob("*/MANIFEST.json")):
        m = json.loads(p.read_text())
        folders += [(owner, Path(m["dir"]) / "model") for owner in m["weights"]]
    assert {owner for owner, _ in folders} == {"qwen_tiny", "llama_tiny"} and len(folders) > 2
    for owner, folder in folders:
        ours, theirs = project_ids(Path(agents["dir"]) / owner / "tokenizer", folder)
        assert ours == theirs, folder


def test_only_each_agents_last_optimizer_state_is_kept(runs):
    """train.keep_optimizer_states=1 (default): the flow deleted cycle 0's ds/ after cycle 1's updates; every model/
    stays complete, and the re-runs above (C: nothing ran; D: one stage ran) did not need the deleted states."""
    import json

    from mars2.train.checkpoints import PRUNED, missing_model_files

    stepped: dict[str, list[dict]] = {}
    for p in (runs["home"] / "artifacts" / "update").glob("*/MANIFEST.json"):
        m = json.loads(p.read_text())
        (owner,) = m["weights"]
        assert missing_model_files(Path(m["weights"][owner]["model_dir"]) if Path(
            m["weights"][owner]["model_dir"]).is_absolute() else Path(m["dir"]) / m["weights"][owner]["model_dir"]) == []
        if m["weights"][owner]["optimizer_dir"] == "ds":
            stepped.setdefault(owner, []).append(m)
    assert set(stepped) == {"qwen_tiny", "llama_tiny"}
    for owner, records in stepped.items():
        records.sort(key=lambda m: m["metrics"]["update_step"])
        *older, last = records
        assert (Path(last["dir"]) / "ds").is_dir() and not (Path(last["dir"]) / PRUNED).exists()
        assert older, f"{owner} stepped once only: nothing to prune"
        assert all(not (Path(m["dir"]) / "ds").exists() and (Path(m["dir"]) / PRUNED).exists() for m in older)


def test_the_console_has_one_line_per_stage_and_no_prefect_chatter(runs):
    """No bar per wave or batch, no Prefect INFO lines (PREFECT_LOGGING_LEVEL=INFO brings them back); the live
    display of each stage draws only on a terminal (here: only its plain lines, tested above)."""
    import re

    plain = re.compile(r"^[\w/ ]+ c?\w*(: [\w ]+)?: \d+/[\d?]+ \w+, \d+\.\d \w+/s, \d+ s elapsed, ETA")
    console = "\n".join(line for line in (runs["b"].stdout + runs["b"].stderr).splitlines() if not plain.match(line))
    assert "generate:" not in console and "| INFO    |" not in console and "grading:" not in console
    stage_lines = [line for line in console.splitlines() if "✓ ran" in line or "↺ cached" in line]
    assert len(stage_lines) == 3 + 2 * 6  # data, agents, eval before + per cycle: rollout, grading, advantage, 2 updates, eval
    per_cycle = console[console.index("per cycle"):].splitlines()
    assert [line.split("│")[1].strip() for line in per_cycle if line.startswith("│")][:3] == ["before", "0", "1"]
    held_out = console[console.index("held-out evaluation"):].splitlines()
    team = next(line for line in held_out if line.startswith("│ team"))
    assert "before → after" in console and team.count("→") == 3  # Pass@1, Pass@1(MCTS), Pass@N, each before → after


def test_the_mlflow_ui_serves_the_run_its_datasets_curves_and_artefacts(runs):
    """`mlflow ui` on the run folder's store (what the summary tells a user to start): everything through its REST
    API, as the browser gets it."""
    import contextlib
    import json
    import signal
    import time
    import urllib.request

    from tests.flowenv import free_port

    home, run_id = runs["home"], runs["ids"][1]
    port = free_port()
    log = (home / "mlflow-ui.log").open("w")
    ui = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
                           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], cwd=home, stdout=log,
                          stderr=subprocess.STDOUT,
                          start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def get(path: str):
        with urllib.request.urlopen(base + path, timeout=10) as r:
            body = r.read()
        return json.loads(body) if path.startswith("/api/") else body.decode()

    try:
        deadline = time.time() + 120
        while True:
            assert ui.poll() is None and time.time() < deadline, (home / "mlflow-ui.log").read_text()[-2000:]
            with contextlib.suppress(OSError):
                if get("/health") == "OK":
                    break
            time.sleep(0.5)
        assert "<html" in get("/")
        exp = get("/api/2.0/mlflow/experiments/get-by-name?experiment_name=mars2")["experiment"]
        assert {t["key"]: t["value"] for t in exp["tags"]}["mlflow.experimentKind"] == "custom_model_development"
        run = get(f"/api/2.0/mlflow/runs/get?run_id={run_id}")["run"]
        assert run["info"]["status"] == "FINISHED"
        assert sorted(d["dataset"]["name"] for d in run["inputs"]["dataset_inputs"]) == ["toy-eval", "toy-train"]
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        assert tags["mlflow.source.name"] == "train_cycle.py" and "mlflow.note.content" in tags
        history = get(f"/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key=eval/team/pass_at_1")
        assert sorted({m["step"] for m in history["metrics"]}) == [-1, 0, 1]  # before, then one point per cycle
        files = {f["path"] for f in get(f"/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=cycle_1/rollout")["files"]}
        assert {"cycle_1/rollout/trees.png"} <= files
        assert "agents:" in get(f"/get-artifact?path=config.yaml&run_uuid={run_id}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(30)
