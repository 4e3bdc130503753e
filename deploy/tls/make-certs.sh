#!/usr/bin/env bash
# A private CA and a certificate for the NATS servers of compose.yaml (nats-1..3, also valid for
# localhost and 127.0.0.1), written to OUT (default deploy/secrets/tls; never committed). Existing
# files are kept; delete the folder to start over. Services trust the CA through IBPOOL_NATS_TLS_CA.
#
#   deploy/tls/make-certs.sh [OUT] [NAME ...]      names default: nats-1 nats-2 nats-3
set -euo pipefail
OUT=${1:-deploy/secrets/tls}
shift || true
NAMES=("$@")
[[ ${#NAMES[@]} -gt 0 ]] || NAMES=(nats-1 nats-2 nats-3)
command -v openssl >/dev/null || { echo "make-certs: openssl is not installed" >&2; exit 2; }
mkdir -p "$OUT"
chmod 700 "$OUT"
cd "$OUT"
if [[ ! -s ca.pem ]]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=ibpool private CA" \
        -keyout ca-key.pem -out ca.pem 2>/dev/null
fi
if [[ ! -s server.pem ]]; then
    san="DNS:localhost,IP:127.0.0.1"
    for n in "${NAMES[@]}"; do san="$san,DNS:$n"; done
    openssl req -newkey rsa:2048 -nodes -subj "/CN=${NAMES[0]}" -keyout server-key.pem -out server.csr 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 \
        -extfile server.ext -out server.pem 2>/dev/null
    rm -f server.csr server.ext
fi
# Read by the NATS containers (uid 10001) through bind mounts; the folder keeps others out.
chmod 644 ca.pem server.pem server-key.pem
chmod 600 ca-key.pem
echo "CA and server certificate in $OUT (names: ${NAMES[*]}, localhost, 127.0.0.1)" >&2
