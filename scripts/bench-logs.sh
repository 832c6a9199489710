#!/usr/bin/env bash
# Tee benchmark against torchrun (see bench/logs.py). Usage: scripts/bench-logs.sh [--mb 200] [--lines 300]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
VENV="$(scripts/setup.sh)"
cargo build --release --locked -p accel-agent >&2
exec scripts/with-private-hosts.sh \
  "$VENV/bin/python" bench/logs.py --accel "$CARGO_TARGET_DIR/release/accel-agent" --torchrun "$VENV/bin/torchrun" "$@"
