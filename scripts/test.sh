#!/usr/bin/env bash
# The test command: sets up everything the tests need, then runs the checks
# and every test of the workspace. Usage: scripts/test.sh
#
# The checks run in three lanes side by side, because the machine it runs on
# (2 cores) is idle for much of the test suite, which mostly waits on
# processes, and busy for much of the release builds, which wait on nothing:
#   checks     the debug build and everything that uses it: lint, docs, the
#              README's run command, the deployment checks that run the debug
#              binaries, the unit tests (unprivileged, no venv), the
#              integration tests, the chaos run;
#   release    the Kubernetes manifests, the fuzzing smoke;
#   packages   the wheels (two targets, static binaries), then the container
#              image, whose binaries are the x86_64 wheel's (not built again).
# Every step runs with protoc hidden (scripts/without-protoc.sh): no build may
# need it. Each release artifact is built once. The release and packages lanes run at a
# lower CPU priority (nice), so the timing-sensitive tests of the checks lane
# get the CPU first and the builds take what it leaves idle.
# The checks lane's output streams; every other step's output is printed
# whole when it ends. The end is a table of every step's time and CPU time, also written to
# $CARGO_TARGET_DIR/test-times.tsv. Any failed step fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build outputs are cached outside the clone so a fresh clone rebuilds
# incrementally. ACCEL_CACHE moves every cache (venvs, tools, build outputs):
# an empty one measures a fresh machine's run.
export ACCEL_CACHE="${ACCEL_CACHE:-$HOME/.cache/accel}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ACCEL_CACHE/target}"
# Not yet in the namespace scripts/without-protoc.sh makes (it names it in
# ACCEL_PROTOC_NS): set up, then go on in it.
if [ "${ACCEL_PROTOC_NS:-}" != "$(readlink /proc/self/ns/mnt)" ]; then
  ACCEL_TEST_STARTED=$(date +%s)
  # The pinned Python environment (torch, accelerate) for tests and benchmarks.
  ACCEL_VENV="$(scripts/setup.sh core)"
  # The rest of the setup (mdBook, the other torch and accelerate releases'
  # venvs: gigabytes of downloads on a fresh machine) goes on beside the
  # builds; the steps that need it wait for it (`setup-rest` below). It
  # builds nothing, so it needs no protoc-free namespace.
  ACCEL_SETUP_REST="$(mktemp -d "${TMPDIR:-/tmp}/accel-setup-rest.XXXXXX")"
  (scripts/setup.sh rest >"$ACCEL_SETUP_REST/log" 2>&1; echo "$?" >"$ACCEL_SETUP_REST/status") </dev/null &
  echo "$!" >"$ACCEL_SETUP_REST/pid"
  export ACCEL_VENV ACCEL_TEST_STARTED ACCEL_SETUP_REST ACCEL_TEST_SETUP=$(($(date +%s) - ACCEL_TEST_STARTED))
  # Everything below, every build included, runs where protoc does not
  # exist (whatever setup installed): accel builds with the Rust toolchain
  # alone. The same process goes on in a private mount namespace.
  exec scripts/without-protoc.sh bash "$0" "$@"
fi
SECONDS=$(($(date +%s) - ACCEL_TEST_STARTED))
started=0
setup_took=$ACCEL_TEST_SETUP
# worker-runtime builds tch against the venv's torch (libtorch 2.13): tch's
# build finds it through the venv's python3.
export LIBTORCH_USE_PYTORCH=1 PATH="$ACCEL_VENV/bin:$PATH"

# Disk: a machine that runs this many times a day collects cargo's
# incremental caches (tens of GiB) and earlier runs' scratch directories
# (kept a day for reading a failure; a chaos run's are hundreds of MiB).
# Below 20 GiB free, the incremental caches go (they only speed up the next
# build) and so do scratch directories older than an hour; with less than
# 8 GiB free after that, the run stops here and says so, rather than failing
# later in a way that names something else.
free_gib() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }
mkdir -p "$CARGO_TARGET_DIR"
tmp_root="${TMPDIR:-/tmp}"
if [ "$(free_gib "$CARGO_TARGET_DIR")" -lt 20 ] || [ "$(free_gib "$tmp_root")" -lt 20 ]; then
  echo "test: less than 20 GiB free: removing cargo's incremental caches and scratch directories over an hour old" >&2
  find "$CARGO_TARGET_DIR" -maxdepth 3 -type d -name incremental -prune -exec rm -rf {} +
  find "$tmp_root" -maxdepth 1 -mmin +60 \( -name 'accel-test-*' -o -name 'accel-chaos-*' \
    -o -name 'accel-test.*' -o -name 'check-slurm.*' \) -exec rm -rf {} +
fi
for where in "$CARGO_TARGET_DIR" "$tmp_root"; do
  if [ "$(free_gib "$where")" -lt 8 ]; then
    echo "test: only $(free_gib "$where") GiB free where $where is; the test command needs about 8 GiB. Free some (cargo clean, old files in $tmp_root) and run it again." >&2
    exit 1
  fi
done

LOGS="$(mktemp -d "${TMPDIR:-/tmp}/accel-test.XXXXXX")"
printf 'lane\tstep\tseconds\tcpu_seconds\texit\n' >"$LOGS/times.tsv"

# CPU=the CPU seconds (user + system) used so far by this shell's finished
# children, from bash's `times`. Not for $(...): a subshell's count starts at
# zero.
child_cpu() {
  times >"$LOGS/cpu-$LANE"
  CPU=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); t += p[1] * 60 + p[2] } printf "%d\n", t }' "$LOGS/cpu-$LANE")
}

# step NAME CMD...: runs CMD (stdin closed, output kept in its own log) and
# records its time; returns CMD's status. The checks lane prints its steps'
# output as it comes (a hang shows where it hangs); the other lanes print
# each step's output whole when it ends, under a lock, so lanes never mix
# within a step's block.
step() {
  local name="$1"
  shift
  local log="$LOGS/$name.log" begin=$SECONDS status=0 cpu
  child_cpu
  cpu=$CPU
  if [ "$LANE" = checks ]; then
    echo "==== [$LANE] $name: start +$((begin - started)) s"
    { "$@" </dev/null 2>&1 || echo "$?" >"$log.status"; } | tee "$log"
    [ ! -e "$log.status" ] || status="$(cat "$log.status")"
  else
    echo "$name" >"$LOGS/running-$LANE"
    "$@" </dev/null >"$log" 2>&1 || status=$?
  fi
  local took=$((SECONDS - begin)) verdict=ok
  child_cpu
  cpu=$((CPU - cpu))
  [ "$status" = 0 ] || verdict="FAILED (exit $status)"
  {
    flock 9
    if [ "$LANE" != checks ]; then
      echo "==== [$LANE] $name: start +$((begin - started)) s"
      cat "$log"
    fi
    echo "==== [$LANE] $name: $verdict in $took s ($cpu CPU-s)"
    printf '%s\t%s\t%s\t%s\t%s\n' "$LANE" "$name" "$took" "$cpu" "$status" >>"$LOGS/times.tsv"
  } 9>>"$LOGS/.lock"
  return "$status"
}

# Stopped from outside (a CI time limit): show what the other lanes were doing.
on_stop() {
  local f
  for f in "$LOGS"/running-*; do
    [ -e "$f" ] || continue
    echo "==== stopped during ${f##*/running-} step $(cat "$f"); its output so far:"
    tail -n 100 "$LOGS/$(cat "$f").log"
  done
  # The lanes, the steps they run and the rest of the setup stop with it.
  [ ! -e "$ACCEL_SETUP_REST/pid" ] || pkill -TERM -P "$(cat "$ACCEL_SETUP_REST/pid")" 2>/dev/null || true
  local lane
  for lane in "${lanes[@]}"; do
    pkill -TERM -P "$lane" 2>/dev/null || true
    kill -TERM "$lane" 2>/dev/null || true
  done
  exit 143
}
trap on_stop TERM INT HUP

# Waits for the rest of the setup, started before the lanes, and prints
# what it printed; fails as it failed.
setup_rest() {
  local d="$ACCEL_SETUP_REST"
  while [ ! -e "$d/status" ]; do sleep 1; done
  cat "$d/log"
  return "$(cat "$d/status")"
}

lane_checks() {
  LANE=checks
  step fmt cargo fmt --all -- --check
  step clippy cargo clippy --workspace --all-targets --locked -- -D warnings
  step doc env RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked
  # The integration tests and the checks below start the real (debug) binaries.
  step build cargo build --workspace --all-targets --locked
  # The README's run command, with protoc hidden as for every build here:
  # hello.py on four ranks (seconds: the debug build above).
  step no-protoc scripts/check-no-protoc.sh
  # mdBook and the other releases' venvs, installed beside the builds so far.
  step setup-rest setup_rest
  # The user guide (docs/): built with mdBook; links, anchors and code
  # blocks checked, and the torchrun page's flags against accel-agent and torchrun.
  step docs scripts/check-docs.sh
  # systemd units verified and scored, with the debug binaries installed.
  step systemd scripts/check-systemd.sh
  # A real one-host Slurm cluster (two slurmd): srun starts the agents with no flags.
  step slurm scripts/check-slurm.sh
  # What `cargo test` runs in a clean clone (the unit tests and the
  # simulator), as a user has it: no capabilities (uid 0 without any
  # capability cannot bypass permissions, create namespaces or switch users)
  # and no venv.
  step unit env -u ACCEL_VENV -u LIBTORCH_USE_PYTORCH \
    setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- \
    cargo test --locked
  # Every test of the workspace: the end-to-end tests with the real
  # binaries, PyTorch, accelerate and etcd, worker-runtime's process groups,
  # and the unit tests again, as root and with the venv (the whole
  # workspace's features, as built above: selecting only the other packages
  # would build their dependencies again with other features). Not the
  # simulator again: it is pure (virtual time, no processes, no files), so
  # root or a venv change nothing in it, and the unit step just ran it.
  step integration cargo test --workspace --exclude accel-sim --locked
  # The chaos run, short (about 3 minutes, fixed seeds, both modes, and
  # control-plane outages alone): faults injected into a three-node job,
  # invariants checked on what its workers recorded; any violation fails the
  # run (docs/src/fault-testing.md).
  step chaos-server scripts/chaos.sh 40 1 --mode server
  step chaos-agents scripts/chaos.sh 30 2 --mode agents --no-ddp
  step chaos-control-plane scripts/chaos.sh 40 4 --faults control-plane --no-ddp
}

lane_release() {
  LANE=release
  # Kubernetes manifests rendered and validated (no binaries needed).
  step kubernetes scripts/check-kubernetes.sh
  # Each of its rules shown failing when broken (one Kubernetes version).
  step kubernetes-mutations scripts/check-kubernetes-mutations.sh
  # Fuzzing smoke: every cargo-fuzz target for a short while (scripts/fuzz.sh
  # SECONDS runs them longer); a crash fails the run.
  step fuzz scripts/fuzz.sh "${ACCEL_FUZZ_SECONDS:-30}"
}

lane_packages() {
  LANE=packages
  # The Python wheels (x86_64 and aarch64): built, installed into a fresh
  # venv, hello.py from there, aarch64 under qemu, and the notebook
  # launchers in real Jupyter kernels (with accelerate's own notebook tests).
  step wheel scripts/check-wheel.sh
  # The Dockerfile linted, the image built from the x86_64 wheel's binaries
  # and run.
  step image scripts/check-image.sh
}

lanes=()
names=(checks release packages)
lane_checks &
lanes+=($!)
for name in release packages; do
  (
    renice -n 10 -p "$BASHPID" >/dev/null
    "lane_$name"
  ) &
  lanes+=($!)
done
failed=()
for i in "${!lanes[@]}"; do
  wait "${lanes[$i]}" || failed+=("${names[$i]}")
done

mkdir -p "$CARGO_TARGET_DIR"
LANE=all
child_cpu
{
  echo
  echo "test.sh: setup $setup_took s; total $((SECONDS - started)) s (lanes side by side), $CPU CPU-s after setup"
  column -t -s $'\t' "$LOGS/times.tsv"
} | tee "$CARGO_TARGET_DIR/test-times.txt"
cp "$LOGS/times.tsv" "$CARGO_TARGET_DIR/test-times.tsv"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: FAILED in lane(s) ${failed[*]}; each step's log is in $LOGS" >&2
  exit 1
fi
rm -rf "$LOGS" "$ACCEL_SETUP_REST"
