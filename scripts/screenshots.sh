#!/usr/bin/env bash
# The status page's screenshots in the documentation, taken by the tests
# that check what the page shows (tests/tests/status_page.rs): a running
# job, a job mid-restart after a hang, and the hang's grouped stacks. They
# are written to docs/src/images/ (the tests otherwise write them to their
# scratch directories). Sets up what the tests need as scripts/test.sh
# does (the pinned venv, chromium), idempotently.
# Usage: scripts/screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export ACCEL_CACHE="${ACCEL_CACHE:-$HOME/.cache/accel}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ACCEL_CACHE/target}"
ACCEL_VENV="$(scripts/setup.sh)"
export ACCEL_VENV LIBTORCH_USE_PYTORCH=1 PATH="$ACCEL_VENV/bin:$PATH"
export ACCEL_SCREENSHOTS="$PWD/docs/src/images"
cargo build --locked --bins
cargo test --locked -p accel-tests --test e2e -- status_page::headless_chromium
ls -l "$ACCEL_SCREENSHOTS"/status-page-*.png
