# mars2-local/python:3.11 — stands in for python:3.11-slim where no image registry is reachable:
# Debian bookworm's own Python (3.11, the version of the project's CPU torch wheel) with venv support and, like
# the official image, its C headers (DeepSpeed builds its CPU ops against Python.h on a worker's first update).
# Built by docker/base-images.sh on top of the debootstrap image it imports.
ARG DEBIAN_IMAGE=mars2-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
