"""What a person sees of a run on its Prefect flow run page: mars2's own warnings in the run's logs (the summary and
MLflow link artifacts of a whole run are checked by tests/flows/test_train_cycle.py)."""

import subprocess
import sys

import httpx

from tests.flowenv import flow_env, prefect_api_url
from tests.paths import ROOT


SCRIPT = """
from pipeline.runtime import configure_process
configure_process()
from prefect import flow, task
from prefect.runtime import flow_run
from mars2.sandbox.isolation import warn_once_if_weaker
from pipeline.config import warn_in_flow_run

@task
def grade():  # what the grading stage logs when bubblewrap is unavailable
    warn_once_if_weaker("process", {"bwrap": False, "bwrap_error": "no user namespaces", "process_gaps": []}, "auto")

@flow
def run():
    warn_in_flow_run("plan of qwen: ZeRO-3 on one GPU")
    grade()
    return str(flow_run.id)

warn_in_flow_run("outside any flow run: not logged")
print("ID=" + run())
"""


def test_mars2_warnings_reach_the_prefect_runs_logs(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=flow_env(tmp_path), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    flow_run_id = out.stdout.split("ID=")[1].strip()
    logs = httpx.post(f"{prefect_api_url()}/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}},
                      timeout=10).json()
    warnings = {(r["name"], r["message"].split(".")[0]) for r in logs if r["level"] == 30}
    assert ("pipeline.config", "plan of qwen: ZeRO-3 on one GPU") in warnings, logs
    assert ("mars2.sandbox.isolation", "SANDBOX: untrusted programs are graded at the 'process' isolation level "
            "(isolation=auto; bubblewrap: no user namespaces)") in warnings, logs
    sandbox = next(r for r in logs if r["name"] == "mars2.sandbox.isolation")
    assert sandbox["task_run_id"] is not None  # on the grading task's line of the run's logs
    assert "outside any flow run" not in out.stderr  # a config check before the flow starts logs nothing
    assert out.stderr.count("plan of qwen") == 1  # on the console once, as well as in the run's logs
