#!/usr/bin/env bash
# Generates the man pages and shell completions of the three binaries from
# their flag definitions (each binary's `manpage` and `completions SHELL`).
# Usage: scripts/man.sh [OUT]   (default: $CARGO_TARGET_DIR/share)
# Writes OUT/man/man1/<binary>.1 and OUT/completions/{bash,zsh,fish}/...;
# install them with e.g.
#   install -Dm644 OUT/man/man1/*.1 -t /usr/local/share/man/man1
#   install -Dm644 OUT/completions/bash/* -t /usr/share/bash-completion/completions
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
cargo build --locked -p rendezvous-server -p accel-agent -p accel-cli >&2
B="$CARGO_TARGET_DIR/debug"
out="${1:-$CARGO_TARGET_DIR/share}"
mkdir -p "$out/man/man1" "$out/completions/bash" "$out/completions/zsh" "$out/completions/fish"
for bin in rdzv-server accel-agent accel; do
  "$B/$bin" manpage > "$out/man/man1/$bin.1"
  "$B/$bin" completions bash > "$out/completions/bash/$bin"
  "$B/$bin" completions zsh > "$out/completions/zsh/_$bin"
  "$B/$bin" completions fish > "$out/completions/fish/$bin.fish"
done
echo "$out"
