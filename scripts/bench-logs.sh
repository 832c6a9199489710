#!/usr/bin/env bash
# Tee benchmark against torchrun (see bench/logs.py). Usage: scripts/bench-logs.sh [--mb 200] [--lines 300]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
VENV="$(scripts/setup.sh)"
cargo build --release --locked -p accel-agent >&2
# torchrun's own TCPStore server reverse-resolves loopback peers: answer locally (needs root).
hosts="$(mktemp)"; trap 'rm -f "$hosts"' EXIT
{ cat /etc/hosts; echo "::1 localhost"; echo "::ffff:127.0.0.1 localhost"; } > "$hosts"
exec unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$hosts" \
  "$VENV/bin/python" bench/logs.py --accel "$CARGO_TARGET_DIR/release/accel-agent" --torchrun "$VENV/bin/torchrun" "$@"
