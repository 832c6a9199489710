#!/usr/bin/env bash
# Runs a command where protoc does not exist: in a private mount namespace,
# every `protoc` on PATH is covered by /dev/null, protobuf's include directory
# by an empty file system, and PROTOC and PROTOC_INCLUDE are unset. Nothing is
# changed outside the namespace. accel builds with the Rust toolchain alone
# (protox compiles the .proto files), and the test command runs every build
# and test through this script, so a build that needed protoc would fail there.
# Inside, ACCEL_PROTOC_NS names the namespace: a nested call (or
# scripts/check-no-protoc.sh) sees it is already inside and adds nothing.
# Usage: scripts/without-protoc.sh CMD [ARG...]   (as root, for unshare)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/without-protoc.sh CMD [ARG...]" >&2; exit 64; }
here="$(readlink /proc/self/ns/mnt)"
if [ "${ACCEL_PROTOC_NS:-}" = "$here" ]; then
  exec "$@"
fi
if [ "${ACCEL_PROTOC_UNSHARED:-}" != 1 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "without-protoc: run as root (protoc is hidden by a bind mount in a private mount namespace)" >&2
    exit 1
  fi
  ACCEL_PROTOC_UNSHARED=1 exec unshare --mount --propagation private "$0" "$@"
fi
# In the new namespace.
unset ACCEL_PROTOC_UNSHARED PROTOC PROTOC_INCLUDE
while read -r protoc; do
  mount --bind /dev/null "$protoc"
done < <(type -ap protoc | sort -u)
if [ -d /usr/include/google/protobuf ]; then
  mount -t tmpfs -o ro,size=4k none /usr/include/google/protobuf
fi
if protoc --version >/dev/null 2>&1; then
  echo "without-protoc: protoc still runs; cannot hide it" >&2
  exit 1
fi
ACCEL_PROTOC_NS="$(readlink /proc/self/ns/mnt)"
export ACCEL_PROTOC_NS
exec "$@"
