#!/usr/bin/env bash
# Installs what accel's tests and benchmarks need, idempotently:
#   - Debian packages: python3 with venv, procps (kill), iproute2, libgloo-dev,
#     etcd-server and etcd-client (etcd 3.4 on Debian 12), nftables (the
#     chaos run's partitions), prometheus (the
#     metrics tests scrape with a real one); for the wheels' checks,
#     binutils (readelf) and qemu-user-static (the aarch64 wheel's static
#     binaries run under qemu);
#   - a pinned Python venv with torch and accelerate, cached outside the clone
#     under ~/.cache/accel/, keyed by the pinned versions; DeepSpeed is added
#     to it (built without its native ops) for accelerate's DeepSpeed launcher,
#     and maturin, pytest, ipykernel and nbclient for the wheel's checks;
#   - beside it, one small venv per other accelerate release the parity tests
#     cover ($VENV/accelerate-versions/X.Y.Z): its own accelerate, and the
#     pinned venv's packages (torch, ...) through a .pth file, so torch is
#     installed once. The tests find them there by version;
#   - one venv per other torch release the conformance tests cover
#     ($CACHE/venv-pyX.Y-torchX.Y.Z: torch and numpy alone, keyed by version,
#     so a new pin does not download them again);
#   - mdBook, pinned, under ~/.cache/accel/tools/ (the user guide's check).
# Prints nothing else but what it installs. Safe to run again.
#
# Usage: scripts/setup.sh [all|core|rest]   (default all; prints the venv)
#   core  the packages, the local user and the pinned venv: what any build
#         or test needs first;
#   rest  mdBook and the other accelerate and torch releases' venvs: only the
#         user guide's check and the integration tests need them, so the test
#         command installs them (mostly downloads) while it builds.
set -euo pipefail
PART="${1:-all}"
case "$PART" in
  all | core | rest) ;;
  *) echo "usage: scripts/setup.sh [all|core|rest]" >&2; exit 64 ;;
esac

TORCH_VERSION="2.13.0"
ACCELERATE_VERSION="1.15.0"
# The other accelerate releases the parity tests run against: the oldest
# supported (latest 1.10 patch) and the newest (tests/src/lib.rs names them too);
# scripts/newest.sh adds the package registry's newest (ACCEL_NEWEST_ACCELERATE).
EXTRA_ACCELERATE_VERSIONS="1.10.1 1.16.0 ${ACCEL_NEWEST_ACCELERATE:-}"
# The other torch releases the conformance tests run against: the oldest
# supported and the newest, each with a numpy it was built for (tests/src/lib.rs
# names them too).
EXTRA_TORCH_VERSIONS="2.4.1:numpy==1.26.4 2.15.0:numpy==2.4.6"
DEEPSPEED_VERSION="0.19.8"
# torchft, for the lighthouse tests (rdzv-server --lighthouse), with the
# releases of its dependencies it was tested with; over the pinned venv's
# torch ($VENV/torchft-X.Y.Z; tests/src/lib.rs names it too).
TORCHFT_VERSION="0.2.0"
TORCHFT_DEPS="opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 protobuf==7.36.2 requests==2.34.2"
PY="$(command -v python3 || true)"
CACHE="${ACCEL_CACHE:-$HOME/.cache/accel}"

if [ "$PART" != rest ]; then
  need_apt=()
  [ -n "$PY" ] || need_apt+=(python3 python3-venv)
  command -v kill >/dev/null || need_apt+=(procps)
  command -v ip >/dev/null || need_apt+=(iproute2)
  # nftables: the HA tests make a replica's host deaf (tests/tests/ha.rs).
  command -v nft >/dev/null || need_apt+=(nftables)
  # certificates for the TLS tests.
  command -v openssl >/dev/null || need_apt+=(openssl)
  # gloo's headers, for worker-runtime's c10d shim (the torch wheel lacks them).
  [ -f /usr/include/gloo/config.h ] || need_apt+=(libgloo-dev)
  # etcd 3.4+ (v3 API with elections) for the HA tests; the tests start their own
  # clusters on loopback ports, never the packaged service.
  command -v etcd >/dev/null || need_apt+=(etcd-server)
  command -v etcdctl >/dev/null || need_apt+=(etcd-client)
  # nftables: the chaos run's network partitions (rules inside namespaces).
  command -v nft >/dev/null || need_apt+=(nftables)
  # A real Prometheus for the metrics tests (they start their own, on loopback);
  # curl for the benchmarks' scrapes.
  command -v prometheus >/dev/null || need_apt+=(prometheus)
  command -v curl >/dev/null || need_apt+=(curl)
  # Debian's Chromium, headless, for the status page's browser test
  # (tests/tests/status_page.rs).
  command -v chromium >/dev/null || need_apt+=(chromium)
  # The wheels' checks (scripts/check-wheel.sh): readelf reads the binaries'
  # headers (architecture, static); the aarch64 binaries run under qemu-user.
  command -v readelf >/dev/null || need_apt+=(binutils)
  command -v qemu-aarch64-static >/dev/null || need_apt+=(qemu-user-static)
  # The shared-node tests act as a second local user (tests/tests/shared_node.rs).
  command -v useradd >/dev/null || need_apt+=(passwd)
  if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need_apt[@]}" >/dev/null
    PY="$(command -v python3)"
  fi

  if ! id accel-other >/dev/null 2>&1; then
    echo "setup: creating the local user accel-other (the shared-node tests' second user)" >&2
    sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
    $sudo_ useradd --system --no-create-home --shell /usr/sbin/nologin accel-other
  fi

fi

[ -n "$PY" ] || PY="$(command -v python3)"
pyver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
VENV="$CACHE/venv-py${pyver}-torch${TORCH_VERSION}-accelerate${ACCELERATE_VERSION}"
if [ "$PART" != rest ]; then
  if [ ! -f "$VENV/.complete" ]; then
    echo "setup: creating $VENV (torch==$TORCH_VERSION, accelerate==$ACCELERATE_VERSION)" >&2
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" "accelerate==$ACCELERATE_VERSION"
    "$VENV/bin/python" -c 'import torch, accelerate' 
    touch "$VENV/.complete"
  fi
  if [ ! -f "$VENV/.deepspeed-$DEEPSPEED_VERSION" ]; then
    echo "setup: adding deepspeed==$DEEPSPEED_VERSION to $VENV" >&2
    # Its build imports torch, so it builds against the venv's (no isolation);
    # DS_BUILD_OPS=0: no CUDA/C++ ops are compiled (the tests run on CPUs).
    DS_BUILD_OPS=0 "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation "deepspeed==$DEEPSPEED_VERSION"
    "$VENV/bin/python" -c 'import deepspeed' >&2
    touch "$VENV/.deepspeed-$DEEPSPEED_VERSION"
  fi
  # The Python wheel's build and its tests: maturin, with zig (ziglang) as the
  # C compiler and linker of the static (musl) binaries of any architecture, pytest, and a real
  # Jupyter kernel (ipykernel) driven by nbclient; py-spy, which the agent runs
  # for a hung worker's stacks.
  PY_TOOLS="maturin==1.16.0 ziglang==0.15.2 pytest==9.2.0 ipykernel==7.4.0 nbclient==0.11.0 nbformat==5.11.1 py-spy==0.4.1"
  tools_key="$(printf %s "$PY_TOOLS" | sha256sum | cut -c1-12)"
  if [ ! -f "$VENV/.tools-$tools_key" ]; then
    echo "setup: adding $PY_TOOLS to $VENV" >&2
    # shellcheck disable=SC2086 # one word per requirement
    "$VENV/bin/pip" install -q --disable-pip-version-check $PY_TOOLS
    "$VENV/bin/python" -c 'import pytest, ipykernel, nbclient, nbformat' >&2
    "$VENV/bin/python" -m ziglang version >/dev/null
    touch "$VENV/.tools-$tools_key"
  fi
fi

if [ "$PART" != core ]; then
  # mdBook for the user guide (scripts/check-docs.sh builds it), from crates.io,
  # pinned and cached by version; only the search feature (no server, no file
  # watcher: fewer crates to build).
  MDBOOK_VERSION="0.5.4"
  MDBOOK_ROOT="$CACHE/tools/mdbook-$MDBOOK_VERSION"
  if [ ! -x "$MDBOOK_ROOT/bin/mdbook" ]; then
    echo "setup: installing mdbook $MDBOOK_VERSION into $MDBOOK_ROOT" >&2
    env -u CARGO_TARGET_DIR cargo install --quiet --locked mdbook --version "$MDBOOK_VERSION" \
      --no-default-features --features search --root "$MDBOOK_ROOT" >&2
  fi
  # overlay_venv DIR: a venv at DIR (made afresh) that sees the pinned venv's
  # packages (torch, ...) after its own, through a .pth file: what DIR
  # installs wins, torch comes from $VENV.
  overlay_venv() {
    rm -rf "$1"
    "$VENV/bin/python" -m venv --without-pip "$1"
    local site base_site
    site="$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    base_site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    echo "$base_site" >"$site/zz-pinned-venv.pth"
  }
  for v in $EXTRA_ACCELERATE_VERSIONS; do
    extra="$VENV/accelerate-versions/$v"
    [ -f "$extra/.complete" ] && continue
    echo "setup: creating $extra (accelerate==$v over $VENV's torch)" >&2
    overlay_venv "$extra"
    "$VENV/bin/pip" --python "$extra/bin/python" install -q --disable-pip-version-check --no-deps "accelerate==$v"
    # torchrun must start workers with this venv's interpreter (sys.executable).
    printf '#!%s\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n' "$extra/bin/python" >"$extra/bin/torchrun"
    chmod +x "$extra/bin/torchrun"
    got="$("$extra/bin/python" -c 'import accelerate, torch; print(accelerate.__version__)')"
    [ "$got" = "$v" ] || { echo "setup: $extra imports accelerate $got, not $v" >&2; exit 1; }
    head -1 "$extra/bin/accelerate" | grep -qF "$extra/bin/python" || { echo "setup: $extra/bin/accelerate is not its own" >&2; exit 1; }
    touch "$extra/.complete"
  done
  tft="$VENV/torchft-$TORCHFT_VERSION"
  if [ ! -f "$tft/.complete" ]; then
    echo "setup: creating $tft (torchft==$TORCHFT_VERSION over $VENV's torch)" >&2
    overlay_venv "$tft"
    # shellcheck disable=SC2086 # one word per requirement
    "$VENV/bin/pip" --python "$tft/bin/python" install -q --disable-pip-version-check "torchft==$TORCHFT_VERSION" $TORCHFT_DEPS
    got="$("$tft/bin/python" -c 'import torchft.manager, torch, importlib.metadata as m; print(m.version("torchft"))')"
    [ "$got" = "$TORCHFT_VERSION" ] || { echo "setup: $tft imports torchft $got, not $TORCHFT_VERSION" >&2; exit 1; }
    touch "$tft/.complete"
  fi
  for pair in $EXTRA_TORCH_VERSIONS; do
    v="${pair%%:*}" numpy="${pair#*:}"
    tv="$CACHE/venv-py${pyver}-torch${v}"
    [ -f "$tv/.complete" ] && continue
    echo "setup: creating $tv (torch==$v, $numpy) for the conformance tests" >&2
    rm -rf "$tv"
    "$PY" -m venv "$tv"
    "$tv/bin/pip" install -q --disable-pip-version-check "torch==$v" "$numpy"
    got="$("$tv/bin/python" -c 'import torch, numpy; print(torch.__version__.split("+")[0])')"
    [ "$got" = "$v" ] || { echo "setup: $tv imports torch $got, not $v" >&2; exit 1; }
    touch "$tv/.complete"
  done
fi
ln -sfn "$VENV" "$CACHE/venv"
echo "$VENV"
