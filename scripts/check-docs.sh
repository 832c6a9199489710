#!/usr/bin/env bash
# Checks the user guide: builds it with the pinned mdBook (scripts/setup.sh
# installs it), then scripts/check_docs.py checks every relative link and
# #anchor in README.md, the root *.md files and docs/**/*.md, the code blocks
# (sh/bash with bash -n; python, yaml, toml, json parsed), and the torchrun
# migration page's flags against `accel-agent --help` and the pinned
# `torchrun --help`. Nothing is skipped: a missing tool is a failure.
# Usage: scripts/check-docs.sh   (after `cargo build`; ACCEL_VENV as the test
#        command sets it, for torchrun and PyYAML)
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION="0.5.4"
CACHE="${ACCEL_CACHE:-$HOME/.cache/accel}"
MDBOOK="$CACHE/tools/mdbook-$MDBOOK_VERSION/bin/mdbook"
AGENT="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}/debug/accel-agent"
TORCHRUN="${ACCEL_VENV:-$CACHE/venv}/bin/torchrun"
PYTHON="${ACCEL_VENV:-$CACHE/venv}/bin/python3"

fail() { echo "check-docs: $*" >&2; exit 1; }
[ -x "$MDBOOK" ] || fail "no mdbook at $MDBOOK: run scripts/setup.sh (it installs mdBook $MDBOOK_VERSION)"
[ -x "$AGENT" ] || fail "no accel-agent at $AGENT: run cargo build first"
[ -x "$TORCHRUN" ] || fail "no torchrun at $TORCHRUN: set ACCEL_VENV (scripts/setup.sh prints it)"

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
"$MDBOOK" build --dest-dir "$OUT/book" docs 2>"$OUT/log" || { cat "$OUT/log" >&2; fail "mdbook build failed"; }
# mdBook reports some problems (a missing include, a bad SUMMARY entry) as
# warnings or errors and still writes the book: treat them as failures.
if grep -E "WARN|ERROR" "$OUT/log" >&2; then fail "mdbook build printed warnings"; fi
"$PYTHON" scripts/check_docs.py --book "$OUT/book" --agent "$AGENT" --torchrun "$TORCHRUN"
