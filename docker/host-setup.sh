#!/usr/bin/env bash
# What the team stack needs on a Debian/Ubuntu host, checked in one go and installed in one step:
#
#   bash docker/host-setup.sh            # lists what is missing, asks, then installs it (root, or sudo)
#   bash docker/host-setup.sh --yes      # the same without asking (scripts, CI images)
#   bash docker/host-setup.sh --check    # only lists; exit 1 when something is missing (docker/smoke.sh runs this)
#
# A Docker engine that answers (Debian's docker.io; started with systemctl, or `dockerd` in the background where
# there is no systemd), a Compose CLI (`docker compose`, or Debian's docker-compose v1.29), and debootstrap (the base
# images where no image registry is reachable: docker/base-images.sh).
set -uo pipefail

mode=ask
case "${1:-}" in
    --yes|-y) mode=yes ;;
    --check) mode=check ;;
    "") ;;
    *) echo "usage: bash docker/host-setup.sh [--yes | --check]" >&2; exit 2 ;;
esac

packages=()
missing=()
engine_down=0
if ! command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
    packages+=(docker.io); missing+=("a Docker engine (docker.io)")
elif ! docker info >/dev/null 2>&1; then
    engine_down=1
fi
if ! { command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; } \
        && ! command -v docker-compose >/dev/null 2>&1; then
    packages+=(docker-compose); missing+=("a Compose CLI (docker-compose)")
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    packages+=(debootstrap); missing+=("debootstrap (base images without a registry)")
fi

if [ ${#missing[@]} = 0 ] && [ "$engine_down" = 0 ]; then
    echo "host-setup: everything the team stack needs is here (Docker engine, Compose CLI, debootstrap)"
    exit 0
fi
for m in "${missing[@]}"; do echo "host-setup: missing: $m" >&2; done
[ "$engine_down" = 1 ] && echo "host-setup: the Docker engine is installed but does not answer (not started)" >&2
if [ "$mode" = check ]; then
    echo "host-setup: install and start them in one step: bash docker/host-setup.sh" >&2
    exit 1
fi

sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo)
if [ ${#packages[@]} -gt 0 ]; then
    echo "host-setup: will run: ${sudo[*]} apt-get install -y ${packages[*]}" >&2
    if [ "$mode" = ask ]; then
        read -r -p "host-setup: go on? [y/N] " answer
        [[ "$answer" =~ ^[Yy] ]] || { echo "host-setup: nothing installed" >&2; exit 1; }
    fi
    "${sudo[@]}" apt-get update -q && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        "${packages[@]}" || exit 1
fi
if ! docker info >/dev/null 2>&1; then
    if [ -d /run/systemd/system ]; then
        "${sudo[@]}" systemctl start docker
    else  # a container or a host without systemd
        "${sudo[@]}" sh -c 'nohup dockerd >/var/log/dockerd.log 2>&1 &'
    fi
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "host-setup: dockerd did not answer in 60 s (/var/log/dockerd.log)" >&2; exit 1; }
fi
echo "host-setup: ready: $(docker --version); compose: $({ docker compose version 2>/dev/null || docker-compose --version; } | head -1)"
