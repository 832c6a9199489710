#!/usr/bin/env bash
# Dead-node benchmark: 3 agents (2 workers each, c10d, --nnodes 2:3) on one
# rdzv-server; one agent is killed with SIGKILL; prints the time until the
# survivors' workers of the re-formed round are running, with default and with
# sub-second keep-alive settings. Workers are shell scripts that stamp their
# start time, so interpreter start-up is not measured.
# Usage: scripts/bench-dead-node.sh [runs]
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
cargo build --release --locked -p rendezvous-server -p accel-agent >&2
B="$CARGO_TARGET_DIR/release"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/stamp.sh" <<'STAMP'
#!/bin/sh
echo "$(date +%s.%N)" >> "$STAMP_DIR/starts.$GROUP_RANK.$LOCAL_RANK"
exec sleep 60
STAMP
chmod +x "$work/stamp.sh"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"

measure() {
  local conf="$1" run="$2"
  local dir="$work/$run"
  mkdir -p "$dir"
  RUST_LOG=warn "$B/rdzv-server" --bind "127.0.0.1:$port" --metrics-bind off 2>/dev/null & local srv=$!
  sleep 0.3
  local pids=()
  for i in 0 1 2; do
    STAMP_DIR="$dir" ACCEL_LOG=error "$B/accel-agent" --nnodes 2:3 --nproc-per-node 2 --rdzv-backend c10d \
      --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "dead-$run" --rdzv-conf "$conf" --no-python "$work/stamp.sh" &
    pids+=($!)
  done
  sleep 2
  date +%s.%N > "$dir/killed"
  kill -9 "${pids[2]}"
  sleep 1.5
  (python3 - "$dir" <<'PY'
import glob, sys
d = sys.argv[1]
k = float(open(f"{d}/killed").read())
starts = [float(l) for f in glob.glob(f"{d}/starts.*") for l in open(f) if float(l) > k]
print(f"{1000 * (max(starts) - k):.1f} ms" if len(starts) == 4 else f"incomplete ({len(starts)} of 4 restarted)")
PY
  ) > "$dir/result"
  kill "${pids[0]}" "${pids[1]}" 2>/dev/null || true
  wait "${pids[0]}" "${pids[1]}" 2>/dev/null || true
  kill "$srv"; wait "$srv" 2>/dev/null || true
}

runs="${1:-3}"
echo "| keep-alive settings | kill -9 to all survivor workers running (per run) |"
echo "|---|---|"
for label_conf in "default (5 s x 3)|last_call_timeout=1" "sub-second (0.2 s x 2)|last_call_timeout=1,keep_alive_interval=0.2,keep_alive_max_attempt=2"; do
  label="${label_conf%%|*}"; conf="${label_conf#*|}"
  results=()
  for r in $(seq 1 "$runs"); do
    measure "$conf" "${label%% *}-$r" 2>/dev/null
    results+=("$(cat "$work/${label%% *}-$r/result")")
  done
  echo "| $label | ${results[*]} |"
done
