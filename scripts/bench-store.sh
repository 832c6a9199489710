#!/usr/bin/env bash
# Worker-store benchmark against PyTorch's own TCPStore server (see bench/store.py).
# Usage: scripts/bench-store.sh [--clients 64,1024] [--seconds 5]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
VENV="$(scripts/setup.sh)"
cargo build --release --locked -p accel-agent >&2
# PyTorch's server runs with a private hosts file (see with-private-hosts.sh).
exec scripts/with-private-hosts.sh \
  "$CARGO_TARGET_DIR/release/accel-agent" --no-python "$VENV/bin/python" bench/store.py "$@"
