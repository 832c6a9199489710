#!/usr/bin/env bash
# All-reduce bandwidth of Rust ranks (worker-runtime, tch) next to Python ranks
# (torch.distributed), same gloo, same launcher: 4 ranks on this machine,
# float32 tensors of 1 MiB and 64 MiB by default.
# Usage: scripts/bench-worker-runtime.sh [--nproc 4] [--iters 20] [--rounds 3] [BYTES...]
# Each round runs a Rust job, then a Python job; each job times `iters`
# all_reduce(SUM) calls per size and reports their median. Prints per size
# and rank kind: the median over rounds of those medians, its algorithm
# bandwidth (bytes / time) and bus bandwidth (algbw * 2(n-1)/n, the
# nccl-tests convention).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
VENV="$(scripts/setup.sh)"

nproc=4 iters=20 rounds=3 sizes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) nproc="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    *) sizes+=("$1"); shift ;;
  esac
done
[ ${#sizes[@]} -gt 0 ] || sizes=($((1 << 20)) $((64 << 20)))

# tch builds against the venv's torch; the time is spent in libtorch's gloo
# either way, so debug builds of the launcher and the Rust worker suffice
# (built as the tests build them, so the cached tch is reused).
export LIBTORCH_USE_PYTORCH=1 PATH="$VENV/bin:$PATH"
cargo build --locked -p accel-agent >&2
cargo build --locked -p worker-runtime --all-targets >&2
bin="$CARGO_TARGET_DIR/debug"

run() { # KIND PROGRAM...
  local kind="$1"; shift
  # PyTorch's TCPStore wants a private hosts file (see with-private-hosts.sh).
  scripts/with-private-hosts.sh "$bin/accel-agent" --nproc-per-node "$nproc" "$@" \
    "${sizes[@]}" --iters "$iters" 2>"$log/$kind.stderr" | grep '^bench ' \
    || { echo "$kind ranks failed; see $log/$kind.stderr" >&2; exit 1; }
}

log="$(mktemp -d)"
trap 'rm -rf "$log"' EXIT
for _ in $(seq "$rounds"); do
  run rust --no-python "$bin/wr-collectives" bench
  run python worker-runtime/tests/workers/allreduce_bench.py
done | sort -k3,3n -k2,2r -k4,4g | awk -v n="$nproc" '
  function flush() {
    if (count == 0) return
    secs = vals[int((count + 1) / 2)]
    size = key_bytes >= 1048576 ? sprintf("%d MiB", key_bytes / 1048576) : sprintf("%d B", key_bytes)
    alg = key_bytes / secs / 1e9
    printf "%-10s %-7s %12.3f %10.3f %10.3f\n", size, key_kind, secs * 1e3, alg, alg * 2 * (n - 1) / n
  }
  BEGIN { printf "%-10s %-7s %12s %10s %10s\n", "size", "ranks", "median ms", "algbw GB/s", "busbw GB/s" }
  {
    if ($2 != key_kind || $3 != key_bytes) { flush(); count = 0; key_kind = $2; key_bytes = $3 }
    vals[++count] = $4
  }
  END { flush() }'
