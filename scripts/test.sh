#!/usr/bin/env bash
# The test command: sets up everything the tests need, then runs the checks
# and every test of the workspace. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Build outputs are cached outside the clone so a fresh clone rebuilds incrementally.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
# The pinned Python environment (torch, accelerate) for tests and benchmarks.
ACCEL_VENV="$(scripts/setup.sh)"
export ACCEL_VENV
# worker-runtime builds tch against the venv's torch (libtorch 2.13): tch's
# build finds it through the venv's python3.
export LIBTORCH_USE_PYTORCH=1 PATH="$ACCEL_VENV/bin:$PATH"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked
# The integration tests start the real binaries: build them first.
cargo build --workspace --locked
# The user guide (docs/): built with mdBook; links, anchors and code blocks
# checked, and the torchrun page's flags against accel-agent and torchrun.
scripts/check-docs.sh
# The README's run command builds from an empty target dir with protoc hidden
# (Rust toolchain alone) and runs hello.py on four ranks.
scripts/check-no-protoc.sh
# Deployment files: systemd units verified and scored, Kubernetes manifests
# rendered and validated, the Dockerfile linted (and the image built where
# the tools run).
scripts/check-systemd.sh
scripts/check-kubernetes.sh
scripts/check-image.sh
# A real one-host Slurm cluster (two slurmd): srun starts the agents with no flags.
scripts/check-slurm.sh
# The Python wheel: built, installed into a fresh venv, hello.py from there,
# and the notebook launchers in real Jupyter kernels (with accelerate's own
# notebook tests).
scripts/check-wheel.sh
cargo test --workspace --locked
# The chaos run, short (about 2 minutes, fixed seeds, both modes): faults
# injected into a three-node job, invariants checked on what its workers
# recorded; any violation fails the run (docs/src/fault-testing.md).
scripts/chaos.sh 40 1 --mode server
scripts/chaos.sh 30 2 --mode agents --no-ddp
# Fuzzing smoke: every cargo-fuzz target for a short while (scripts/fuzz.sh
# SECONDS runs them longer); a crash fails the run.
scripts/fuzz.sh "${ACCEL_FUZZ_SECONDS:-30}"
