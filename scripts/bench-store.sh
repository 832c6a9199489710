#!/usr/bin/env bash
# Worker-store benchmark against PyTorch's own TCPStore server (see bench/store.py).
# Usage: scripts/bench-store.sh [--clients 64,1024] [--seconds 5]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
VENV="$(scripts/setup.sh)"
cargo build --release --locked -p accel-agent >&2
# PyTorch's server reverse-resolves loopback peers; answer that from a private
# hosts file so DNS (unreachable here) does not stall it (needs root).
hosts="$(mktemp)"; trap 'rm -f "$hosts"' EXIT
{ cat /etc/hosts; echo "::1 localhost"; echo "::ffff:127.0.0.1 localhost"; } > "$hosts"
exec unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$hosts" \
  "$CARGO_TARGET_DIR/release/accel-agent" --no-python "$VENV/bin/python" bench/store.py "$@"
