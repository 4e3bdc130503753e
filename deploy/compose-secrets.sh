#!/usr/bin/env bash
# Everything compose.yaml needs that must never be committed, under deploy/secrets/: NATS users
# and their permissions (deploy/nats/make-auth.sh), the TLS CA and server certificate of the NATS
# cluster (deploy/tls/make-certs.sh), the Postgres password, and one env file per service with its
# own NATS credentials. Existing secrets are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
S=deploy/secrets
PY=${PY:-.venv/bin/python}
deploy/nats/make-auth.sh "$S/nats"
deploy/tls/make-certs.sh "$S/tls" nats-1 nats-2 nats-3
[[ -s "$S/postgres.password" ]] || (umask 077; "$PY" -c 'import secrets; print(secrets.token_urlsafe(24))' > "$S/postgres.password")
# The pool allocator's grant-signing seed; the agents trust its public key only (ibpool_runtime.grant_signing).
[[ -s "$S/grant-signing.seed" ]] || (umask 077; "$PY" -c 'from ibpool_runtime.grant_signing import new_seed; print(new_seed())' > "$S/grant-signing.seed")
signers=$("$PY" -c 'import json, sys; from ibpool_runtime.grant_signing import public_key_of; print(json.dumps([public_key_of(sys.stdin.read())]))' < "$S/grant-signing.seed")
mkdir -p "$S/env"
pg=$(cat "$S/postgres.password")
for user in admin node_agent fabric_monitor pool_allocator failover_controller scheduler autoscaler dashboard; do
    nats_pw=$(cat "$S/nats/$user.password")
    (umask 077; cat > "$S/env/$user.env" <<ENV
IBPOOL_NATS_URL=tls://$user:$nats_pw@nats-1:4222,tls://$user:$nats_pw@nats-2:4222,tls://$user:$nats_pw@nats-3:4222
IBPOOL_NATS_TLS_CA=/run/secrets/nats-ca.pem
IBPOOL_POSTGRES_DSN=postgresql://postgres:$pg@postgres:5432/postgres
IBPOOL_STREAM_REPLICAS=3
OTEL_EXPORTER_OTLP_ENDPOINT=http://trace-collector:8080
ENV
    )
done
(umask 077; echo "IBPOOL_POOL_ALLOCATOR_GRANT_SIGNING_SEED_FILE=/run/secrets/grant-signing.seed" >> "$S/env/pool_allocator.env")
(umask 077; echo "IBPOOL_NODE_AGENT_GRANT_SIGNERS=$signers" >> "$S/env/node_agent.env")
# The failover controller sees agents' connections close through the system account's advisories.
system_pw=$(cat "$S/nats/system.password")
(umask 077; echo "IBPOOL_FAILOVER_CONTROLLER_CONNECTION_EVENTS_URL=tls://system:$system_pw@nats-1:4222,tls://system:$system_pw@nats-2:4222,tls://system:$system_pw@nats-3:4222" >> "$S/env/failover_controller.env")
# Mounted into containers that run as uid 10001: readable files inside directories only root may enter.
chmod 700 "$S" "$S/env"
chmod 644 "$S/nats/auth.conf" "$S/postgres.password" "$S/grant-signing.seed"
echo "secrets in $S" >&2
