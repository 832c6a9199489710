#!/usr/bin/env bash
# Launch benchmark against torchrun (run scripts/setup.sh first, or the test command).
# Usage: scripts/bench-launch.sh [--nproc 4] [--runs 10]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
VENV="$(scripts/setup.sh)"
cargo build --release --locked -p accel-agent >&2
exec "$VENV/bin/python" bench/launch.py --accel "$CARGO_TARGET_DIR/release/accel-agent" \
  --torchrun "$VENV/bin/torchrun" "$@"
