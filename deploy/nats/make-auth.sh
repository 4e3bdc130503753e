#!/usr/bin/env bash
# Generate one random password per NATS user (admin, each service, operator, subscriber) into
# SECRETS (default deploy/secrets/nats, never committed) and render the nats-server authorization
# block that gives each user only its own subjects (ibpool_runtime.bus_permissions) to
# SECRETS/auth.conf. Existing passwords are kept; run again after adding a service.
#
# With SECRETS/agents.json ({"<user>": {"nodes": [...], "durable": "node-agent-..."}}), each node
# agent listed there gets a user of its own, allowed only its own nodes' subjects and its durable
# (docs/security.md); the shared `node_agent` user stays for agents not listed.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECRETS=${1:-deploy/secrets/nats}
PY=${PY:-.venv/bin/python}
mkdir -p "$SECRETS"
chmod 700 "$SECRETS"
users=$("$PY" -c 'from ibpool_runtime.bus_permissions import PUBLISHES, SYSTEM_USER; print(" ".join(["admin", *PUBLISHES, SYSTEM_USER]))')
agents=()
if [[ -f "$SECRETS/agents.json" ]]; then
    agents=(--agents "$SECRETS/agents.json")
    enrolled=$("$PY" -c '
import sys
from pathlib import Path
from ibpool_runtime.bus_permissions import read_agents
try:
    print(" ".join(read_agents(Path(sys.argv[1]))))
except ValueError as e:
    sys.exit(f"make-auth: {e}")
' "$SECRETS/agents.json")
    users="$users $enrolled"
fi
for user in $users; do
    f="$SECRETS/$user.password"
    [[ -s "$f" ]] || (umask 077; "$PY" -c 'import secrets; print(secrets.token_urlsafe(24))' > "$f")
done
(umask 077; "$PY" -m ibpool_runtime.bus_permissions "$SECRETS" "${agents[@]}" > "$SECRETS/auth.conf")
echo "wrote $SECRETS/auth.conf and one password per user: $users" >&2
