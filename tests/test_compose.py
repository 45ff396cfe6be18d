"""The team stack (docker-compose.yml + docker/) is wired the way the pipeline needs it.

No Docker engine is needed: the compose file is read with PyYAML after Compose's own ``${VAR}`` interpolation
with the values of ``.env.example`` (secrets live in a git-ignored ``.env``; none is written in the repository).
If a Compose v2 CLI is present (``docker compose`` or a standalone v2 ``docker-compose``), ``config -q``
validates it against the Compose spec as well (it needs no engine); otherwise that one test is skipped.
If Postgres' server binaries are installed, ``postgres-init.sql`` is run against a throw-away cluster.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
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


_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(text: str, values: dict[str, str]) -> str:
    """Compose's variable substitution: ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` (and ``-``/``?``
    without the colon); ``$$`` is a literal ``$``. A required variable that is missing raises."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2), m.group(3)
        value = values.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op and op.endswith("?") and unset:
            raise KeyError(f"required variable {name} is not set: {arg}")
        if op and op.endswith("-") and unset:
            return arg
        return value or ""

    return _VAR.sub(sub, text)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(interpolate(COMPOSE.read_text(), env_file(ENV_EXAMPLE)))


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def env(service: dict) -> dict[str, str]:
    """``environment`` as a dict, whether written as a mapping or as a ``KEY=VALUE`` list."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, None) for item in raw)
    return {k: (None if v is None else str(v)) for k, v in raw.items()}


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
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {name: "service_started" for name in raw}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in raw.items()}


def mount_targets(service: dict) -> dict[str, str]:
    """Container path -> source (volume name or host path) for the short volume syntax."""
    out = {}
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out[v["target"]] = v.get("source")
        else:
            parts = v.split(":")
            out[parts[1]] = parts[0]
    return out


def published_container_ports(service: dict) -> set[int]:
    return {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports") or []}


def prefect_port(services) -> int:
    server = services["prefect-server"]
    args = argv(server)
    if "--port" in args:
        return int(option(args, "--port"))
    return int(env(server).get("PREFECT_SERVER_API_PORT") or 4200)


def mlflow_port(services) -> int:
    args = argv(services["mlflow"])
    return int(option(args, "--port")) if "--port" in args else 5000


# ---------------------------------------------------------------- services and wiring

def test_services_exist(services):
    for name in ("postgres", *IMAGE_SERVICES):
        assert name in services, f"service {name!r} missing"


def test_image_services_build_from_docker_dockerfile(services):
    for name in IMAGE_SERVICES:
        build = services[name].get("build")
        assert build, f"{name} has no build section"
        context = ROOT / build.get("context", ".")
        assert (context / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE.resolve(), name


def test_postgres_service(services):
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:16")
    assert "/var/lib/postgresql/data" in mount_targets(pg), "postgres data must live on a volume"
    test = pg["healthcheck"]["test"]
    assert "pg_isready" in (test if isinstance(test, str) else " ".join(test))


def test_prefect_server(services):
    server = services["prefect-server"]
    args = argv(server)
    assert args[:3] == ["prefect", "server", "start"]
    assert option(args, "--host") == "0.0.0.0"
    e = env(server)
    assert e["PREFECT_SERVER_API_HOST"] == "0.0.0.0"
    assert "PREFECT_API_URL" not in e, "the server's UI would call that URL from the browser"
    port = prefect_port(services)
    assert port in published_container_ports(server)
    assert depends_on(server).get("postgres") == "service_healthy"
    hc = " ".join(server["healthcheck"]["test"])
    assert "urllib" in hc and f"localhost:{port}/api/health" in hc


def test_prefect_database_url_uses_asyncpg_and_postgres_service(services):
    e = env(services["prefect-server"])
    raw = e.get("PREFECT_API_DATABASE_CONNECTION_URL") or e.get("PREFECT_SERVER_DATABASE_CONNECTION_URL")
    assert raw, "no Prefect database URL"
    url = urlparse(raw)
    assert url.scheme == "postgresql+asyncpg"
    assert url.hostname == "postgres" and url.hostname in services
    assert (url.port or 5432) == 5432
    pg = env(services["postgres"])
    assert (url.username, url.password, url.path.lstrip("/")) == (
        pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])


def test_mlflow_server(services):
    ml = services["mlflow"]
    args = argv(ml)
    assert args[:2] == ["mlflow", "server"]
    assert option(args, "--host") == "0.0.0.0"
    assert "--serve-artifacts" in args
    port = mlflow_port(services)
    assert port in published_container_ports(ml)
    assert env(ml)["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"].lower() == "false"
    dest = option(args, "--artifacts-destination")
    mounts = mount_targets(ml)
    assert dest in mounts and not mounts[dest].startswith((".", "/")), "artefacts must be on a named volume"
    backend = urlparse(option(args, "--backend-store-uri"))
    assert backend.scheme.startswith("postgresql") and backend.hostname == "postgres"
    assert (backend.username, backend.path.lstrip("/")) == ("mlflow", "mlflow")
    assert depends_on(ml).get("postgres") == "service_healthy"


def test_mlflow_accepts_the_host_header_workers_send(services):
    """MLflow >= 3.5 answers 403 to Host headers outside localhost/private IPs unless allowed."""
    allowed = [h.strip() for h in env(services["mlflow"]).get("MLFLOW_SERVER_ALLOWED_HOSTS", "").split(",")]
    for name in WORKERS:
        netloc = urlparse(env(services[name])["MLFLOW_TRACKING_URI"]).netloc
        assert any(fnmatch.fnmatch(netloc, a) if "*" in a else netloc == a for a in allowed), (netloc, allowed)


@pytest.mark.parametrize("name", WORKERS)
def test_worker_points_at_the_servers(services, name):
    e = env(services[name])
    api = urlparse(e["PREFECT_API_URL"])
    assert api.scheme == "http" and api.hostname == "prefect-server" and api.hostname in services
    assert api.port == prefect_port(services) and api.path.rstrip("/") == "/api"
    ml = urlparse(e["MLFLOW_TRACKING_URI"])
    assert ml.scheme == "http" and ml.hostname == "mlflow" and ml.hostname in services
    assert (ml.port or 80) == mlflow_port(services)


def test_workers_share_the_run_folder(services):
    sources = set()
    for name in WORKERS:
        e = env(services[name])
        assert e["MARS2_HOME"] == "/runs"
        mounts = mount_targets(services[name])
        assert "/runs" in mounts
        sources.add(mounts["/runs"])
    assert len(sources) == 1, f"workers must mount the same volume at /runs: {sources}"
    assert sources <= set(yaml.safe_load(COMPOSE.read_text()).get("volumes") or {})


def test_every_depends_on_target_exists(services):
    valid = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, svc in services.items():
        for target, condition in depends_on(svc).items():
            assert target in services, f"{name} depends on unknown service {target!r}"
            assert condition in valid, (name, target, condition)
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} healthy; it has no healthcheck"


def test_named_volumes_are_declared(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for source in mount_targets(svc).values():
            if source and not source.startswith((".", "/", "~")):
                assert source in declared, f"{name} mounts undeclared volume {source!r}"


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


def test_create_pools_runs_after_server_is_healthy(services):
    cp = services["create-pools"]
    assert depends_on(cp).get("prefect-server") == "service_healthy"
    api = urlparse(env(cp)["PREFECT_API_URL"])
    assert api.hostname == "prefect-server" and api.port == prefect_port(services)
    assert cp.get("restart", "no") == "no"


@pytest.mark.parametrize("name", WORKERS)
def test_worker_pool_is_created_by_create_pools(services, name):
    args = argv(services[name])
    assert args[:3] == ["prefect", "worker", "start"]
    pool, kind = option(args, "--pool"), option(args, "--type")
    pools = created_pools(services)
    assert pool in pools, f"{name} polls {pool!r}; create-pools creates {sorted(pools)}"
    assert pools[pool] == kind == "process"
    deps = depends_on(services[name])
    assert deps.get("create-pools") == "service_completed_successfully"
    assert deps.get("prefect-server") == "service_healthy"


def test_worker_pools_are_cpu_and_gpu(services):
    assert option(argv(services["worker-cpu"]), "--pool") == "cpu"
    assert option(argv(services["worker-gpu"]), "--pool") == "gpu"


def test_gpu_worker_is_optional_and_reserves_nvidia_gpus(services):
    gpu = services["worker-gpu"]
    assert "gpu" in gpu.get("profiles", [])
    for name, svc in services.items():
        if name != "worker-gpu":
            assert not svc.get("profiles"), f"{name} must start without a profile"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


# ---------------------------------------------------------------- Dockerfile and init SQL

def dockerfile_lines() -> list[str]:
    """Instructions with line continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_dockerfile_base_workdir_and_install():
    lines = dockerfile_lines()
    assert any(re.fullmatch(r"FROM python:3\.11-slim(\s+AS\s+\w+)?", ln, re.I) for ln in lines)
    assert "WORKDIR /app" in lines
    runs = " ".join(ln for ln in lines if ln.startswith("RUN "))
    assert "pip install -e ." in runs
    for pkg in ("psycopg2-binary", "asyncpg", "psycopg[binary]"):
        assert pkg in runs, f"{pkg} not installed"


def test_dockerfile_pins_the_projects_torch():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.replace(" ", "").startswith("torch==")]
    assert pin.replace(" ", "") == "torch==2.13.0"
    torch_specs = re.findall(r"\btorch(?![\w-])\S*", " ".join(ln for ln in dockerfile_lines() if ln.startswith("RUN ")))
    assert torch_specs and all(s == "torch==2.13.0" for s in torch_specs if "=" in s or "<" in s or ">" in s)
    assert "torch==2.13.0" in torch_specs


def test_dockerfile_copies_existing_paths():
    for ln in dockerfile_lines():
        if ln.startswith(("COPY ", "ADD ")) and "--from" not in ln:
            *sources, _dest = [w for w in ln.split()[1:] if not w.startswith("--")]
            for s in sources:
                assert (ROOT / s).exists(), f"{ln!r}: {s} is not in the repository"


def test_init_sql_creates_the_mlflow_database(services):
    sql = re.sub(r"--[^\n]*", "", INIT_SQL.read_text())
    backend = urlparse(option(argv(services["mlflow"]), "--backend-store-uri"))
    # the password comes from the postgres container's environment, the same value MLflow connects with
    (var, env_name), = re.findall(r"\\getenv\s+(\w+)\s+(\w+)", sql)
    assert env(services["postgres"])[env_name] == backend.password
    assert re.search(rf"CREATE\s+(ROLE|USER)\s+{backend.username}\b[^;]*PASSWORD\s+:'{var}'", sql, re.I)
    assert re.search(rf"CREATE\s+DATABASE\s+{backend.path.lstrip('/')}\b[^;]*OWNER\s+{backend.username}\b", sql, re.I)
    mounts = mount_targets(services["postgres"])
    init = [t for t, s in mounts.items() if t.startswith("/docker-entrypoint-initdb.d/")]
    assert init and (ROOT / mounts[init[0]]).resolve() == INIT_SQL.resolve()
    assert init[0].endswith(".sql")


# ---------------------------------------------------------------- Compose's own validation

def compose_cli() -> list[str] | None:
    """A Compose v2 CLI: the docker plugin, else a standalone v2 binary; None if neither runs."""
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
        if out.returncode == 0 and re.search(r"\bv?2\.\d+", out.stdout):
            return cli
    return None


@pytest.mark.parametrize("profile", [None, "gpu"])
def test_docker_compose_config_is_valid(profile):
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Compose v2 CLI here (`docker compose` / v2 `docker-compose`); YAML checks above still ran")
    args = [*cli, "-f", str(COMPOSE), "--env-file", str(ENV_EXAMPLE)]
    if profile:
        args += ["--profile", profile]
    out = subprocess.run([*args, "config", "-q"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------- secrets, health, images

SECRET_KEY = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY", re.I)


def test_no_secret_literal_is_committed():
    """Every password in the compose file is a ${VAR} from the git-ignored .env; the init SQL reads its own
    from the environment; .env.example holds placeholders only, none of which is copied anywhere."""
    raw = yaml.safe_load(COMPOSE.read_text())
    for name, svc in raw["services"].items():
        for key, value in env(svc).items():
            if SECRET_KEY.search(key):
                assert value and re.fullmatch(r"\$\{\w+(:?[-?][^}]*)?\}", value), f"{name}: {key} is a literal"
    text = COMPOSE.read_text()
    for url in re.findall(r"\b[\w+]+://[^\s\"']+", text):
        parsed = urlparse(url)
        if "@" in parsed.netloc:
            password = parsed.netloc.split("@")[0].partition(":")[2]
            assert password.startswith("${"), f"password literal in {url}"
    sql = re.sub(r"--[^\n]*", "", INIT_SQL.read_text())
    assert not re.search(r"PASSWORD\s+'", sql, re.I), "postgres-init.sql has a password literal"
    placeholders = {k: v for k, v in env_file(ENV_EXAMPLE).items() if SECRET_KEY.search(k)}
    assert placeholders and all("change-me" in v for v in placeholders.values())
    for path in (COMPOSE, INIT_SQL, DOCKERFILE, ROOT / "docker" / "README.md"):
        for v in placeholders.values():
            assert v not in path.read_text(), f"{path.name} contains the example secret {v!r}"
    assert ".env" in (ROOT / ".gitignore").read_text().split(), ".env must be git-ignored"


def test_env_example_sets_every_required_variable():
    text = COMPOSE.read_text()
    required = set(re.findall(r"\$\{(\w+):?\?", text))
    assert required >= {"POSTGRES_PASSWORD", "MLFLOW_DB_PASSWORD"}
    assert required <= set(env_file(ENV_EXAMPLE))
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        interpolate(text, {})  # `docker compose up` without a .env stops with that message


@pytest.mark.parametrize("name", WORKERS)
def test_workers_have_health_checks(services, name):
    svc = services[name]
    assert "--with-healthcheck" in argv(svc)
    port = env(svc)["PREFECT_WORKER_WEBSERVER_PORT"]
    assert f"localhost:{port}/health" in " ".join(svc["healthcheck"]["test"])


def test_long_running_services_have_health_checks(services):
    for name, svc in services.items():
        if name != "create-pools":
            assert "healthcheck" in svc, f"{name} has no healthcheck"


def test_vllm_is_in_the_gpu_image_only(services):
    gpu = services["worker-gpu"]
    assert str(gpu["build"]["args"]["WITH_VLLM"]) == "1"
    assert env(gpu)["MARS2_VLLM_PYTHON"] == "/opt/vllm/bin/python"
    for name in IMAGE_SERVICES:
        if name != "worker-gpu":
            assert str((services[name].get("build") or {}).get("args", {}).get("WITH_VLLM", "0")) == "0", name
            assert "MARS2_VLLM_PYTHON" not in env(services[name])
    lines = dockerfile_lines()
    assert "ARG WITH_VLLM=0" in lines
    (install,) = [ln for ln in lines if ln.startswith("RUN ") and "vllm==" in ln]
    assert '[ "$WITH_VLLM" = "1" ]' in install and "/opt/vllm/bin/pip install" in install
    assert "torch" not in install, "vLLM brings its own torch into /opt/vllm; the main environment keeps 2.13.0"


def test_create_pools_registers_the_deployments(services):
    args = argv(services["create-pools"])
    text = args[args.index("-c") + 1]
    assert "python flows/deploy.py --pool cpu" in " ".join(text.split())


def test_init_sql_runs_in_postgres():
    """Run postgres-init.sql as the image's entrypoint does (psql -f, ON_ERROR_STOP) in a throw-away cluster."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not bins or not shutil.which("psql"):
        pytest.skip("no Postgres server binaries here")
    import os
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
    import os

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
