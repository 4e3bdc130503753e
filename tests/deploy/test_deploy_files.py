"""The deployment files agree with the code: images, compose services, scrape targets, Prometheus.

The dashboards and alert rules: test_grafana_dashboards.py and test_prometheus_alerts.py.

No docker here: these read the files. Building and running them is `make images` and
`docker-compose up` (deploy/README.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from ibpool_runtime.bus_permissions import PUBLISHES

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy/docker/Dockerfile").read_text()
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
TARGETS = set(re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, flags=re.M))
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").exists())


def test_every_service_has_an_image_target_running_its_module() -> None:
    for service in SERVICES:
        target = service.replace("_", "-")
        assert target in TARGETS, f"no Dockerfile target {target}"
        block = DOCKERFILE.split(f" AS {target}\n", 1)[1].split("\nFROM ", 1)[0]
        assert f'"-m", "ibpool_{service}"' in block and f"IBPOOL_{service.upper()}_HTTP_PORT=8080" in block


def test_images_script_builds_every_target_but_the_internal_stages() -> None:
    script = (ROOT / "deploy/docker/images.sh").read_text()
    match = re.search(r"\n    TARGETS=\(([^)]*)\)", script)
    assert match is not None
    listed = set(match.group(1).split())
    assert listed == TARGETS - {"python", "service"}


def test_compose_uses_only_images_we_build_and_env_files_the_secrets_script_writes() -> None:
    secrets_script = (ROOT / "deploy/compose-secrets.sh").read_text()
    for name, svc in COMPOSE["services"].items():
        image = svc["image"]
        assert image.startswith("ibpool/") and image.split("/")[1].split(":")[0] in TARGETS, (name, image)
        for env_file in [svc["env_file"]] if isinstance(svc.get("env_file"), str) else svc.get("env_file", []):
            user = Path(env_file).stem
            assert user in secrets_script and (user == "admin" or user in PUBLISHES), (name, env_file)


def test_three_nats_servers_route_to_each_other_and_sync_every_write() -> None:
    conf = (ROOT / "deploy/nats/cluster.conf").read_text()
    nats = [n for n in COMPOSE["services"] if n.startswith("nats-")]
    assert len(nats) == 3
    assert all(f"nats-route://{n}:6222" in conf for n in nats)
    assert "sync_interval: always" in conf and "include ./auth.conf" in conf


def test_prometheus_scrapes_every_compose_service_with_an_api() -> None:
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = prom["scrape_configs"]
    targets = {t.split(":")[0] for job in jobs for c in job.get("static_configs", []) for t in c["targets"]}
    targets |= {n for job in jobs for c in job.get("dns_sd_configs", []) for n in c["names"]}
    service_images = {f"ibpool/{s.replace('_', '-')}:dev" for s in SERVICES}
    with_api = {n for n, s in COMPOSE["services"].items() if s["image"] in service_images and "entrypoint" not in s}
    assert with_api and with_api <= targets, with_api - targets


def test_compose_prometheus_runs_debians_package_with_our_config_and_rules() -> None:
    """The `prometheus` service: its image is built on a base with Debian's prometheus package, reads the
    deploy/prometheus folder that compose mounts where the image's command looks, and keeps its data in a
    volume the image's user owns; prometheus.yml loads the alert rules beside it."""
    svc = COMPOSE["services"]["prometheus"]
    assert svc["image"] == "ibpool/prometheus:dev" and "prometheus" in TARGETS
    block = DOCKERFILE.split(" AS prometheus\n", 1)[1]
    assert re.search(r"^FROM \$\{PROMETHEUS_BASE\} AS prometheus$", DOCKERFILE, flags=re.M)
    base_script = (ROOT / "deploy/docker/base-image.sh").read_text()
    assert re.search(r"prometheus\) NAME=ibpool-prometheus-base PACKAGES=\$PACKAGES,prometheus ", base_script)
    images = (ROOT / "deploy/docker/images.sh").read_text()
    assert "base-image.sh prometheus" in images and '"PROMETHEUS_BASE=$prometheus_base"' in images
    config = re.search(r"--config\.file=(\S+)/prometheus\.yml", block)
    data = re.search(r"--storage\.tsdb\.path=([^\"]+)", block)
    assert config and data
    mounts = {m.split(":")[1]: m.split(":")[0] for m in svc["volumes"]}
    assert mounts[config.group(1)] == "./deploy/prometheus"
    assert mounts[data.group(1)] in COMPOSE["volumes"] and f"chown ibpool {data.group(1)}" in block
    assert "USER ibpool" in block and svc.get("read_only") is True
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert all((ROOT / "deploy/prometheus" / f).is_file() for f in prom["rule_files"])


def test_make_auth_enrols_the_agents_listed_and_refuses_a_broken_list(tmp_path: Path) -> None:
    """deploy/nats/make-auth.sh with an agents.json: each agent listed gets a password and a user
    allowed only its own nodes and durable; a broken list stops it with the file and entry named."""
    import subprocess
    import sys

    secrets = tmp_path / "nats"
    secrets.mkdir()
    agents = {"agent-r1": {"nodes": ["gpu-001", "gpu-002"], "durable": "node-agent-gpu-1-2"}}
    (secrets / "agents.json").write_text(json.dumps(agents))
    env = {"PY": sys.executable, "PATH": "/usr/bin:/bin"}
    r = subprocess.run([str(ROOT / "deploy/nats/make-auth.sh"), str(secrets)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (secrets / "agent-r1.password").stat().st_mode & 0o077 == 0
    conf = (secrets / "auth.conf").read_text()
    block = conf[conf.index('"user": "agent-r1"') :]
    block = block[: block.index('"user"', 10)] if '"user"' in block[10:] else block
    assert "ibpool.node.telemetry.reported.gpu-002" in block and "ibpool.job.job.exited.gpu-001" in block
    assert "$JS.API.CONSUMER.MSG.NEXT.IBPOOL_POOL.node-agent-gpu-1-2" in block
    assert "ibpool.node.telemetry.reported.*" not in block
    (secrets / "agents.json").write_text(json.dumps({"agent-r1": {"nodes": [], "durable": "x"}}))
    r = subprocess.run([str(ROOT / "deploy/nats/make-auth.sh"), str(secrets)], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "agents.json: agent-r1: `nodes` must be a non-empty list" in r.stderr
    assert "Traceback" not in r.stderr
