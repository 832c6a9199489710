#!/usr/bin/env bash
# Proves that accel builds with the Rust toolchain alone: in a private mount
# namespace every `protoc` on PATH and protobuf's include directory are
# hidden (PROTOC unset), and the README's run command builds accel-agent and
# runs examples/hello.py (plain Python, no torch): four ranks must print, and
# the command exit 0.
# Its target directory (~/.cache/accel/target-no-protoc, or
# ACCEL_NO_PROTOC_TARGET) is kept between runs, and nothing but this check
# ever builds in it: every artifact in it was built with protoc hidden, so a
# cached build proves what a build from an empty directory proves (a crate or
# build script that changes, or a new dependency, is built here again without
# protoc), on a fresh machine it is empty, and a run after a small change costs
# an incremental release build instead of a whole one.
# Usage: scripts/check-no-protoc.sh   (as root: it mounts over protoc)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != --hidden ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "check-no-protoc: run as root (protoc is hidden by a bind mount in a private mount namespace)" >&2
    exit 1
  fi
  exec unshare --mount --propagation private "$0" --hidden
fi

# Inside the namespace: nothing here is seen outside it.
while read -r protoc; do
  mount --bind /dev/null "$protoc"
done < <(type -ap protoc | sort -u)
if [ -d /usr/include/google/protobuf ]; then
  mount -t tmpfs -o ro,size=4k none /usr/include/google/protobuf
fi
unset PROTOC PROTOC_INCLUDE
if protoc --version >/dev/null 2>&1; then
  echo "check-no-protoc: protoc still runs; cannot check the build without it" >&2
  exit 1
fi

target="${ACCEL_NO_PROTOC_TARGET:-${ACCEL_CACHE:-$HOME/.cache/accel}/target-no-protoc}"
mkdir -p "$target"
log="$(mktemp "${TMPDIR:-/tmp}/accel-no-protoc.XXXXXX")"
trap 'rm -f "$log"' EXIT
status=0
CARGO_TARGET_DIR="$target" \
  cargo run --release --locked --bin accel-agent -- --nproc-per-node 4 examples/hello.py \
  >"$log" 2>&1 || status=$?
ranks="$(grep -oE 'RANK=[0-9]+ LOCAL_RANK=[0-9]+ WORLD_SIZE=4 ' "$log" | sort -u | wc -l)"
if [ "$status" != 0 ] || [ "$ranks" != 4 ]; then
  tail -n 40 "$log" >&2
  echo "check-no-protoc: without protoc, the README's run command exited $status with $ranks of 4 ranks printed" >&2
  exit 1
fi
echo "check-no-protoc: built and ran with no protoc: 4 ranks, exit 0" >&2
