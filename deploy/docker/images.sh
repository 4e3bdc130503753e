#!/usr/bin/env bash
# Build every ibpool image offline: the air-gapped base, the wheelhouse, then one image per target
# of deploy/docker/Dockerfile, tagged ibpool/<target>:<TAG> (default: dev). Unchanged inputs make
# every step a cache hit (base by recipe hash, wheelhouse by source hash, images by docker's cache).
#
#   deploy/docker/images.sh [TARGET ...]     default: every target
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${TAG:-dev}
TARGETS=("$@")
if [[ ${#TARGETS[@]} -eq 0 ]]; then
    TARGETS=(nats postgres fabric-monitor pool-allocator node-agent failover-controller scheduler autoscaler slurm-bridge dashboard prometheus)
fi
docker info >/dev/null 2>&1 || { echo "images: no docker daemon (start dockerd, see deploy/README.md)" >&2; exit 2; }
base=$(deploy/docker/base-image.sh)
# Debian's prometheus package only in the prometheus image: its own base, made only when asked for.
prometheus_base=ibpool-prometheus-base:latest
if printf '%s\n' "${TARGETS[@]}" | grep -qx prometheus; then
    prometheus_base=$(deploy/docker/base-image.sh prometheus)
fi
deploy/docker/wheels.sh build/wheelhouse
for target in "${TARGETS[@]}"; do
    start=$EPOCHREALTIME
    docker build --quiet --build-arg "BASE=$base" --build-arg "PROMETHEUS_BASE=$prometheus_base" --target "$target" -t "ibpool/$target:$TAG" \
        -f deploy/docker/Dockerfile . >/dev/null
    awk -v t="ibpool/$target:$TAG" -v s="$start" -v e="$EPOCHREALTIME" 'BEGIN { printf "%-30s %5.1f s\n", t, e - s }' >&2
done
