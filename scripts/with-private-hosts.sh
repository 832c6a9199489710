#!/usr/bin/env bash
# Runs a command in a private mount namespace whose /etc/hosts also maps ::1
# and ::ffff:127.0.0.1 to localhost, so PyTorch's TCPStore server answers its
# reverse lookups of loopback peers locally instead of waiting on DNS. The
# machine's /etc/hosts is untouched. Needs root.
# Usage: scripts/with-private-hosts.sh COMMAND [ARGS...]
set -euo pipefail
hosts="$(mktemp)"
trap 'rm -f "$hosts"' EXIT
{ cat /etc/hosts; echo "::1 localhost"; echo "::ffff:127.0.0.1 localhost"; } > "$hosts"
unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$hosts" "$@"
