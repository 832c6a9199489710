#!/usr/bin/env bash
# What is newest: installs the newest torch and accelerate on the package
# registry into a scratch venv (~/.cache/accel/newest-YYYY-MM-DD, kept for
# the day), runs the conformance checks against it beside the tested
# releases, and prints what differs:
#   - torchrun's flags (every flag of its `--help` accepted by accel-agent, in
#     both spellings, taking a value exactly when torchrun's does);
#   - rdzv_conf keys torchrun's c10d rendezvous reads that accel-agent refuses;
#   - the workers' environment (accel-agent's against that torchrun's);
#   - the worker store (every TCPStore command of that client, against its
#     own server);
#   - a DDP job that fails once and resumes from its checkpoint;
#   - `accel launch` against that `accelerate launch`, in every launch
#     configuration of the parity tests (that accelerate over the pinned
#     torch, in a venv beside the tested releases' that scripts/setup.sh makes).
# Not part of the test command: its answer depends on the day. Its last
# output is kept in docs/src/compatibility.md with the date.
# Usage: scripts/newest.sh            (needs what scripts/setup.sh installs)
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}"
ACCEL_VENV="${ACCEL_VENV:-$(scripts/setup.sh)}" || exit 2
export ACCEL_VENV
CACHE="${ACCEL_CACHE:-$HOME/.cache/accel}"
NEW="$CACHE/newest-$(date -u +%F)"
if [ ! -f "$NEW/.complete" ]; then
  echo "newest: creating $NEW (newest torch, numpy and accelerate)" >&2
  rm -rf "$NEW"
  python3 -m venv "$NEW" || exit 2
  "$NEW/bin/pip" install -q --disable-pip-version-check --upgrade torch numpy accelerate || exit 2
  touch "$NEW/.complete"
fi
# Older snapshots go (each is several GB).
find "$CACHE" -maxdepth 1 -name 'newest-*' ! -name "$(basename "$NEW")" -exec rm -rf {} +
torch="$("$NEW/bin/python" -c 'import torch; print(torch.__version__)')"
acc="$("$NEW/bin/python" -c 'import accelerate; print(accelerate.__version__)')"
echo "newest on $(date -u +%F): torch $torch, accelerate $acc"
echo "tested: torch 2.4.1, 2.13.0 (pinned), 2.15.0; accelerate 1.10.1, 1.15.0 (pinned), 1.16.0"
echo
# The launch parity test takes accelerate's venv from beside the tested ones:
# setup.sh makes it for a release newer than those (accelerate alone, over
# the pinned torch).
ACCEL_NEWEST_ACCELERATE="$acc" scripts/setup.sh >/dev/null || exit 2

# rdzv_conf keys: those torch's c10d rendezvous handler reads, against accel-agent's.
keys="$("$NEW/bin/python" - <<'EOF'
import inspect, re
import torch.distributed.elastic.rendezvous.dynamic_rendezvous as d
import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c
import torch.distributed.elastic.rendezvous.api as a
src = inspect.getsource(d) + inspect.getsource(c) + inspect.getsource(a)
print(" ".join(sorted(set(re.findall(r'\.get(?:_as_[a-z]+)?\(\s*"([a-z_]+)"', src)))))
EOF
)"
agent="$CARGO_TARGET_DIR/debug/accel-agent"
cargo build --quiet --locked -p accel-agent -p rendezvous-server -p accel-cli --bins >&2 || exit 2
refused=()
for k in $keys; do
  out="$("$agent" --standalone --rdzv-conf "$k=1" --nproc-per-node 1 --no-python true 2>&1)"
  case "$out" in *"unknown key"*) refused+=("$k") ;; esac
done
if [ ${#refused[@]} = 0 ]; then
  echo "rdzv_conf keys torch reads ($keys): all taken"
else
  echo "rdzv_conf keys torch reads that accel-agent refuses: ${refused[*]}"
fi
echo

# The conformance tests, with the newest venv added to the tested ones.
status=0
run() {
  local what="$1"; shift
  if ACCEL_NEWEST_VENV="$NEW" ACCEL_NEWEST_ACCELERATE="$acc" \
    cargo test --quiet --locked -p accel-tests --test e2e -- "$@" >"$CACHE/newest-$what.log" 2>&1; then
    echo "$what: same"
  else
    status=1
    echo "$what: DIFFERS (see $CACHE/newest-$what.log):"
    grep -E "panicked at|left:|right:|not found|refused|differ|disagree|failed" "$CACHE/newest-$what.log" | head -8 | sed 's/^/    /'
  fi
}
run flags every_torchrun_flag_is_accepted
run environment workers_see_the_environment_torchrun_gives
run store pytorch_store_client_gets_the_same_answers
run ddp ddp_job_restarts_from_its_checkpoint_on_the_oldest_and_newest
run "accelerate-launch-$acc" newest_accelerate
if [ "${torch%%+*}" != "2.15.0" ]; then
  echo "torch ${torch%%+*} is newer than the newest tested (2.15.0): add it to EXTRA_TORCH_VERSIONS and TORCH_VERSIONS"
  status=1
else
  echo "torch: the newest is tested (2.15.0)"
fi
if [ "$acc" != "1.16.0" ]; then
  echo "accelerate $acc is newer than the newest tested (1.16.0): add it to EXTRA_ACCELERATE_VERSIONS and ACCELERATE_VERSIONS"
  status=1
else
  echo "accelerate: the newest is tested (1.16.0)"
fi
exit $status
