#!/usr/bin/env bash
# Base images for machines that reach Debian's and Python's package registries but no image registry.
#
#   sudo bash docker/base-images.sh            # builds what is missing, prints the .env lines to use them
#   sudo bash docker/base-images.sh --rebuild  # builds all three again
#
# mars2-local/debian:bookworm   debootstrap --variant=minbase bookworm, imported with `docker import`
# mars2-local/python:3.11       + Debian's python3 (3.11), python3-venv, python3-dev: stands in for python:3.11-slim
# mars2-local/postgres:15       + Debian's postgresql-15 and docker/base/postgres-entrypoint.sh: stands in for postgres:16
#
# Then `MARS2_PYTHON_IMAGE=mars2-local/python:3.11 MARS2_POSTGRES_IMAGE=mars2-local/postgres:15` (in .env or the
# environment) make docker-compose.yml build and run on them. Needs root (debootstrap) and a running Docker engine.
# DEBIAN_MIRROR picks another Debian mirror (debootstrap's default otherwise).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEBIAN_IMAGE=mars2-local/debian:bookworm
PYTHON_IMAGE=mars2-local/python:3.11
POSTGRES_IMAGE=mars2-local/postgres:15
REBUILD=0
[ "${1:-}" = --rebuild ] && REBUILD=1

have_image() { [ "$REBUILD" = 0 ] && docker image inspect "$1" >/dev/null 2>&1; }

debian_image() {
    have_image "$DEBIAN_IMAGE" && return
    command -v debootstrap >/dev/null || { echo "base-images: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "base-images: debootstrap needs root" >&2; exit 1; }
    local root
    root=$(mktemp -d /tmp/mars2-debootstrap.XXXXXX)
    trap 'rm -rf "$root"' RETURN
    echo "base-images: debootstrap bookworm into $root"
    debootstrap --variant=minbase bookworm "$root" ${DEBIAN_MIRROR:-} >"$root.log" 2>&1 \
        || { tail -20 "$root.log" >&2; exit 1; }
    rm -f "$root.log"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' - "$DEBIAN_IMAGE" >/dev/null
    echo "base-images: $DEBIAN_IMAGE imported"
}

build_on_debian() {  # <image> <dockerfile>
    have_image "$1" && return
    docker build --network host --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" -t "$1" -f "$HERE/base/$2" "$HERE/base"
    echo "base-images: $1 built"
}

debian_image
build_on_debian "$PYTHON_IMAGE" python.Dockerfile
build_on_debian "$POSTGRES_IMAGE" postgres.Dockerfile
echo "MARS2_PYTHON_IMAGE=$PYTHON_IMAGE"
echo "MARS2_POSTGRES_IMAGE=$POSTGRES_IMAGE"
