#!/usr/bin/env bash
# Checks the Python wheels as users get them:
#  1. builds the wheels that are published, one per architecture, x86_64 and
#     aarch64 (Grace), with scripts/build-wheel.sh: maturin (release profile,
#     stripped), zig, the musl targets, so the three binaries are static and
#     the wheels are tagged manylinux2014 and musllinux_1_1; into
#     $CARGO_TARGET_DIR/wheels; checks each one's tags, contents and RECORD,
#     and that each binary is for its architecture and static (no program
#     interpreter, no shared library);
#  2. makes a fresh venv and installs the x86_64 wheel into it with pip (no
#     index, no dependencies: it has none); and `pip install .` into another
#     (the same build, reused). The pinned torch and accelerate (and the test
#     tools: pytest, ipykernel, nbclient) come from the pinned venv through a
#     .pth file instead of a 4.8 GB copy; `accel` and the binaries come only
#     from the wheel;
#  3. from that venv: accel-agent, rdzv-server and accel run from its bin/, and
#     `accel-agent --nproc-per-node 2 examples/hello.py` prints both ranks;
#     pip takes the x86_64 wheel for a musl platform too
#     (`--platform musllinux_1_1_x86_64`); the aarch64 wheel is installed by
#     pip for that platform (`--platform manylinux2014_aarch64 --target DIR`)
#     and its binaries run under qemu-user: a standalone job of two `true`
#     workers, and a two-node job through the aarch64 rdzv-server;
#  4. runs python/tests with that venv's Python: notebooks in real Jupyter
#     kernels (ipykernel, nbclient) calling accel's notebook_launcher and
#     debug_launcher, accelerate's own launcher on the same notebook, and
#     accelerate's notebook test suite with the launcher swapped. They run in a
#     private mount namespace whose /etc/hosts maps ::1 and ::ffff:127.0.0.1
#     (torch's TCPStore reverse-resolves loopback peers; see DESIGN notes).
# Prints each wheel's size and build time, and the install time. Nothing is skipped.
# Usage: scripts/check-wheel.sh   (after scripts/setup.sh; as root, for unshare)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "check-wheel: $*" >&2; }
fail() {
  echo "check-wheel: FAIL: $*" >&2
  exit 1
}

VENV="${ACCEL_VENV:-$HOME/.cache/accel/venv}"
[ -x "$VENV/bin/maturin" ] || fail "$VENV has no maturin: run scripts/setup.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
# The agent the launchers run is the installed one, not a development build.
unset ACCEL_AGENT

# 1. The wheels. Each architecture is built once (a release build with LTO
# costs minutes) into its own $CARGO_TARGET_DIR/TRIPLE, which later runs (and
# scripts/build-image.sh, for x86_64) reuse.
command -v readelf >/dev/null || fail "readelf is missing (binutils): run scripts/setup.sh"
OUT="$CARGO_TARGET_DIR/wheels"
rm -rf "$OUT"
declare -A WHEELS
for arch in x86_64 aarch64; do
  start=$SECONDS
  WHEEL=$(ACCEL_VENV="$VENV" scripts/build-wheel.sh "$arch" "$OUT/$arch" --binaries "$OUT/$arch/bin") || fail "building the $arch wheel failed"
  size=$(stat -c %s "$WHEEL")
  say "built $(basename "$WHEEL") ($((size / 1024)) KiB) in $((SECONDS - start)) s"
  case "$(basename "$WHEEL")" in
    *-py3-none-manylinux2014_"$arch".manylinux_2_17_"$arch".musllinux_1_1_"$arch".whl) ;;
    *) fail "the $arch wheel's tags are not py3-none-manylinux2014_$arch.manylinux_2_17_$arch.musllinux_1_1_$arch: $(basename "$WHEEL")" ;;
  esac
  # Contents, and RECORD: every file listed once with its sha256 and size.
  "$VENV/bin/python" - "$WHEEL" "$arch" <<'EOF' || fail "the $arch wheel's contents are not as expected"
import base64, csv, hashlib, io, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
need = ["accel/__init__.py", "accel/launchers.py", "accel/_forkserver.py", "accel/py.typed"]
scripts = sorted(n.rsplit("/", 1)[1] for n in names if ".data/scripts/" in n)
missing = [n for n in need if n not in names]
if missing or scripts != ["accel", "accel-agent", "rdzv-server"]:
    sys.exit(f"missing {missing}, scripts {scripts}")
info = [n for n in names if n.endswith(".dist-info/WHEEL")]
tags = [l.split(":", 1)[1].strip() for l in z.read(info[0]).decode().splitlines() if l.startswith("Tag:")]
want = {f"py3-none-{p}_{sys.argv[2]}" for p in ("manylinux_2_17", "manylinux2014", "musllinux_1_1")}
if set(tags) != want:
    sys.exit(f"WHEEL says Tag: {tags}, expected {sorted(want)}")
record = [n for n in names if n.endswith(".dist-info/RECORD")]
rows = list(csv.reader(io.StringIO(z.read(record[0]).decode())))
listed = {r[0] for r in rows}
if listed != set(names) or len(rows) != len(names):
    sys.exit(f"RECORD lists {sorted(listed ^ set(names))} differently from the archive")
for path, digest, size in rows:
    if path == record[0]:
        continue
    data = z.read(path)
    want_digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if digest != want_digest or int(size) != len(data):
        sys.exit(f"RECORD's hash or size of {path} is wrong")
EOF
  # The binaries (build-wheel.sh checked that they are static): the right
  # machine.
  case "$arch" in
    x86_64) machine="Advanced Micro Devices X86-64" ;;
    aarch64) machine="AArch64" ;;
  esac
  for b in accel-agent rdzv-server accel; do
    f="$OUT/$arch/bin/$b"
    readelf -h "$f" | grep -q "Machine: *$machine\$" || fail "$arch wheel's $b is not a $machine binary: $(readelf -h "$f" | grep Machine)"
  done
  say "$arch binaries are static and for $arch"
  WHEELS[$arch]="$WHEEL"
done
WHEEL="${WHEELS[x86_64]}"

# 2. A fresh venv, and the wheel installed into it.
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
FRESH="$TMP/venv"
"$VENV/bin/python" -m venv "$FRESH"
pinned=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
fresh_site=$("$FRESH/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$pinned" >"$fresh_site/accel-pinned-venv.pth"
start_ns=$(date +%s%N)
"$FRESH/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps "$WHEEL"
say "installed into a fresh venv in $((($(date +%s%N) - start_ns) / 1000000)) ms"

# ... and `pip install .` from the repository, as the README's install says
# (without build isolation: maturin, the build backend, is the pinned venv's).
# MATURIN_PEP517_ARGS gives it the x86_64 wheel's build options, so it reuses
# that build instead of a third release build with LTO (minutes); a user's
# plain `pip install .` links with the system's cc instead of zig, as the
# test command's `cargo build` does.
SOURCE_VENV="$TMP/from-source"
"$VENV/bin/python" -m venv "$SOURCE_VENV"
echo "$pinned" >"$("$SOURCE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/accel-pinned-venv.pth"
PATH="$VENV/bin:$PATH" MATURIN_PEP517_ARGS="--zig --target x86_64-unknown-linux-musl --compatibility manylinux2014 musllinux_1_1" \
  "$SOURCE_VENV/bin/pip" install --quiet --disable-pip-version-check --no-index --no-build-isolation . >&2
"$SOURCE_VENV/bin/accel-agent" --version >/dev/null || fail "pip install . did not install a working accel-agent"
"$SOURCE_VENV/bin/python" -c 'from accel import notebook_launcher, debug_launcher' || fail "pip install . did not install accel"
say "pip install . from the repository works"

# 3. The binaries from the venv's bin/.
for b in accel-agent rdzv-server accel; do
  [ -x "$FRESH/bin/$b" ] || fail "$b is not in the venv's bin/"
  "$FRESH/bin/$b" --version >/dev/null || fail "$b --version failed"
done
where=$("$FRESH/bin/python" -c 'import accel, os; print(os.path.dirname(accel.__file__))')
[ "$where" = "$fresh_site/accel" ] || fail "accel is imported from $where, not the fresh venv"
out=$(cd "$TMP" && PATH="$FRESH/bin:$PATH" accel-agent --nproc-per-node 2 "$OLDPWD/examples/hello.py" 2>"$TMP/hello.err") ||
  fail "accel-agent --nproc-per-node 2 examples/hello.py failed: $(tail -5 "$TMP/hello.err")"
for r in 0 1; do
  grep -q "^RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 " <<<"$out" || fail "rank $r did not print: $out"
done
say "accel-agent from the venv ran examples/hello.py with 2 workers"

# pip takes the x86_64 wheel for a musl distribution too.
MUSL="$TMP/musl"
"$FRESH/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps \
  --only-binary=:all: --platform musllinux_1_1_x86_64 --target "$MUSL" "$WHEEL" ||
  fail "pip refused the x86_64 wheel for --platform musllinux_1_1_x86_64"
[ -x "$MUSL/bin/accel-agent" ] || fail "pip --target did not install accel-agent from the wheel for musllinux"
say "pip takes the x86_64 wheel for musllinux_1_1_x86_64 too"

# The aarch64 wheel: pip takes it for that platform (and refuses it here),
# and its static binaries run under qemu-user. The agent's workers are the
# host's own `true` and `sh`: qemu-user hands a guest's execve to the kernel,
# which runs them natively (no binfmt_misc is needed, and none is
# registered), so the job exercises the aarch64 agent's rendezvous, spawning,
# monitoring and exit while its workers are x86_64.
ARM_WHEEL="${WHEELS[aarch64]}"
if "$FRESH/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps --dry-run "$ARM_WHEEL" >/dev/null 2>&1; then
  fail "pip would install the aarch64 wheel on $(uname -m): its tag does not say aarch64"
fi
ARM="$TMP/aarch64"
"$FRESH/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps \
  --only-binary=:all: --platform manylinux2014_aarch64 --target "$ARM" "$ARM_WHEEL" ||
  fail "pip refused the aarch64 wheel for --platform manylinux2014_aarch64"
[ -f "$ARM/accel/launchers.py" ] || fail "pip --target did not install the accel package from the aarch64 wheel"
command -v qemu-aarch64-static >/dev/null || fail "qemu-aarch64-static is missing: run scripts/setup.sh"
arm() { qemu-aarch64-static "$@"; }
for b in accel-agent rdzv-server accel; do
  [ -x "$ARM/bin/$b" ] || fail "pip did not install the aarch64 $b into $ARM/bin"
  v=$(arm "$ARM/bin/$b" --version) || fail "aarch64 $b --version failed under qemu"
  say "aarch64 $v"
done
(cd "$TMP" && ACCEL_LOG=warn arm "$ARM/bin/accel-agent" --nproc-per-node 2 --no-python true) >"$TMP/arm-true.out" 2>&1 ||
  fail "aarch64 accel-agent --nproc-per-node 2 --no-python true failed under qemu: $(tail -5 "$TMP/arm-true.out")"
say "aarch64 accel-agent ran 2 true workers under qemu"
# Two nodes of two workers through the aarch64 rdzv-server.
port=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Not through `arm`: a function would run in a subshell, and `kill $srv`
# would stop the subshell and leave the server running.
RUST_LOG=warn qemu-aarch64-static "$ARM/bin/rdzv-server" --bind "127.0.0.1:$port" \
  --metrics-bind off 2>"$TMP/arm-server.err" &
srv=$!
trap 'kill $srv 2>/dev/null || true; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do
  arm "$ARM/bin/rdzv-server" status --rdzv-endpoint "127.0.0.1:$port" >/dev/null 2>&1 && break
  kill -0 $srv 2>/dev/null || fail "the aarch64 rdzv-server exited: $(tail -5 "$TMP/arm-server.err")"
  sleep 0.2
done
agents=()
for n in 0 1; do
  (cd "$TMP" && ACCEL_LOG=warn arm "$ARM/bin/accel-agent" --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" --rdzv-id wheel-aarch64 --no-python \
    sh -c 'echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE"') >"$TMP/arm-node$n.out" 2>&1 &
  agents+=($!)
done
for n in 0 1; do
  wait "${agents[$n]}" || fail "aarch64 agent $n of the two-node job failed: $(tail -5 "$TMP/arm-node$n.out")"
done
kill $srv
wait $srv 2>/dev/null || true
ranks=$(cat "$TMP"/arm-node*.out | grep -o '^RANK=[0-9]* WORLD_SIZE=4$' | sort)
[ "$ranks" = "$(printf 'RANK=%d WORLD_SIZE=4\n' 0 1 2 3)" ] ||
  fail "the aarch64 two-node job did not print ranks 0-3 of 4: $(cat "$TMP"/arm-node*.out)"
say "aarch64 rdzv-server and two aarch64 agents ran a 2x2 job under qemu"

# 4. The launchers in real Jupyter kernels.
scripts/with-private-hosts.sh env -u PYTHONPATH PATH="$FRESH/bin:$PATH" JUPYTER_PLATFORM_DIRS=1 \
  "$FRESH/bin/python" -m pytest -q -p no:cacheprovider python/tests
say "ok"
