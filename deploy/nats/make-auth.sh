#!/usr/bin/env bash
# Generate one random password per NATS user (admin, each service, operator, subscriber) into
# SECRETS (default deploy/secrets/nats, never committed) and render the nats-server authorization
# block that gives each user only its own subjects (ibpool_runtime.bus_permissions) to
# SECRETS/auth.conf. Existing passwords are kept; run again after adding a service.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECRETS=${1:-deploy/secrets/nats}
PY=${PY:-.venv/bin/python}
mkdir -p "$SECRETS"
chmod 700 "$SECRETS"
users=$("$PY" -c 'from ibpool_runtime.bus_permissions import PUBLISHES, SYSTEM_USER; print(" ".join(["admin", *PUBLISHES, SYSTEM_USER]))')
for user in $users; do
    f="$SECRETS/$user.password"
    [[ -s "$f" ]] || (umask 077; "$PY" -c 'import secrets; print(secrets.token_urlsafe(24))' > "$f")
done
(umask 077; "$PY" -m ibpool_runtime.bus_permissions "$SECRETS" > "$SECRETS/auth.conf")
echo "wrote $SECRETS/auth.conf and one password per user: $users" >&2
