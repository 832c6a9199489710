#!/usr/bin/env bash
# Proves that accel builds with the Rust toolchain alone and that the README's
# run command works without protoc: under scripts/without-protoc.sh (entered
# here unless the caller already is), `cargo run --locked --bin accel-agent --
# --nproc-per-node 4 examples/hello.py` runs hello.py (plain Python, no torch)
# on four ranks, which must print, and the command must exit 0.
#
# The test command runs all of its builds and tests without protoc, this step
# among them, so by default it builds the debug binaries of every target here
# (nothing to do after the checks lane's build, whose features are the same:
# `cargo run --bin` alone would leave out the tests' tokio features and build
# tokio and everything above it again) and runs accel-agent from there; the
# release builds (the wheels, the image's binaries) are made without protoc
# too. Build scripts (where .proto files are compiled, by protox) are the same
# in both profiles. `--release` runs the README's command exactly, with a
# release build of its own.
# Usage: scripts/check-no-protoc.sh [--release]   (as root: it mounts over protoc)
set -euo pipefail
cd "$(dirname "$0")/.."
# without-protoc.sh fails if protoc still runs there.
if [ "${ACCEL_PROTOC_NS:-}" != "$(readlink /proc/self/ns/mnt)" ]; then
  exec scripts/without-protoc.sh "$0" "$@"
fi
case "${1:-}" in
  --release) run=(cargo run --release --locked --bin accel-agent --) ;;
  "")
    cargo build --locked --all-targets
    run=("${CARGO_TARGET_DIR:-target}/debug/accel-agent")
    ;;
  *) echo "usage: scripts/check-no-protoc.sh [--release]" >&2; exit 64 ;;
esac
log="$(mktemp "${TMPDIR:-/tmp}/accel-no-protoc.XXXXXX")"
trap 'rm -f "$log"' EXIT
status=0
"${run[@]}" --nproc-per-node 4 examples/hello.py >"$log" 2>&1 || status=$?
ranks="$(grep -oE 'RANK=[0-9]+ LOCAL_RANK=[0-9]+ WORLD_SIZE=4 ' "$log" | sort -u | wc -l)"
if [ "$status" != 0 ] || [ "$ranks" != 4 ]; then
  tail -n 40 "$log" >&2
  echo "check-no-protoc: without protoc, the README's run command exited $status with $ranks of 4 ranks printed" >&2
  exit 1
fi
echo "check-no-protoc: built and ran with no protoc: 4 ranks, exit 0" >&2
