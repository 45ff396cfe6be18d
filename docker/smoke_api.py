"""What docker/smoke.sh asks the stack, through the servers' REST APIs only (Python's standard library, no volume).

    python3 docker/smoke_api.py auth                      # each API refuses an anonymous call, accepts ours
    python3 docker/smoke_api.py deployments               # flows/deploy.py's deployments are registered
    python3 docker/smoke_api.py run '["train.cycles=1"]'  # start train-cycle/cpu, wait; prints the flow run id
    python3 docker/smoke_api.py check <flow run id> ran|cached

Credentials and addresses from the environment: PREFECT_API_URL, PREFECT_AUTH_STRING, MLFLOW_TRACKING_URI,
MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD. Exit status 1 with a message when a check fails.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

PREFECT = os.environ.get("PREFECT_API_URL", "http://127.0.0.1:4200/api").rstrip("/")
MLFLOW = os.environ.get("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000").rstrip("/")
DEPLOYMENTS = ("train-cycle/cpu", "sweep/cpu", "stage/cpu", "stage/gpu")
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


class CheckFailed(Exception):
    pass


def basic(credentials: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


def prefect_auth() -> dict[str, str]:
    return basic(os.environ["PREFECT_AUTH_STRING"])


def mlflow_auth() -> dict[str, str]:
    return basic(f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ['MLFLOW_TRACKING_PASSWORD']}")


def call(url: str, body: object | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """HTTP status and body; a POST when ``body`` is given (JSON)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def ok(url: str, body: object | None = None, headers: dict[str, str] | None = None) -> object:
    status, out = call(url, body, headers)
    if status != 200 and status != 201:
        raise CheckFailed(f"{url}: HTTP {status}: {out[:300]!r}")
    return json.loads(out) if out else None


def prefect(path: str, body: object | None = None) -> object:
    return ok(PREFECT + path, body, prefect_auth())


def mlflow(path: str, body: object | None = None) -> object:
    return ok(MLFLOW + path, body, mlflow_auth())


# ---------------------------------------------------------------- checks

def check_auth() -> None:
    """Anonymous and wrong-credential calls are refused (401), ours pass; health stays open for probes."""
    probes = [
        ("prefect", PREFECT + "/flows/filter", {}, prefect_auth(), basic("admin:wrong")),
        ("mlflow", MLFLOW + "/api/2.0/mlflow/experiments/search?max_results=1", None, mlflow_auth(),
         basic("admin:wrong")),
    ]
    for name, url, body, good, bad in probes:
        for label, headers, want in (("anonymous", {}, 401), ("wrong password", bad, 401), ("authenticated", good, 200)):
            status, _ = call(url, body, headers)
            if status != want:
                raise CheckFailed(f"{name}: {label} request got HTTP {status}, expected {want}")
            print(f"auth: {name} {label}: HTTP {status}")
    for url in (PREFECT + "/health", MLFLOW + "/health"):
        status, _ = call(url)
        if status != 200:
            raise CheckFailed(f"{url}: HTTP {status} (health must stay open for probes)")


def check_deployments() -> None:
    for name in DEPLOYMENTS:
        dep = prefect(f"/deployments/name/{name}")
        print(f"deployment {name}: pool {dep['work_pool_name']}")


def run_deployment(overrides: list[str], timeout_s: float) -> str:
    """Start ``train-cycle/cpu`` with ``overrides`` as a person does from the UI, wait for its final state."""
    dep = prefect("/deployments/name/train-cycle/cpu")
    run = prefect(f"/deployments/{dep['id']}/create_flow_run", {"parameters": {"overrides": overrides}})
    print(f"flow run {run['name']} ({run['id']}) submitted", file=sys.stderr)
    deadline = time.monotonic() + timeout_s
    while True:
        state = prefect(f"/flow_runs/{run['id']}")["state"]
        if state and state["type"] in FINAL:
            break
        if time.monotonic() > deadline:
            raise CheckFailed(f"flow run {run['id']} still {state and state['name']} after {timeout_s:.0f}s")
        time.sleep(3)
    if state["type"] != "COMPLETED":
        logs = prefect("/logs/filter", {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200})
        tail = "\n".join(entry["message"] for entry in logs)[-4000:]
        raise CheckFailed(f"flow run {run['id']} ended {state['name']}: {state.get('message')}\n{tail}")
    return run["id"]


def mlflow_runs_of(flow_run_id: str) -> list[dict]:
    exp = mlflow("/api/2.0/mlflow/experiments/get-by-name?experiment_name=mars2")["experiment"]
    return mlflow("/api/2.0/mlflow/runs/search", {
        "experiment_ids": [exp["experiment_id"]],
        "filter": f"tags.`prefect.flow_run_id` = '{flow_run_id}'"}).get("runs", [])


def mlflow_run_of(flow_run_id: str) -> dict:
    found = mlflow_runs_of(flow_run_id)
    if len(found) != 1:
        raise CheckFailed(f"{len(found)} MLflow runs tagged prefect.flow_run_id={flow_run_id}")
    return found[0]


def artefact_paths(run_id: str, path: str = "") -> list[str]:
    query = urllib.parse.urlencode({"run_id": run_id, **({"path": path} if path else {})})
    files = mlflow(f"/api/2.0/mlflow/artifacts/list?{query}").get("files", [])
    out = []
    for f in files:
        out.extend(artefact_paths(run_id, f["path"]) if f["is_dir"] else [f["path"]])
    return out


def artefact(run: dict, path: str) -> bytes:
    """Download through the server's artefact proxy (``mlflow-artifacts:/<exp>/<run>/artifacts``)."""
    root = run["info"]["artifact_uri"]
    if not root.startswith("mlflow-artifacts:/"):
        raise CheckFailed(f"artefacts are not served by the tracking server: {root}")
    status, body = call(f"{MLFLOW}/api/2.0/mlflow-artifacts/artifacts/{root.split(':/', 1)[1].lstrip('/')}/{path}",
                        headers=mlflow_auth())
    if status != 200:
        raise CheckFailed(f"artefact {path}: HTTP {status}")
    return body


def check_cached(flow_run_id: str) -> None:
    """A second start of the same command: every Prefect task run is Cached, and MLflow got no new run (the first
    start's run stands for it)."""
    tasks = prefect("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})
    states = {t["name"]: t["state"]["name"] for t in tasks}
    if not tasks or set(states.values()) != {"Cached"}:
        raise CheckFailed(f"second start: Prefect task runs not all Cached: {states}")
    found = mlflow_runs_of(flow_run_id)
    if found:
        raise CheckFailed(f"second start logged {len(found)} MLflow run(s); a fully cached re-run must log none")
    print(f"no new mlflow run; prefect task runs: " + ", ".join(f"{n}={s}" for n, s in sorted(states.items())))


def check_run(flow_run_id: str, expect: str) -> None:
    """MLflow has the run with params, metrics and artefacts; Prefect shows one completed task run per stage, and
    every stage ``ran`` (first start) or came back ``cached`` (second start, :func:`check_cached`)."""
    if expect == "cached":
        check_cached(flow_run_id)
        return
    run = mlflow_run_of(flow_run_id)
    info, data = run["info"], run["data"]
    params, metrics = data.get("params", []), data.get("metrics", [])
    if info["status"] != "FINISHED" or len(params) < 20 or not metrics:
        raise CheckFailed(f"MLflow run {info['run_id']}: {info['status']}, {len(params)} params, {len(metrics)} metrics")
    files = artefact_paths(info["run_id"])
    if "config.yaml" not in files or "cycle_0/summary.json" not in files:
        raise CheckFailed(f"MLflow run {info['run_id']} artefacts: {files}")
    config = artefact(run, "config.yaml").decode()
    if "train" not in config:
        raise CheckFailed("config.yaml artefact has no train section")
    stages = json.loads(artefact(run, "cycle_0/summary.json"))
    status = {row["stage"]: row["status"] for row in stages}
    if not status or set(status.values()) != {expect}:
        raise CheckFailed(f"stages of cycle 0: {status}, expected all {expect}")

    tasks = prefect("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})
    states = {t["name"]: t["state"]["name"] for t in tasks}
    if any(t["state"]["type"] != "COMPLETED" for t in tasks):
        raise CheckFailed(f"Prefect task runs not all completed: {states}")
    if len(tasks) < len(status):
        raise CheckFailed(f"Prefect shows {len(tasks)} task runs for {len(status)} stages: {states}")
    if expect == "cached" and set(states.values()) != {"Cached"}:
        raise CheckFailed(f"second start: Prefect task runs not all Cached: {states}")
    print(f"mlflow run {info['run_id']}: {len(params)} params, {len(metrics)} metrics, {len(files)} artefacts; "
          f"stages {expect}: {', '.join(status)}; prefect task runs: "
          + ", ".join(f"{n}={s}" for n, s in sorted(states.items())))


def main(argv: list[str]) -> int:
    try:
        if argv[0] == "auth":
            check_auth()
        elif argv[0] == "deployments":
            check_deployments()
        elif argv[0] == "run":
            print(run_deployment(json.loads(argv[1]), float(argv[2]) if len(argv) > 2 else 1800))
        elif argv[0] == "check":
            check_run(argv[1], argv[2])
        else:
            raise SystemExit(__doc__)
    except CheckFailed as e:
        print(f"smoke: FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
