# The two set-up commands are `make run` and `make test`; both build the environment themselves.
PYTHON ?= python3
TOOLS := .venv-tools
UV := $(TOOLS)/bin/uv
UV_VERSION := 0.13.9
VENV := .venv
PY := $(VENV)/bin/python
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
export UV_LINK_MODE := copy
ARGS ?=

.PHONY: run test lint docs bench env clean unit integration images chaos gpu-check

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet "uv==$(UV_VERSION)"

$(VENV)/.synced: $(UV) uv.lock pyproject.toml */pyproject.toml libs/*/pyproject.toml services/*/pyproject.toml
	$(UV) sync --frozen --all-packages --python "$$($(PYTHON) -c 'import sys; print(sys.executable)')"
	@touch $@

env: $(VENV)/.synced

run: env
	$(VENV)/bin/ibpool run $(ARGS)

lint: env
	$(VENV)/bin/ruff check proto libs services tests examples
	$(VENV)/bin/ruff format --check proto libs services tests examples
	$(VENV)/bin/mypy --strict proto/ibpool_proto $(wildcard libs/*/ibpool_*) $(wildcard services/*/ibpool_*) examples tests/gpu tests/chaos

# The event reference, and a screenshot of each dashboard page (a small system and headless chromium).
docs: env
	$(PY) -m ibpool_proto.docs docs/events
	$(PY) -m ibpool_dashboard.screenshots docs

unit: env
	$(VENV)/bin/pytest -q proto libs services examples -m "not integration"

integration: env
	$(VENV)/bin/pytest -q tests/integration

test: lint
	$(VENV)/bin/pytest -q

bench: env
	$(PY) tests/bench/bench_bus.py --runs 5
	$(PY) tests/bench/bench_fabric.py --runs 5
	$(PY) tests/bench/bench_pool.py --runs 3
	$(PY) tests/bench/bench_sched_place.py --runs 5
	$(PY) tests/bench/bench_failover.py --rounds 20
	$(PY) tests/bench/bench_failover.py --rounds 20 --liveness heartbeats
	$(PY) tests/bench/bench_failover.py --rounds 20 --fault xid79
	$(PY) tests/bench/bench_slurm_drain.py --rounds 20
	$(PY) tests/bench/bench_sched.py --runs 3
	$(PY) tests/bench/bench_scale.py --sizes 10,100,1000,5000 --duration 90 --table --plot docs/scale-cpu.png
	$(PY) tests/bench/bench_failover.py --rounds 20 --background-nodes 12496
	$(PY) tests/bench/bench_failover_tick.py --sizes 1000,5000,12500,50000 --runs 3
	$(PY) tests/bench/bench_sched_cycle.py --nodes 1000,5000,12500 --per-node 2 --runs 3
	$(PY) tests/bench/bench_cells.py --from-day 80 --to-day 109
	$(PY) tests/bench/bench_snapshot.py --sizes 1000,5000,12500 --runs 3
	$(VENV)/bin/ibpool bench pack --seeds 3 --format table --plot docs/packing-openb.png --out tests/bench/results/pack-latest.json

# The node agent's NVML backend on this machine's GPU, step by step (docs/hardware.md); not part of `make test`.
# Without a GPU it runs on the NVML stand-in and says so. ARGS="--out FILE" also writes the report.
gpu-check: $(UV)
	$(UV) sync --frozen --all-packages --group gpu --python "$$($(PYTHON) -c 'import sys; print(sys.executable)')"
	$(PY) tests/gpu/gpu_check.py $(ARGS)

# Container images, built offline (needs a docker daemon and root for debootstrap): deploy/README.md.
images: $(UV)
	deploy/docker/images.sh

# Every chaos scenario (needs a docker daemon; builds the images it lacks) and the report docs/reliability.md.
# `make test` runs the four smoke scenarios only.
chaos: env
	IBPOOL_CHAOS_REPORT=docs/reliability.md $(VENV)/bin/pytest -q -p no:cacheprovider -m chaos tests/chaos

clean:
	rm -rf $(VENV) $(TOOLS) .ibpool
