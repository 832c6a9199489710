#!/usr/bin/env bash
# Rendezvous benchmark: N simulated agents (one process, `rdzv-load`) complete
# one round against one rdzv-server, a fresh server per size, once over plain
# HTTP/2 and once with a token and mutual TLS (certificates made here); with
# `etcd`, the server keeps every change in a one-member etcd (started here, in
# a temporary directory) before acting on it, and the etcd writes are counted;
# `metrics` is `plain` with the server's Prometheus endpoint on and scraped
# every 0.5 s while the agents join (every other mode runs with it off);
# `topology` is `plain` with every agent joining with a topology path (zones,
# racks, NVLink domains), which the server orders node ranks by; `page` is
# `plain` with the status page open in 10 browsers while the agents join:
# each loads the page and its files, then polls /api/jobs every 2 s, as the
# page's script does. Sizes repeat (10000,10000,10000) and, for each size,
# the modes run one after the other, so modes compared are run side by side.
# With --wheel, every row runs twice, once with the development build's
# rdzv-server (release, glibc: the label says "glibc") and once with the
# wheel's (the static musl executable users install, which the image ships
# too: "wheel"), one after the other, the order swapped each time a size
# repeats (10000,100000,10000,100000), so both see the same load. --wheel builds the wheel's binaries with
# scripts/build-wheel.sh (seconds when they are fresh); --wheel=DIR takes
# DIR/rdzv-server instead (e.g. from `scripts/build-wheel.sh ... --binaries DIR`).
# Usage: scripts/bench-rendezvous.sh [100,1000,10000] [plain|secure|etcd|metrics|topology|page|both|all|"MODE MODE..."] [--wheel[=DIR]]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
wheel=""
args=()
for a in "$@"; do
  case "$a" in
    --wheel) wheel=build ;;
    --wheel=*) wheel="${a#--wheel=}" ;;
    *) args+=("$a") ;;
  esac
done
set -- "${args[@]}"
cargo build --release --locked -p rendezvous-server -p accel-tests --bins >&2
R="$CARGO_TARGET_DIR/release"
sizes="${1:-100,1000,10000}"
modes="${2:-both}"
[ "$modes" = both ] && modes="plain secure"
[ "$modes" = all ] && modes="plain metrics topology secure etcd"
pki="$(mktemp -d)"
trap 'rm -rf "$pki"; [ -n "${server:-}" ] && kill "$server" 2>/dev/null || true; [ -n "${etcd:-}" ] && kill "$etcd" 2>/dev/null || true; [ -n "${scraper:-}" ] && kill "$scraper" 2>/dev/null || true' EXIT
etcd_revision() { ETCDCTL_API=3 etcdctl --endpoints "$1" get / -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])'; }
writes=""
if [[ " $modes " == *" secure "* ]]; then
  (
    cd "$pki"
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-ca
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > ext
    for n in server client; do
      openssl req "${ec[@]}" -keyout $n.key -out $n.csr -subj /CN=$n
      openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem -days 2 -extfile ext
    done
    openssl rand -hex 32 > token && chmod 600 token
  ) >/dev/null 2>&1
fi
# The servers each row runs: the development build alone, or with --wheel
# both builds, labelled.
builds=("dev=$R/rdzv-server")
if [ -n "$wheel" ]; then
  if [ "$wheel" = build ]; then
    wheel="$pki/wheel-bin"
    scripts/build-wheel.sh "$(uname -m)" "$pki/wheel" --binaries "$wheel" >/dev/null
  fi
  [ -x "$wheel/rdzv-server" ] || { echo "bench-rendezvous: no rdzv-server in $wheel" >&2; exit 1; }
  builds=("glibc=$R/rdzv-server" "wheel=$wheel/rdzv-server")
fi
header=""
browsers=()
row=0
declare -A seen=()
for n in ${sizes//,/ }; do
  # Which build goes first swaps each time this size comes again.
  order=("${builds[@]}")
  if [ $((${seen[$n]:-0} % 2)) = 1 ] && [ ${#builds[@]} = 2 ]; then order=("${builds[1]}" "${builds[0]}"); fi
  seen[$n]=$((${seen[$n]:-0} + 1))
  row=$((row + 1))
  for mode in $modes; do
    for build in "${order[@]}"; do
      name="${build%%=*}" server_bin="${build#*=}"
      # The server binds port 0 and names its addresses in --address-file.
      addr="$pki/addr-$mode-$n"
      # A repeated size must not read the last server's addresses.
      rm -f "$addr"
      srv=(--bind 127.0.0.1:0 --metrics-bind off --address-file "$addr")
      [[ "$mode" = metrics || "$mode" = page ]] && srv=(--bind 127.0.0.1:0 --metrics-bind 127.0.0.1:0 --address-file "$addr")
      label="$mode"
      [ "$name" = dev ] || label="$mode, $name"
      load=(--agents "$n" --label "$label")
      [ "$mode" = topology ] && load+=(--topology)
      if [ "$mode" = secure ]; then
        srv+=(--token-file "$pki/token" --tls-cert "$pki/server.pem" --tls-key "$pki/server.key" --tls-client-ca "$pki/ca.pem")
        load+=(--token-file "$pki/token" --tls-ca "$pki/ca.pem" --tls-cert "$pki/client.pem" --tls-key "$pki/client.key")
      fi
      if [ "$mode" = etcd ]; then
        # etcd must be told its ports: leased to this script (scripts/ports.py).
        { read -r cport; read -r pport; } < <(python3 scripts/ports.py --owner $$ 2)
        ec="http://127.0.0.1:$cport"
        etcd --data-dir "$pki/etcd-$row-$name" --listen-client-urls "$ec" --advertise-client-urls "$ec" \
          --listen-peer-urls "http://127.0.0.1:$pport" >"$pki/etcd-$row-$name.log" 2>&1 &
        etcd=$!
        until ETCDCTL_API=3 etcdctl --endpoints "$ec" endpoint health >/dev/null 2>&1; do sleep 0.1; done
        srv+=(--etcd-endpoints "$ec" --etcd-prefix /bench)
      fi
      RUST_LOG=warn "$server_bin" "${srv[@]}" &
      server=$!
      until [ -s "$addr" ]; do
        kill -0 "$server" 2>/dev/null || { echo "bench-rendezvous: rdzv-server exited before it listened" >&2; exit 1; }
        sleep 0.05
      done
      port="$(sed -n 's/^grpc=127.0.0.1://p' "$addr")"
      mport="$(sed -n 's/^metrics=127.0.0.1://p' "$addr")"
      load+=(--endpoint "127.0.0.1:$port")
      if [ "$mode" = etcd ]; then
        # A replica serves once it leads.
        until "$R/rdzv-server" status --rdzv-endpoint "127.0.0.1:$port" >/dev/null 2>&1; do sleep 0.1; done
        before="$(etcd_revision "$ec")"
      fi
      if [ "$mode" = metrics ]; then
        ( while curl -sf "http://127.0.0.1:$mport/metrics" >/dev/null; do sleep 0.5; done ) &
        scraper=$!
      fi
      if [ "$mode" = page ]; then
        # Browsers open before the agents come: each has loaded the page and
        # its files, then polls the jobs every 2 s. Requests are made with
        # bash's /dev/tcp, so the pollers cost this machine no process starts
        # (on 2 cores, curl processes would take CPU from the agents).
        get() {
          exec 3<>"/dev/tcp/127.0.0.1/$mport"
          printf 'GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n' "$1" >&3
          while IFS= read -r -u 3 _; do :; done
          exec 3<&-
        }
        for b in 1 2 3 4 5 6 7 8 9 10; do
          (
            for f in / /app.js /app.css /api/jobs; do get "$f"; done
            while sleep 2; do get /api/jobs; done
          ) &
          browsers+=($!)
        done
        sleep 1
      fi
      "$R/rdzv-load" "${load[@]}" --server-pid "$server" $header
      if [ -n "${scraper:-}" ]; then kill "$scraper" 2>/dev/null || true; wait "$scraper" 2>/dev/null || true; scraper=""; fi
      for b in "${browsers[@]}"; do kill "$b" 2>/dev/null || true; wait "$b" 2>/dev/null || true; done
      browsers=()
      header="--no-header"
      if [ "$mode" = etcd ]; then
        writes+="$n agents${label#etcd}: $(( $(etcd_revision "$ec") - before )) etcd writes; "
      fi
      kill "$server" 2>/dev/null || true
      wait "$server" 2>/dev/null || true
      server=""
      if [ -n "${etcd:-}" ]; then kill "$etcd"; wait "$etcd" 2>/dev/null || true; etcd=""; fi
    done
  done
done
[ -n "$writes" ] && { echo; echo "etcd mode, joins and one round: ${writes% }"; }
true
