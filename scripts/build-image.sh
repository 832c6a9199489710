#!/usr/bin/env bash
# Builds accel's container image (accel/rdzv-server:VERSION) without a Docker
# engine and without pulling a base image: the three binaries are the wheel's
# (scripts/build-wheel.sh: static musl executables, built here or found fresh
# in cargo's target dir) and go into an image FROM scratch with buildah. The
# same script builds the arm64 image (--arch aarch64: the aarch64 wheel's
# binaries, for Grace machines such as GH200 and GB200); no emulation is
# needed to build it, only to run it.
# The result has the same contents and configuration as the Dockerfile's final
# stage (/usr/local/bin/{rdzv-server,accel-agent,accel}, /etc/passwd and
# /etc/group with user 65532, /tmp; USER 65532:65532, EXPOSE 29400 29401,
# ENTRYPOINT rdzv-server, the same OCI labels).
#
# Usage: scripts/build-image.sh [--arch x86_64|aarch64] [--out PATH]
#                               [--format oci-archive|docker-archive]
#                               [--tag NAME:TAG] [--no-archive]
#   --arch A       the machine: x86_64 (default; image architecture amd64) or
#                  aarch64 (arm64; default tag accel/rdzv-server:VERSION-arm64)
#   --out PATH     where the archive goes
#                  (default: $CARGO_TARGET_DIR/image/accel-rdzv-server-VERSION.<format>.tar)
#   --format F     oci-archive (default) or docker-archive (for `docker load`)
#   --tag T        image name (default: accel/rdzv-server:VERSION, VERSION from Cargo.toml)
#   --no-archive   only commit the image to local container storage
# Environment:
#   CARGO_TARGET_DIR        cargo's target dir (default: ~/.cache/accel/target)
#   ACCEL_VENV              a venv with maturin and ziglang, for
#                           scripts/build-wheel.sh (default: ~/.cache/accel/venv)
#   ACCEL_IMAGE_STORAGE     buildah's storage driver (default: vfs, which needs
#                           no overlay mounts and works inside a sandbox)
# Runs as root (buildah's rootful storage); installs buildah from Debian if
# it is missing.
# Prints the image name and the archive path on stdout as its last two lines.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "build-image: run as root (buildah's rootful storage; the tests here all run as root)" >&2
  exit 1
fi

BINS=(rdzv-server accel-agent accel)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
STORAGE="${ACCEL_IMAGE_STORAGE:-vfs}"

out="" format="oci-archive" tag="" archive=1 arch=x86_64
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="${2:?--arch needs a value}"; shift 2 ;;
    --arch=*) arch="${1#--arch=}"; shift ;;
    --out) out="${2:?--out needs a path}"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --format) format="${2:?--format needs a value}"; shift 2 ;;
    --format=*) format="${1#--format=}"; shift ;;
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --tag=*) tag="${1#--tag=}"; shift ;;
    --no-archive) archive=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$arch" in
  x86_64) oci_arch=amd64 suffix="" ;;
  aarch64) oci_arch=arm64 suffix="-arm64" ;;
  *) echo "build-image: --arch must be x86_64 or aarch64, not $arch" >&2; exit 2 ;;
esac
TARGET="$arch-unknown-linux-musl"
case "$format" in
  oci-archive|docker-archive) ;;
  *) echo "build-image: --format must be oci-archive or docker-archive, not $format" >&2; exit 2 ;;
esac

# The version the crates declare ([workspace.package] version).
VERSION="$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')"
tag="${tag:-accel/rdzv-server:$VERSION$suffix}"
out="${out:-$CARGO_TARGET_DIR/image/accel-rdzv-server-$VERSION$suffix.$format.tar}"
# Labels as the Dockerfile sets them; source and revision from git when known.
SOURCE_URL="$(git remote get-url origin 2>/dev/null || true)"
REVISION="$(git rev-parse HEAD 2>/dev/null || true)"
# Image and file timestamps from the commit, so the same commit gives the same image.
EPOCH="$(git log -1 --format=%ct 2>/dev/null || date +%s)"

if ! command -v buildah >/dev/null; then
  echo "build-image: installing buildah" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null
fi
# The wheel's binaries: one release build serves the wheel and the image.
wheeldir="$CARGO_TARGET_DIR/image/wheel${suffix}"
bindir="$wheeldir/bin"
rm -rf "$bindir"
echo "build-image: scripts/build-wheel.sh $arch (target dir $CARGO_TARGET_DIR)" >&2
# It checks that they are static: no program interpreter, no shared library.
scripts/build-wheel.sh "$arch" "$wheeldir" --binaries "$bindir" >/dev/null

# The root file system of the final stage, staged in a scratch directory.
stage="$(mktemp -d)"
ctr=""
cleanup() {
  [ -z "$ctr" ] || buildah --storage-driver "$STORAGE" rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$stage"
}
trap cleanup EXIT
mkdir -p "$stage/usr/local/bin" "$stage/etc" "$stage/tmp"
for b in "${BINS[@]}"; do install -m 0755 "$bindir/$b" "$stage/usr/local/bin/"; done
chmod 1777 "$stage/tmp"
echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > "$stage/etc/passwd"
echo 'nonroot:x:65532:' > "$stage/etc/group"

B=(buildah --storage-driver "$STORAGE")
ctr="$("${B[@]}" from --arch "$oci_arch" --os linux --name "accel-image-$$" scratch)"
"${B[@]}" copy --chown 0:0 "$ctr" "$stage/" / >/dev/null
"${B[@]}" config \
  --arch "$oci_arch" --os linux \
  --user 65532:65532 \
  --port 29400/tcp --port 29401/tcp \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --entrypoint '["/usr/local/bin/rdzv-server"]' --cmd '' \
  --created-by "scripts/build-image.sh (the $arch wheel's static $TARGET binaries, FROM scratch)" \
  --label org.opencontainers.image.title="accel rdzv-server" \
  --label org.opencontainers.image.description="accel's rendezvous server, with accel-agent and accel (static binaries)" \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.licenses="Apache-2.0" \
  --label org.opencontainers.image.source="$SOURCE_URL" \
  --label org.opencontainers.image.revision="$REVISION" \
  "$ctr"
previous="$("${B[@]}" images --quiet --no-trunc "$tag" 2>/dev/null | head -n1 || true)"
"${B[@]}" commit --quiet --format oci --timestamp "$EPOCH" --rm "$ctr" "$tag" >/dev/null
ctr=""
# The image this tag named before, now untagged, is removed (only that one).
current="$("${B[@]}" images --quiet --no-trunc "$tag" | head -n1)"
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  "${B[@]}" rmi "$previous" >/dev/null 2>&1 || true
fi
size="$("${B[@]}" images --format '{{.Size}}' "$tag" | head -n1)"
echo "build-image: committed $tag ($size; storage driver $STORAGE)" >&2
if [ "$archive" = 1 ]; then
  mkdir -p "$(dirname "$out")"
  rm -f "$out"
  "${B[@]}" push --quiet "$tag" "$format:$out:$tag" >&2
  echo "build-image: wrote $out ($(du -h "$out" | cut -f1))" >&2
fi
echo "$tag"
[ "$archive" = 1 ] && echo "$out" || echo ""
