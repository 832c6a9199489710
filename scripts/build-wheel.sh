#!/usr/bin/env bash
# Builds the wheel `accel-launch` for one architecture as it is published, and
# nothing else: maturin (pyproject.toml: release profile, stripped) with zig as
# the C compiler and linker (`--zig`), for the `*-unknown-linux-musl` target,
# so accel-agent, rdzv-server and accel are static executables that need no
# libc where they run. The wheel is tagged for glibc and musl distributions
# alike (manylinux2014 and musllinux_1_1), as maturin's own wheels are.
#
# It is the one release build of accel's binaries per architecture:
# scripts/check-wheel.sh checks these wheels, and scripts/build-image.sh puts
# the x86_64 wheel's binaries in the container image (`--binaries DIR`), so
# the image and the wheel ship the same executables and a second call with
# the same sources costs seconds (cargo finds the build fresh).
#
# Usage: scripts/build-wheel.sh ARCH OUTDIR [--binaries DIR]
#   ARCH            x86_64 or aarch64
#   OUTDIR          where the wheel goes (emptied of older accel wheels first)
#   --binaries DIR  also extract the three executables into DIR, and check
#                   that each is static (no program interpreter, no shared
#                   library)
# Prints the wheel's path on stdout.
# Environment: ACCEL_VENV, a venv with maturin and ziglang (default
# ~/.cache/accel/venv, made by scripts/setup.sh; elsewhere
# `pip install maturin==1.16.0 ziglang==0.15.2`); CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "build-wheel: $*" >&2
  exit 1
}
[ $# -ge 2 ] || fail "usage: scripts/build-wheel.sh ARCH OUTDIR [--binaries DIR]"
arch="$1" out="$2" bins=""
shift 2
while [ $# -gt 0 ]; do
  case "$1" in
    --binaries) bins="${2:?--binaries needs a directory}"; shift 2 ;;
    *) fail "unknown argument $1" ;;
  esac
done
case "$arch" in
  x86_64 | aarch64) ;;
  *) fail "ARCH must be x86_64 or aarch64, not $arch" ;;
esac
TARGET="$arch-unknown-linux-musl"
# Static binaries run on any Linux of the architecture: the manylinux tag
# lets pip take the wheel on glibc distributions, the musllinux tag on
# Alpine and other musl ones.
COMPAT=(manylinux2014 musllinux_1_1)
VENV="${ACCEL_VENV:-$HOME/.cache/accel/venv}"
[ -x "$VENV/bin/maturin" ] || fail "$VENV has no maturin: run scripts/setup.sh (or pip install maturin ziglang, and set ACCEL_VENV)"
"$VENV/bin/python" -m ziglang version >/dev/null 2>&1 || fail "$VENV has no ziglang (maturin's --zig): run scripts/setup.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
if ! rustup target list --installed | grep -qx "$TARGET"; then
  echo "build-wheel: adding the $TARGET target" >&2
  rustup target add "$TARGET" >&2
fi
mkdir -p "$out"
rm -f "$out"/accel_launch-*.whl
# maturin runs zig as `python -m ziglang` with the python3 on PATH.
PATH="$VENV/bin:$PATH" "$VENV/bin/maturin" build --quiet --locked --release --zig \
  --target "$TARGET" --compatibility "${COMPAT[@]}" --out "$out" >&2
wheels=("$out"/accel_launch-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || fail "expected one wheel in $out, found: ${wheels[*]}"
if [ -n "$bins" ]; then
  mkdir -p "$bins"
  "$VENV/bin/python" - "${wheels[0]}" "$bins" <<'EOF'
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if ".data/scripts/" in n:
        path = os.path.join(sys.argv[2], n.rsplit("/", 1)[1])
        with open(path, "wb") as f:
            f.write(z.read(n))
        os.chmod(path, 0o755)
EOF
  command -v readelf >/dev/null || fail "readelf is missing (binutils)"
  for b in accel-agent rdzv-server accel; do
    f="$bins/$b"
    if readelf -l "$f" | grep -q INTERP || readelf -d "$f" | grep -q '(NEEDED)'; then
      fail "$f is not static: $(readelf -l "$f" | grep -A1 INTERP) $(readelf -d "$f" | grep NEEDED)"
    fi
  done
fi
echo "${wheels[0]}"
