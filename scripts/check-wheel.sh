#!/usr/bin/env bash
# Checks the Python wheel as a user gets it:
#  1. builds it with maturin (pyproject.toml: release profile, stripped) into
#     $CARGO_TARGET_DIR/wheels, and checks its tag and contents;
#  2. makes a fresh venv and installs the wheel into it with pip (no index, no
#     dependencies: it has none); and `pip install .` into another. The pinned torch and accelerate (and the test
#     tools: pytest, ipykernel, nbclient) come from the pinned venv through a
#     .pth file instead of a 4.8 GB copy; `accel` and the binaries come only
#     from the wheel;
#  3. from that venv: accel-agent, rdzv-server and accel run from its bin/, and
#     `accel-agent --nproc-per-node 2 examples/hello.py` prints both ranks;
#  4. runs python/tests with that venv's Python: notebooks in real Jupyter
#     kernels (ipykernel, nbclient) calling accel's notebook_launcher and
#     debug_launcher, accelerate's own launcher on the same notebook, and
#     accelerate's notebook test suite with the launcher swapped. They run in a
#     private mount namespace whose /etc/hosts maps ::1 and ::ffff:127.0.0.1
#     (torch's TCPStore reverse-resolves loopback peers; see DESIGN notes).
# Prints the wheel's size and the install time. Nothing is skipped.
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

# 1. The wheel.
OUT="$CARGO_TARGET_DIR/wheels"
rm -rf "$OUT"
start=$SECONDS
"$VENV/bin/maturin" build --quiet --locked --release --out "$OUT" >&2
wheels=("$OUT"/accel_launch-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || fail "expected one wheel in $OUT, found: ${wheels[*]}"
WHEEL="${wheels[0]}"
size=$(stat -c %s "$WHEEL")
say "built $(basename "$WHEEL") ($((size / 1024)) KiB) in $((SECONDS - start)) s"
case "$(basename "$WHEEL")" in
  *-py3-none-manylinux_*_x86_64.whl | *-py3-none-manylinux*.manylinux_*_x86_64.whl) ;;
  *) fail "the wheel's tag is not a py3-none manylinux one: $(basename "$WHEEL")" ;;
esac
"$VENV/bin/python" - "$WHEEL" <<'EOF' || fail "the wheel's contents are not as expected"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["accel/__init__.py", "accel/launchers.py", "accel/_forkserver.py", "accel/py.typed"]
scripts = sorted(n.rsplit("/", 1)[1] for n in names if ".data/scripts/" in n)
missing = [n for n in need if n not in names]
if missing or scripts != ["accel", "accel-agent", "rdzv-server"]:
    sys.exit(f"missing {missing}, scripts {scripts}")
EOF

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
SOURCE_VENV="$TMP/from-source"
"$VENV/bin/python" -m venv "$SOURCE_VENV"
echo "$pinned" >"$("$SOURCE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/accel-pinned-venv.pth"
PATH="$VENV/bin:$PATH" "$SOURCE_VENV/bin/pip" install --quiet --disable-pip-version-check --no-index --no-build-isolation . >&2
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

# 4. The launchers in real Jupyter kernels.
scripts/with-private-hosts.sh env -u PYTHONPATH PATH="$FRESH/bin:$PATH" JUPYTER_PLATFORM_DIRS=1 \
  "$FRESH/bin/python" -m pytest -q -p no:cacheprovider python/tests
say "ok"
