#!/usr/bin/env bash
# Rendezvous benchmark: N simulated agents (one process) complete one round
# against one rdzv-server. Usage: scripts/bench-rendezvous.sh [100,1000,10000]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
cargo build --release --locked -p rendezvous-server -p accel-tests --bins >&2
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
RUST_LOG=warn "$CARGO_TARGET_DIR/release/rdzv-server" --bind "127.0.0.1:$port" &
server=$!
trap 'kill $server 2>/dev/null' EXIT
sleep 0.3
"$CARGO_TARGET_DIR/release/rdzv-load" --endpoint "127.0.0.1:$port" --server-pid "$server" --agents "${1:-100,1000,10000}"
