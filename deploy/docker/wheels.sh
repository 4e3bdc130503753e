#!/usr/bin/env bash
# Build the wheelhouse the images install from, offline: our packages as wheels (uv build) and every
# third-party dependency pinned by uv.lock as a wheel for the image's platform (Debian bookworm:
# CPython 3.11, x86_64). Skipped when nothing it depends on changed.
#
#   deploy/docker/wheels.sh [OUT]        default OUT: build/wheelhouse
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build/wheelhouse}
UV=${UV:-.venv-tools/bin/uv}
export UV_PYTHON_DOWNLOADS=never

# What goes into the wheels: tracked files as staged, uncommitted changes, and new files not yet added.
stamp=$( (git ls-files -s -- uv.lock pyproject.toml proto libs services deploy/docker/wheels.sh
          git diff -- proto libs services uv.lock
          git ls-files -o --exclude-standard -z -- proto libs services | xargs -0 -r sha256sum) | sha256sum | cut -c1-16)
if [[ -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$stamp" ]]; then
    echo "wheelhouse up to date ($OUT)" >&2
    exit 0
fi
rm -rf "$OUT"
mkdir -p "$OUT/ibpool" "$OUT/deps"
"$UV" build --all-packages --wheel --quiet -o "$OUT/ibpool"
"$UV" export --frozen --all-packages --no-dev --no-hashes --no-emit-workspace --format requirements-txt \
    --quiet -o "$OUT/requirements.txt"
# The images run bookworm's CPython 3.11 on x86_64: so must this host, whose pip builds the wheels
# of dependencies published only as source (pure Python ones, e.g. python-hostlist).
python3 - <<'PY'
import platform, sys
if sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64" or sys.platform != "linux":
    sys.exit(f"wheels.sh: needs CPython 3.11 on x86_64 Linux like the images, not {platform.python_version()} "
             f"on {platform.machine()} {sys.platform}")
PY
python3 -m pip wheel --quiet --disable-pip-version-check --prefer-binary --no-deps \
    -r "$OUT/requirements.txt" -w "$OUT/deps"
echo "$stamp" > "$OUT/.stamp"
echo "wheelhouse built: $(ls "$OUT/ibpool" | wc -l) ibpool wheels, $(ls "$OUT/deps" | wc -l) dependencies ($OUT)" >&2
