#!/usr/bin/env bash
# The Secrets deploy/k8s names, made as compose's are (deploy/compose-secrets.sh): NATS users and
# their permissions (deploy/nats/make-auth.sh), a private CA and a certificate for the NATS servers'
# Kubernetes names (deploy/tls/make-certs.sh), the Postgres password, the grant-signing seed, and one
# Secret per service with its own NATS URL. Written to OUT/secrets.yaml (never committed); existing
# passwords and keys in OUT are kept.
#
#   deploy/k8s/make-secrets.sh [OUT]            OUT defaults to deploy/secrets/k8s
#   kubectl apply -f deploy/secrets/k8s/secrets.yaml
#
# IBPOOL_K8S_NAMESPACE (default ibpool); IBPOOL_K8S_POSTGRES_DSN: the services' DSN, default the dev
# overlay's Postgres (postgresql://postgres:<generated password>@postgres:5432/postgres).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-deploy/secrets/k8s}
NS=${IBPOOL_K8S_NAMESPACE:-ibpool}
PY=${PY:-.venv/bin/python}
export PY
mkdir -p "$OUT"
chmod 700 "$OUT"
deploy/nats/make-auth.sh "$OUT/nats"
deploy/tls/make-certs.sh "$OUT/tls" nats "nats.$NS.svc" nats-0.nats-cluster nats-1.nats-cluster nats-2.nats-cluster
[[ -s "$OUT/postgres.password" ]] || (umask 077; "$PY" -c 'import secrets; print(secrets.token_urlsafe(24))' > "$OUT/postgres.password")
[[ -s "$OUT/grant-signing.seed" ]] || (umask 077; "$PY" -c 'from ibpool_runtime.grant_signing import new_seed; print(new_seed())' > "$OUT/grant-signing.seed")
(umask 077; "$PY" - "$OUT" "$NS" > "$OUT/secrets.yaml" <<'PY'
import json
import os
import sys
from pathlib import Path

import yaml

from ibpool_runtime.grant_signing import public_key_of

out, ns = Path(sys.argv[1]), sys.argv[2]
read = lambda name: (out / name).read_text().strip()  # noqa: E731
pg = read("postgres.password")
dsn = os.environ.get("IBPOOL_K8S_POSTGRES_DSN") or f"postgresql://postgres:{pg}@postgres:5432/postgres"


def nats_url(user: str) -> str:
    return f"tls://{user}:{read(f'nats/{user}.password')}@nats:4222"


def secret(name: str, data: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/part-of": "ibpool"}},
            "stringData": data}


# The NATS user of each workload (bus_permissions).
users = {"admin": "admin", "fabric-monitor": "fabric_monitor", "pool-allocator": "pool_allocator",
         "scheduler": "scheduler", "failover-controller": "failover_controller", "autoscaler": "autoscaler",
         "slurm-bridge": "slurm_bridge", "node-agent": "node_agent", "dashboard": "dashboard"}
env = {name: {"IBPOOL_NATS_URL": nats_url(user), "IBPOOL_POSTGRES_DSN": dsn} for name, user in users.items()}
del env["dashboard"]["IBPOOL_POSTGRES_DSN"]  # it keeps no state
env["node-agent"]["IBPOOL_NODE_AGENT_GRANT_SIGNERS"] = json.dumps([public_key_of(read("grant-signing.seed"))])
# The failover controller sees agents' connections close through the system account's advisories.
env["failover-controller"]["IBPOOL_FAILOVER_CONTROLLER_CONNECTION_EVENTS_URL"] = nats_url("system")
docs = [secret(f"ibpool-{name}", data) for name, data in env.items()]
docs += [
    secret("ibpool-nats-ca", {"ca.pem": read("tls/ca.pem") + "\n"}),
    secret("ibpool-nats-tls", {f: read(f"tls/{f}") + "\n" for f in ("ca.pem", "server.pem", "server-key.pem")}),
    secret("ibpool-nats-auth", {"auth.conf": read("nats/auth.conf") + "\n"}),
    secret("ibpool-grant-signing", {"seed": read("grant-signing.seed") + "\n"}),
    secret("ibpool-postgres", {"password": pg + "\n"}),
]
yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
PY
)
echo "Secrets in $OUT/secrets.yaml (namespace $NS): kubectl apply -f $OUT/secrets.yaml" >&2
