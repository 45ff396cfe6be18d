#!/usr/bin/env bash
# The team stack for real, on this machine: build the CPU image, start the stack, run a small train cycle from its
# deployment on the stack's CPU worker, check what Prefect and MLflow show, run it again (all stages from cache),
# then `down -v`. Leaves nothing behind: no container, network or volume of its project (mars2smoke).
#
#   bash docker/host-setup.sh     # once per host: Docker engine, a Compose CLI, debootstrap (asks, then installs)
#   bash docker/smoke.sh          # as root or a user in the docker group; last line: the timings
#
# Its own project name and a throw-away env file with random secrets: a .env of yours is neither read nor touched.
# Host networking (docker/compose.hostnet.yml): every server listens on 127.0.0.1 only; ports 5432, 4200, 5000
# and 8080 must be free. With no image registry, the bases come from docker/base-images.sh (Debian packages);
# a local torch 2.13.0 CPU wheel (MARS2_TORCH_WHEEL_FILE, default /opt/wheels/torch-2.13.0+cpu-cp311-*.whl) is
# used instead of the PyTorch index when present. Heavy steps run under `nice`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PROJECT=${MARS2_SMOKE_PROJECT:-mars2smoke}
FLOW_TIMEOUT_S=${MARS2_SMOKE_FLOW_TIMEOUT_S:-1500}
OVERRIDES='["agents=tiny_cpu_single", "data.n_problems=24", "data.max_train_problems=2", "data.max_eval_problems=2",
 "search.max_nodes=2", "search.max_new_tokens=24", "eval.max_new_tokens=24", "train.train_batch=2",
 "train.micro_batch=4", "train.cycles=1", "grading.time_limit_s=2"]'

# every missing host prerequisite at once (engine, Compose CLI, debootstrap), and the one command that installs them
bash docker/host-setup.sh --check >/dev/null || exit 1
if docker compose version >/dev/null 2>&1; then COMPOSE_CLI=(docker compose); else COMPOSE_CLI=(docker-compose); fi

WORK=$(mktemp -d /tmp/mars2-smoke.XXXXXX)
ENV_FILE=$WORK/smoke.env
STACK=$WORK/stack.yml  # the resolved stack; until it is written, `down` has nothing to take down
compose() { [ -f "$STACK" ] && "${COMPOSE_CLI[@]}" -p "$PROJECT" --project-directory "$ROOT" -f "$STACK" "$@"; }
secret() { python3 -c 'import secrets; print(secrets.token_urlsafe(18))'; }
log() { echo "smoke: $*" >&2; }

cleanup() {
    local rc=$?
    if [ "$rc" != 0 ]; then
        log "failed (exit $rc); last logs:"
        compose logs --no-color --tail 60 >&2 2>/dev/null || true
    fi
    compose down -v --remove-orphans >/dev/null 2>&1 || true
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # so that an interrupted run still takes the stack down

for port in 5432 4200 5000 8080; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        log "port $port on 127.0.0.1 is in use; stop what listens there first"; exit 1
    fi
done

# ---------------------------------------------------------------- images
have_or_pull() { docker image inspect "$1" >/dev/null 2>&1 || docker pull -q "$1" >/dev/null 2>&1; }
bases=()
if ! have_or_pull python:3.11-slim || ! have_or_pull postgres:16; then
    log "no image registry: bases from Debian packages (docker/base-images.sh)"
    nice -n 15 bash docker/base-images.sh >"$WORK/base-images.log" 2>&1 || { cat "$WORK/base-images.log" >&2; exit 1; }
    bases=(MARS2_PYTHON_IMAGE=mars2-local/python:3.11 MARS2_POSTGRES_IMAGE=mars2-local/postgres:15)
fi
for crt in "${MARS2_BUILD_CA_DIR:-/usr/local/share/ca-certificates}"/*.crt; do  # a TLS-intercepting proxy's CA
    if [ -f "$crt" ]; then cp "$crt" docker/certs/; fi
done
wheel_env=()
wheel=${MARS2_TORCH_WHEEL_FILE:-$(ls /opt/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -1 || true)}
if [ -n "$wheel" ] && [ -f "$wheel" ]; then
    [ -f "docker/wheels/$(basename "$wheel")" ] || cp "$wheel" docker/wheels/
    wheel_env=(MARS2_TORCH_WHEEL="$(basename "$wheel")")
    log "torch from the local wheel $(basename "$wheel")"
fi

MLFLOW_USER=admin MLFLOW_PASS=$(secret) PREFECT_AUTH="admin:$(secret)"
umask 077
cat >"$ENV_FILE" <<EOF
COMPOSE_PROJECT_NAME=$PROJECT
POSTGRES_PASSWORD=$(secret)
MLFLOW_DB_PASSWORD=$(secret)
PREFECT_AUTH_STRING=$PREFECT_AUTH
MLFLOW_ADMIN_USERNAME=$MLFLOW_USER
MLFLOW_ADMIN_PASSWORD=$MLFLOW_PASS
MLFLOW_FLASK_SECRET_KEY=$(secret)
EOF
for kv in "${bases[@]}" "${wheel_env[@]}"; do echo "$kv" >>"$ENV_FILE"; done
# docker-compose.yml + docker/compose.hostnet.yml as Compose resolves them, minus `ports` (host networking
# publishes nothing, and Compose v1 refuses port bindings next to network_mode: host; an override cannot remove them)
"${COMPOSE_CLI[@]}" --env-file "$ENV_FILE" -p "$PROJECT" -f docker-compose.yml -f docker/compose.hostnet.yml config \
    | python3 -c '
import re, sys
skip = None
for line in sys.stdin:
    indent = len(line) - len(line.lstrip())
    if skip is not None and line.strip() and (indent > skip or (indent == skip and line.lstrip().startswith("- "))):
        continue
    skip = None
    if re.fullmatch(r"\s+ports:\s*", line):
        skip = indent
        continue
    sys.stdout.write(line)
' >"$STACK"
grep -q "network_mode: host" "$STACK" && ! grep -q "ports:" "$STACK" || { log "could not resolve the stack: $STACK"; exit 1; }
umask 022

t0=$(date +%s)
log "building the CPU image (${COMPOSE_CLI[*]} build)"
nice -n 15 "${COMPOSE_CLI[@]}" -p "$PROJECT" --project-directory "$ROOT" -f "$STACK" build >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; exit 1; }
t_build=$(( $(date +%s) - t0 ))

# What the GPU image's /opt/vllm gets, minus vLLM: the project installed with --no-deps into a bare venv (the build
# backend from PyPI, as in the Dockerfile's vLLM step). Its entry module must import there and fail only for want
# of vllm itself.
vllm_check='python3 -m venv /tmp/vllm-env && /tmp/vllm-env/bin/pip install -q --no-deps -e /app \
  && cd / && /tmp/vllm-env/bin/python -c "import mars2.backends.vllm_worker, mars2.backends.vllm_backend" \
  && { /tmp/vllm-env/bin/python -m mars2.backends.vllm_worker /dev/null /tmp/out 2>&1 || true; }'
out=$(docker run --rm --network host --entrypoint sh mars2:latest -c "$vllm_check" 2>&1) \
    && grep -q "No module named 'vllm'" <<<"$out" || { log "vLLM venv check: $out"; exit 1; }
log "project installs --no-deps into a bare venv; python -m mars2.backends.vllm_worker needs only vllm there"

# ---------------------------------------------------------------- stack
t0=$(date +%s)
log "starting the stack"
compose up -d >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log" >&2; exit 1; }
healthy() { [ "$(docker inspect -f '{{.State.Health.Status}}' "$(compose ps -q "$1")" 2>/dev/null)" = healthy ]; }
deadline=$(( $(date +%s) + 600 ))
until healthy postgres && healthy prefect-server && healthy mlflow && healthy worker-cpu; do
    [ "$(date +%s)" -lt "$deadline" ] || { log "stack not healthy after 600 s"; compose ps >&2; exit 1; }
    sleep 3
done
pools=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$(compose ps -a -q create-pools)")
[ "$pools" = "exited 0" ] || { log "create-pools: $pools"; exit 1; }
t_healthy=$(( $(date +%s) - t0 ))
log "healthy after ${t_healthy}s"

export PREFECT_API_URL=http://127.0.0.1:4200/api MLFLOW_TRACKING_URI=http://127.0.0.1:5000
export PREFECT_AUTH_STRING=$PREFECT_AUTH MLFLOW_TRACKING_USERNAME=$MLFLOW_USER MLFLOW_TRACKING_PASSWORD=$MLFLOW_PASS
api() { python3 docker/smoke_api.py "$@"; }
api auth
api deployments

# ---------------------------------------------------------------- flow runs
t0=$(date +%s)
first=$(api run "$OVERRIDES" "$FLOW_TIMEOUT_S")
t_flow=$(( $(date +%s) - t0 ))
api check "$first" ran
t0=$(date +%s)
second=$(api run "$OVERRIDES" "$FLOW_TIMEOUT_S")
t_cached=$(( $(date +%s) - t0 ))
api check "$second" cached

# ---------------------------------------------------------------- teardown
trap - EXIT
compose down -v --remove-orphans >"$WORK/down.log" 2>&1 || { cat "$WORK/down.log" >&2; exit 1; }
left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT"; \
       docker network ls -q --filter "label=com.docker.compose.project=$PROJECT"; \
       docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")
[ -z "$left" ] || { log "left behind after down -v: $left"; exit 1; }
rm -rf "$WORK"
echo "smoke: OK build ${t_build}s, healthy ${t_healthy}s, flow run ${t_flow}s, cached re-run ${t_cached}s (${COMPOSE_CLI[*]}, ${bases[*]:-official bases})"
