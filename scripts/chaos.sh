#!/usr/bin/env bash
# The chaos run: a three-node job (agents in network namespaces, recording
# workers and a DDP job on gloo) on two rdzv-server replicas over a
# three-member etcd (--mode server, the default) or agent-only on the etcd
# (--mode agents), while a seeded schedule kills, pauses, partitions, slows
# and fills; then the invariants are checked on the recorded history.
# The same seed gives the same schedule. Exits non-zero on any violation.
# Usage: scripts/chaos.sh SECONDS [SEED] [--mode server|agents] [--no-ddp]
#        [--scenario NAME] [--break-fence]   (fixed schedules; see the page)
# Needs root (namespaces, nftables, tmpfs). See docs/src/fault-testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
ACCEL_VENV="${ACCEL_VENV:-$(scripts/setup.sh)}"
export ACCEL_VENV
command -v nft >/dev/null || { echo "chaos: nft is missing (scripts/setup.sh installs nftables)" >&2; exit 2; }
# Debug builds (built if missing or stale; nothing to do if fresh): the
# agent's test-only switches exist only there (the fence test uses one; a
# seeded run does not).
D="$CARGO_TARGET_DIR/debug"
cargo build --quiet --locked -p accel-agent -p rendezvous-server -p accel-tests --bins >&2
exec scripts/with-private-hosts.sh "$D/chaos" "$@"
