#!/usr/bin/env bash
# Rendezvous benchmark: N simulated agents (one process, `rdzv-load`) complete
# one round against one rdzv-server, a fresh server per size, once over plain
# HTTP/2 and once with a token and mutual TLS (certificates made here).
# Usage: scripts/bench-rendezvous.sh [100,1000,10000] [plain|secure|both]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
cargo build --release --locked -p rendezvous-server -p accel-tests --bins >&2
R="$CARGO_TARGET_DIR/release"
sizes="${1:-100,1000,10000}"
modes="${2:-both}"
[ "$modes" = both ] && modes="plain secure"
pki="$(mktemp -d)"
trap 'rm -rf "$pki"; [ -n "${server:-}" ] && kill "$server" 2>/dev/null || true' EXIT
if [[ " $modes " == *" secure "* ]]; then
  (
    cd "$pki"
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-ca
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > ext
    for n in server client; do
      openssl req "${ec[@]}" -keyout $n.key -out $n.csr -subj /CN=$n
      openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem -days 2 -extfile ext
    done
    openssl rand -hex 32 > token && chmod 600 token
  ) >/dev/null 2>&1
fi
header=""
for mode in $modes; do
  for n in ${sizes//,/ }; do
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    srv=(--bind "127.0.0.1:$port")
    load=(--endpoint "127.0.0.1:$port" --agents "$n" --label "$mode")
    if [ "$mode" = secure ]; then
      srv+=(--token-file "$pki/token" --tls-cert "$pki/server.pem" --tls-key "$pki/server.key" --tls-client-ca "$pki/ca.pem")
      load+=(--token-file "$pki/token" --tls-ca "$pki/ca.pem" --tls-cert "$pki/client.pem" --tls-key "$pki/client.key")
    fi
    RUST_LOG=warn "$R/rdzv-server" "${srv[@]}" &
    server=$!
    sleep 0.3
    "$R/rdzv-load" "${load[@]}" --server-pid "$server" $header
    header="--no-header"
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=""
  done
done
