#!/usr/bin/env bash
# Checks the systemd units in deploy/systemd offline (no running systemd needed):
#  1. `systemd-analyze verify` on rdzv-server.service (alone, with the HA drop-in,
#     and with every commented directive of the drop-in enabled) and on
#     accel-agent@.service (template and an instance). Any warning fails: systemd
#     252 exits 0 on unknown or misspelled directives and only prints them.
#     verify needs the ExecStart binaries, so the units are checked as copies whose
#     /usr/local/bin/ points at the debug build (built by the test command first).
#  2. `systemd-analyze security --offline=true`: the server's exposure must be at
#     most 4.0 (with and without the drop-in), the agent's at most 3.0 (a guard
#     against losing its hardening; it is 2.3 now).
#  3. The agent is started without a shell, by accel-agent itself, with
#     KillMode=mixed and a stop timeout above its 30 s --shutdown-timeout.
# Usage: scripts/check-systemd.sh [UNIT_DIR]   (default: deploy/systemd)
set -euo pipefail
cd "$(dirname "$0")/.."

UNITS="${1:-deploy/systemd}"
BIN="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}/debug"
SERVER_MAX=4.0
AGENT_MAX=3.0

fail() {
  echo "check-systemd: FAIL: $*" >&2
  exit 1
}

# systemd-analyze with --offline (systemd >= 250); Debian's systemd package has it.
if ! command -v systemd-analyze >/dev/null; then
  echo "check-systemd: installing systemd (for systemd-analyze)" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
version="$(systemd-analyze --version | awk 'NR == 1 { print $2 }')"
[ "${version%%.*}" -ge 250 ] || fail "systemd-analyze $version has no --offline (need >= 250)"

for u in rdzv-server.service rdzv-server-ha.conf accel-agent@.service; do
  [ -f "$UNITS/$u" ] || fail "$UNITS/$u is missing"
done
for b in rdzv-server accel-agent; do
  [ -x "$BIN/$b" ] || fail "$BIN/$b is not built (cargo build --workspace first)"
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
ln -s "$(realpath "$BIN/rdzv-server")" "$tmp/bin/rdzv-server"
ln -s "$(realpath "$BIN/accel-agent")" "$tmp/bin/accel-agent"

# A copy of a unit whose /usr/local/bin/ binaries are the debug build's.
copy_unit() { # SRC DEST
  sed "s#/usr/local/bin/#$tmp/bin/#g" "$1" >"$2"
}
# Four unit directories: plain, HA, HA with every commented option, agent.
mkdir -p "$tmp/plain" "$tmp/ha/rdzv-server.service.d" "$tmp/ha-all/rdzv-server.service.d" "$tmp/agent"
for d in plain ha ha-all; do copy_unit "$UNITS/rdzv-server.service" "$tmp/$d/rdzv-server.service"; done
cp "$UNITS/rdzv-server-ha.conf" "$tmp/ha/rdzv-server.service.d/ha.conf"
sed -E 's/^#([A-Z][A-Za-z]*=)/\1/' "$UNITS/rdzv-server-ha.conf" \
  >"$tmp/ha-all/rdzv-server.service.d/ha.conf"
copy_unit "$UNITS/accel-agent@.service" "$tmp/agent/accel-agent@.service"

# 1. verify: the exit status and every line printed count.
verify() { # DIR UNIT...
  local dir="$1" out rc=0
  shift
  out="$(cd "$dir" && systemd-analyze verify "${@/#/./}" 2>&1)" || rc=$?
  if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
    printf '%s\n' "$out" | sed -e "s#$tmp/[a-z-]*/rdzv-server.service.d/ha.conf#$UNITS/rdzv-server-ha.conf#g" -e "s#$tmp/[a-z-]*/#$UNITS/#g" >&2
    fail "systemd-analyze verify $* ($(basename "$dir")): exit $rc, warnings above"
  fi
  echo "verify ok: $* ($(basename "$dir"))"
}
verify "$tmp/plain" rdzv-server.service
verify "$tmp/ha" rdzv-server.service
verify "$tmp/ha-all" rdzv-server.service
verify "$tmp/agent" accel-agent@.service accel-agent@job42.service

# 2. security: systemd-analyze's --threshold is in tenths (40 = exposure 4.0).
security() { # DIR UNIT MAX
  local dir="$1" unit="$2" max="$3" out rc=0 score
  out="$(cd "$dir" && systemd-analyze security --offline=true --threshold="${max/./}" "./$unit" 2>&1)" || rc=$?
  score="$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\) .*/\1/p')"
  [ -n "$score" ] || { printf '%s\n' "$out" >&2; fail "no exposure level for $unit"; }
  if [ "$rc" -ne 0 ] || ! awk -v s="$score" -v m="$max" 'BEGIN { exit !(s <= m) }'; then
    printf '%s\n' "$out" | grep '✗' >&2 || true
    fail "$unit ($(basename "$dir")): exposure $score is above $max"
  fi
  echo "security ok: $unit ($(basename "$dir")): exposure $score (at most $max)"
}
security "$tmp/plain" rdzv-server.service "$SERVER_MAX"
security "$tmp/ha" rdzv-server.service "$SERVER_MAX"
security "$tmp/agent" accel-agent@job42.service "$AGENT_MAX"

# 3. The agent: no shell, the agent as the command, the stop logic.
agent="$UNITS/accel-agent@.service"
exec_lines="$(grep -E '^[[:space:]]*Exec[A-Za-z]*=' "$agent" || true)"
[ -n "$exec_lines" ] || fail "$agent has no ExecStart="
if printf '%s\n' "$exec_lines" | grep -Eq '(^|[=/[:space:]])(ba|da|k|z)?sh([[:space:]]|$)|[[:space:]]-c[[:space:]]'; then
  fail "$agent runs a shell: $exec_lines"
fi
start="$(printf '%s\n' "$exec_lines" | sed -n 's/^[[:space:]]*ExecStart=[-@:+!]*//p')"
[ "$(printf '%s\n' "$start" | wc -l)" -eq 1 ] || fail "$agent: expected one ExecStart="
[ "$(basename "${start%% *}")" = accel-agent ] || fail "$agent: ExecStart= is not accel-agent: $start"
grep -Eq '^KillMode=mixed$' "$agent" || fail "$agent: KillMode=mixed is missing"
stop="$(sed -n 's/^TimeoutStopSec=\([0-9]*\)$/\1/p' "$agent")"
if [ -z "$stop" ] || [ "$stop" -le 30 ]; then
  fail "$agent: TimeoutStopSec (seconds) must be over the agent's 30 s shutdown timeout"
fi
echo "agent ok: no shell, ExecStart=$start, KillMode=mixed, TimeoutStopSec=$stop"
echo "check-systemd: all units pass"
