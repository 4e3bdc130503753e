#!/usr/bin/env bash
# Build the air-gapped base image every ibpool image starts from, without any container registry:
# debootstrap a minimal Debian bookworm (python3, venv, ca-certificates, tini) and `docker import` it.
# The tag carries a hash of this script, so the image is built once and rebuilt only when the recipe
# changes. Prints the image name. Needs root (debootstrap) and a Debian mirror (a package registry).
# The variant `prometheus` adds Debian's prometheus package (the ibpool/prometheus image's base,
# ibpool-prometheus-base), so that only that image carries it.
#
#   deploy/docker/base-image.sh [prometheus]   build if missing, print the tag
#   MIRROR=http://deb.debian.org/debian deploy/docker/base-image.sh
set -euo pipefail

SUITE=bookworm
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv,ca-certificates,tini
case "${1:-}" in
    "") NAME=ibpool-base ;;
    prometheus) NAME=ibpool-prometheus-base PACKAGES=$PACKAGES,prometheus ;;
    *) echo "usage: $0 [prometheus]" >&2; exit 2 ;;
esac
recipe_hash=$( (cat "$0"; echo "$SUITE $PACKAGES") | sha256sum | cut -c1-12)
IMAGE=$NAME:${recipe_hash}

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE"
    exit 0
fi

for tool in debootstrap docker; do
    command -v "$tool" >/dev/null || { echo "base-image: $tool is not installed (apt-get install -y debootstrap docker.io)" >&2; exit 2; }
done

root=$(mktemp -d "/tmp/$NAME.XXXXXX")
trap 'rm -rf "$root"' EXIT
echo "base-image: debootstrap $SUITE ($PACKAGES) into $root" >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >&2
# Smaller and reproducible enough: no apt lists, caches, docs or logs in the image.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/var/log/*
chroot "$root" /usr/sbin/useradd --system --uid 10001 --home-dir /var/lib/ibpool --create-home ibpool
tar -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$IMAGE" >&2
docker tag "$IMAGE" "$NAME:latest"
echo "$IMAGE"
