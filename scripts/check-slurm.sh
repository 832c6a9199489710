#!/usr/bin/env bash
# Checks accel-agent under a real Slurm, on this one machine:
#  1. installs Slurm (slurm-wlm: slurmctld, slurmd, client) and munge from apt
#     if they are missing;
#  2. sets up a throwaway cluster under a temporary directory: its own munge key
#     and munged socket, its own slurm.conf (SLURM_CONF), state, spool, logs and
#     pid files, free ports, no cgroups (proctrack/linuxproc, task/none), and
#     starts munged, slurmctld and slurmd as root. Two nodes when this build
#     runs several slurmd on one host (slurmd -N NAME, a port each; the second
#     is named `localhost` so every node name resolves here), else one;
#  3. srun -N NODES --ntasks-per-node=1 accel-agent --nproc-per-node 2 with no
#     other job flags: exits 0, each agent says it runs under Slurm with the
#     job's id, WORLD_SIZE is 2 x NODES, TORCHELASTIC_RUN_ID is the job id, each
#     rank 0..WORLD_SIZE-1 is printed once, and slurmctld knows the job; then
#     --ntasks-per-node=2 is refused (exit 2, naming --ntasks-per-node=1);
#  4. sbatch --wait deploy/slurm/train.sbatch (the documented batch script:
#     its own port, a token, --cpus-per-task) runs one job on every node and
#     removes its token file; then, with the same script: the time limit's
#     warning signal (scancel --signal=TERM, the steps only) lets workers that
#     trap SIGTERM save for 90 s and finish; and a job requeued with
#     `scontrol requeue` runs again, resuming from its first run's checkpoint;
#  5. stops the daemons and removes the directory, also on failure (with the
#     daemons' log tails then).
# Nothing is skipped: if Slurm cannot run here, this fails and says why.
# Usage: scripts/check-slurm.sh          (as root: slurmd starts each step as
#        its submitter, and SlurmUser=root keeps the daemons' files simple)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${CARGO_TARGET_DIR:-$HOME/.cache/accel/target}/debug"
AGENT="$BIN/accel-agent"
NPROC=2
START=$SECONDS

say() { echo "check-slurm: $*" >&2; }
fail() {
  echo "check-slurm: FAIL: $*" >&2
  exit 1
}

[ -x "$AGENT" ] || fail "$AGENT is not built (cargo build --workspace first)"

[ "$(id -u)" -eq 0 ] || fail "run as root (the daemons run as root and start steps as their submitter)"

# 1. Packages. Their services are not started (there may be no init to start
# them, and this check runs its own daemons).
need=()
for c in slurmctld:slurmctld slurmd:slurmd srun:slurm-client sinfo:slurm-client munged:munge; do
  command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
  say "installing slurm-wlm and munge (missing: ${need[*]})"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurmctld slurmd slurm-client munge >/dev/null
fi
for c in slurmctld slurmd srun sinfo scontrol munged munge unmunge ss; do
  command -v "$c" >/dev/null || fail "$c is not installed"
done

HOST="$(hostname -s)"
# At least 2 CPUs a node (config_overrides: Slurm takes the configured count),
# so that --ntasks-per-node=2 is allocated and reaches the agent.
CPUS="$(nproc)"
[ "$CPUS" -ge 2 ] || CPUS=2
[ -n "$HOST" ] || fail "hostname -s is empty"
getent hosts "$HOST" >/dev/null || fail "$HOST (hostname -s) does not resolve; slurmctld needs it"
getent hosts localhost >/dev/null || fail "localhost does not resolve"

# 2. The cluster, all under $tmp.
tmp="$(mktemp -d /tmp/check-slurm.XXXXXX)"
chmod 0755 "$tmp"
pids=()
# Processes started with this cluster's SLURM_CONF (by srun or the daemons:
# slurmstepd, workers), other than the daemons and their helpers (children,
# such as slurmctld's slurmscriptd).
step_pids() {
  local e p stat ppid
  for e in /proc/[0-9]*/environ; do
    p="${e#/proc/}"
    p="${p%/environ}"
    case " $$ ${pids[*]} " in *" $p "*) continue ;; esac
    stat="$(cat "/proc/$p/stat" 2>/dev/null)" || continue
    stat="${stat##*) }" # after "PID (COMM) ": STATE PPID ...
    ppid="${stat#* }"
    ppid="${ppid%% *}"
    case " ${pids[*]} " in *" $ppid "*) continue ;; esac
    grep -qzx "SLURM_CONF=$tmp/slurm.conf" "$e" 2>/dev/null && echo "$p"
  done
}
cleanup() {
  local rc=$?
  set +e
  if [ "$rc" -ne 0 ] && [ -d "$tmp/log" ]; then
    for f in "$tmp"/log/*; do
      [ -s "$f" ] || continue
      # A daemon's stderr repeats its log file; shown only when that is empty.
      case "$f" in *.out) [ -s "${f%.out}.log" ] && continue ;; esac
      echo "---- tail of $(basename "$f") ----" >&2
      tail -n 30 "$f" >&2
    done
  fi
  # Let finished steps wind down (their slurmstepd outlive the step by a
  # moment) before the daemons go.
  if [ "${#pids[@]}" -gt 1 ]; then
    local until=$((SECONDS + 15))
    while [ "$SECONDS" -lt "$until" ]; do
      [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && [ -z "$(step_pids)" ] && break
      sleep 0.2
    done
  fi
  # The daemons, newest first (slurmd, slurmctld, munged), each by its pid.
  local i p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null
    for _ in $(seq 50); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${pids[i]}" 2>/dev/null
    wait "${pids[i]}" 2>/dev/null
  done
  # Anything this cluster started and left (a slurmstepd, a worker): the
  # processes whose environment names this cluster's slurm.conf.
  for p in $(step_pids); do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in $(step_pids); do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$tmp/munge" "$tmp/log" "$tmp/state" "$tmp/spool" "$tmp/run"
# munged wants its socket directory searchable by all (clients reach the
# socket) and writable only by itself.
chmod 0711 "$tmp/munge"

# PORT= a TCP port leased to this script until it exits (scripts/ports.py:
# the registry the integration tests lease from, so no concurrent run is
# given it).
lease_port() {
  PORT="$(python3 scripts/ports.py --owner $$)" || fail "no port to lease"
}

# munged, with its own key, socket, pid, seed and log files.
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$tmp/munge/munge.key"
SOCK="$tmp/munge/munge.socket"
munged --foreground --key-file="$tmp/munge/munge.key" --socket="$SOCK" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
  --log-file="$tmp/log/munged.log" >>"$tmp/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$SOCK" ] && break; kill -0 "${pids[0]}" 2>/dev/null || break; sleep 0.1; done
[ -S "$SOCK" ] || fail "munged did not start (no socket $SOCK)"
echo probe | munge --socket="$SOCK" | unmunge --socket="$SOCK" >/dev/null ||
  fail "munge cannot encode and decode a credential with its own key"

lease_port
CTLD_PORT=$PORT
# Job ids start at a random number, so that a 1 taken from elsewhere cannot pass.
FIRST_JOB=$((1000 + RANDOM % 90000))

# slurm.conf for NODES nodes: the first is named as this host, the second
# `localhost`; both are reached on 127.0.0.1, each slurmd on its own port.
write_conf() { # NODES
  local conf="$tmp/slurm.conf"
  lease_port
  cat >"$conf" <<EOF
ClusterName=accelcheck
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCK
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=5
MinJobAge=300
FirstJobId=$FIRST_JOB
Waittime=0
EOF
  local names=("$HOST" localhost)
  local i
  for ((i = 0; i < $1; i++)); do
    lease_port
    echo "NodeName=${names[i]} NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$PORT CPUs=$CPUS State=UNKNOWN" >>"$conf"
  done
  echo "PartitionName=check Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$conf"
}

export SLURM_CONF="$tmp/slurm.conf"
# What a user's environment might carry would change srun's defaults.
unset SLURM_JOB_ID SLURM_JOBID SLURM_STEP_ID SLURM_NNODES SLURM_NTASKS SLURM_NODELIST \
  SLURM_JOB_NODELIST SLURM_NODEID SLURM_PARTITION PET_NNODES PET_NODE_RANK PET_RDZV_ID \
  PET_MASTER_ADDR PET_RDZV_ENDPOINT PET_RDZV_BACKEND 2>/dev/null || true

# Starts slurmctld and NODES slurmd; true when sinfo shows them all idle.
daemons=()
start_cluster() { # NODES
  local nodes=$1 names=("$HOST" localhost) i
  write_conf "$nodes"
  slurmctld -D -c -f "$SLURM_CONF" >>"$tmp/log/slurmctld.out" 2>&1 &
  pids+=($!)
  daemons+=($!)
  for ((i = 0; i < nodes; i++)); do
    mkdir -p "$tmp/spool/${names[i]}"
    slurmd -D -f "$SLURM_CONF" -N "${names[i]}" >>"$tmp/log/slurmd-${names[i]}.out" 2>&1 &
    pids+=($!)
    daemons+=($!)
  done
  local state=""
  for _ in $(seq 120); do
    state="$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)"
    if [ "$(grep -c ' idle$' <<<"$state")" -eq "$nodes" ]; then
      return 0
    fi
    for p in "${daemons[@]}"; do kill -0 "$p" 2>/dev/null || { say "a daemon exited"; return 1; }; done
    sleep 0.5
  done
  say "nodes not idle after 60 s: ${state:-sinfo gave nothing}"
  return 1
}
stop_cluster() {
  local p
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${daemons[@]}"; do wait "$p" 2>/dev/null || true; done
  local keep=()
  for p in "${pids[@]}"; do
    case " ${daemons[*]} " in *" $p "*) ;; *) keep+=("$p") ;; esac
  done
  pids=("${keep[@]}")
  daemons=()
}

NODES=2
if [ "$HOST" = localhost ]; then
  # The second node's name would be this host's.
  say "this host is named localhost: one node only"
  NODES=1
  start_cluster 1 || fail "slurmctld and slurmd did not bring one node up"
elif ! start_cluster 2; then
  say "two slurmd on one host did not work; log tails:"
  for f in "$tmp"/log/slurm*; do
    [ -s "$f" ] && { echo "---- $(basename "$f") ----"; tail -n 8 "$f"; } >&2
  done
  say "retrying with one node"
  stop_cluster
  rm -rf "$tmp/state" "$tmp/spool" && mkdir -p "$tmp/state" "$tmp/spool"
  for f in "$tmp"/log/slurm*; do mv "$f" "$f.two-nodes"; done
  NODES=1
  start_cluster 1 || fail "slurmctld and slurmd did not bring one node up"
fi
say "cluster up: $NODES node(s), $(sinfo -h -N -o '%N' | sort -u | tr '\n' ' ')(slurm $(sinfo -V | awk '{print $2}'))"

# 3. The job: one agent per node, no job flags.
lease_port
MASTER_PORT=$PORT
out="$tmp/run/out" err="$tmp/run/err"
# shellcheck disable=SC2016 # the workers' shell expands them
CMD=(srun -N "$NODES" --ntasks-per-node=1 "$AGENT" --nproc-per-node "$NPROC"
  --master-port "$MASTER_PORT" --no-python sh -c
  'echo "worker RANK=$RANK WORLD_SIZE=$WORLD_SIZE TORCHELASTIC_RUN_ID=$TORCHELASTIC_RUN_ID GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR SLURM_JOB_ID=$SLURM_JOB_ID"')
say "running: ${CMD[*]}"
rc=0
timeout 180 "${CMD[@]}" >"$out" 2>"$err" || rc=$?
sed 's/^/  | /' "$out" >&2
grep 'running under Slurm' "$err" | sed 's/^/  ! /' >&2 || true
if [ "$rc" -ne 0 ]; then
  sed 's/^/  ! /' "$err" >&2
  fail "srun exited $rc (124: timed out)"
fi

JOB="$(sed -n 's/.*running under Slurm (job \([0-9][0-9]*\)).*/\1/p' "$err" | sort -u)"
[ -n "$JOB" ] || fail "no agent said it runs under Slurm"
[ "$(wc -l <<<"$JOB")" -eq 1 ] || fail "agents name different jobs: $(tr '\n' ' ' <<<"$JOB")"
lines="$(grep -c "running under Slurm (job $JOB)" "$err")"
[ "$lines" -eq "$NODES" ] || fail "$lines 'running under Slurm' lines for $NODES nodes"
scontrol show job "$JOB" >"$tmp/run/job" 2>&1 || fail "slurmctld does not know job $JOB: $(cat "$tmp/run/job")"
# The allocation's node list, not NumNodes: slurmctld counts NumNodes down
# as each node finishes its epilog, so a job still completing can show 1.
alloc="$(sed -n 's/^ *NodeList=\([^ ]*\).*/\1/p' "$tmp/run/job" | head -n 1)"
[ "$(scontrol show hostnames "$alloc" 2>/dev/null | wc -l)" -eq "$NODES" ] \
  || fail "job $JOB is not on $NODES nodes: NodeList=$alloc"

WORLD=$((NPROC * NODES))
workers="$(grep -c '^worker ' "$out" || true)"
[ "$workers" -eq "$WORLD" ] || fail "$workers worker lines, expected $WORLD"
bad="$(grep '^worker ' "$out" | grep -v " WORLD_SIZE=$WORLD " || true)"
[ -z "$bad" ] || fail "WORLD_SIZE is not $WORLD: $bad"
bad="$(grep '^worker ' "$out" | grep -v " TORCHELASTIC_RUN_ID=$JOB " || true)"
[ -z "$bad" ] || fail "TORCHELASTIC_RUN_ID is not the job id $JOB: $bad"
bad="$(grep '^worker ' "$out" | grep -v " SLURM_JOB_ID=$JOB\$" || true)"
[ -z "$bad" ] || fail "a worker runs outside job $JOB: $bad"
ranks="$(sed -n 's/^worker RANK=\([0-9]*\) .*/\1/p' "$out" | sort -n | tr '\n' ' ')"
[ "$ranks" = "$(seq -s ' ' 0 $((WORLD - 1))) " ] || fail "ranks printed: $ranks, expected each of 0..$((WORLD - 1)) once"
groups="$(sed -n 's/.* GROUP_RANK=\([0-9]*\) .*/\1/p' "$out" | sort -u | tr '\n' ' ')"
[ "$groups" = "$(seq -s ' ' 0 $((NODES - 1))) " ] || fail "group ranks: $groups, expected 0..$((NODES - 1))"
# The rendezvous host is the allocation's first host.
list="$(sed -n 's/^ *NodeList=\([^ ]*\).*/\1/p' "$tmp/run/job")"
first="$(scontrol show hostnames "$list" | head -n 1)"
masters="$(sed -n 's/.* MASTER_ADDR=\([^ ]*\) .*/\1/p' "$out" | sort -u | tr '\n' ' ')"
[ "$masters" = "$first " ] || fail "MASTER_ADDR: $masters, expected $first (the first host of $list)"

# Several tasks per node: refused, with the flag to use.
say "running: srun -N $NODES --ntasks-per-node=2 $AGENT ... (must be refused)"
rc=0
lease_port
timeout 120 srun -N "$NODES" --ntasks-per-node=2 "$AGENT" --nproc-per-node "$NPROC" \
  --master-port "$PORT" --no-python true >"$out" 2>"$err" || rc=$?
grep -m1 -- '--ntasks-per-node=1' "$err" | sed 's/^/  ! /' >&2 || true
[ "$rc" -eq 2 ] || { sed 's/^/  ! /' "$err" >&2; fail "--ntasks-per-node=2: srun exited $rc, expected 2"; }
grep -q -- '--ntasks-per-node=1' "$err" || { sed 's/^/  ! /' "$err" >&2; fail "the refusal does not name --ntasks-per-node=1"; }
refusals="$(grep -c -- '--ntasks-per-node=1' "$err")"
[ "$refusals" -eq $((2 * NODES)) ] || fail "$refusals refusals for $((2 * NODES)) tasks"

# The example batch script: sbatch it as a user would, with a command that
# prints each worker's view.
say "running: sbatch --wait deploy/slurm/train.sbatch (the example batch script)"
sub="$tmp/submit"
mkdir -p "$sub"
rc=0
# shellcheck disable=SC2016 # the workers' shell expands them
(cd "$sub" && ACCEL_AGENT="$AGENT" ACCEL_NPROC=$NPROC timeout 180 sbatch --wait --parsable \
  --nodes="$NODES" --cpus-per-task="$CPUS" --output="$sub/out" --error="$sub/err" \
  "$OLDPWD/deploy/slurm/train.sbatch" --no-python sh -c \
  'echo "worker RANK=$RANK WORLD_SIZE=$WORLD_SIZE TORCHELASTIC_RUN_ID=$TORCHELASTIC_RUN_ID"') \
  >"$sub/job" 2>"$sub/sbatch.err" || rc=$?
sed 's/^/  | /' "$sub/out" >&2 2>/dev/null || true
if [ "$rc" -ne 0 ]; then
  sed 's/^/  ! /' "$sub/sbatch.err" "$sub/err" >&2 2>/dev/null || true
  fail "sbatch --wait exited $rc (124: timed out)"
fi
BJOB="$(cut -d';' -f1 "$sub/job")"
workers="$(grep -c '^worker ' "$sub/out" || true)"
[ "$workers" -eq "$WORLD" ] || fail "batch job $BJOB: $workers worker lines, expected $WORLD"
bad="$(grep '^worker ' "$sub/out" | grep -v " WORLD_SIZE=$WORLD TORCHELASTIC_RUN_ID=$BJOB\$" || true)"
[ -z "$bad" ] || fail "batch job $BJOB: a worker is not in one job of $WORLD: $bad"
lines="$(grep -c "running under Slurm (job $BJOB)" "$sub/err" || true)"
[ "$lines" -eq "$NODES" ] || fail "batch job $BJOB: $lines 'running under Slurm' lines for $NODES nodes"
[ ! -e "$sub/.accel-token-$BJOB" ] || fail "batch job $BJOB left its token file behind"

# job_state JOB: its state as slurmctld has it (PENDING, RUNNING, COMPLETED...).
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds, or fails the check.
wait_for() {
  local what=$1 limit=$2 i
  shift 2
  for ((i = 0; i < limit * 2; i++)); do
    "$@" && return 0
    sleep 0.5
  done
  fail "$what: not within $limit s"
}
# count_files DIR PATTERN: how many files of DIR hold a line PATTERN.
count_files() { grep -l -- "$2" "$1"/rank-* 2>/dev/null | wc -l; }

# Two more jobs of the same script, side by side (a CPU a node each, so
# both fit at once):
#  - the time limit's warning: `#SBATCH --signal=TERM@120` signals the job's
#    steps (the agents) ahead of the limit; `scancel --signal=TERM` sends the
#    same, steps only. Workers that trap SIGTERM and save for 90 s more must
#    finish: the agent waits the whole lead (and KillWait) before it kills;
#  - requeue: the job runs again with the same id, and a script that saved a
#    checkpoint resumes from it. Run 0 saves step 5 and waits; `scontrol
#    requeue` ends it and queues it again; run 1 reads the checkpoint.
DRAIN_SECONDS=90
drain="$tmp/drain" rq="$tmp/requeue"
mkdir -p "$drain" "$rq"
cat >"$drain/worker.sh" <<'WORKER'
#!/bin/sh
# On SIGTERM: a line a second for DRAIN_SECONDS (a checkpoint being saved),
# then `saved`, exit 0.
out="$DRAIN_DIR/rank-$RANK"
trap 'i=0; while [ "$i" -lt "$DRAIN_SECONDS" ]; do echo "saving $i" >>"$out"; i=$((i + 1)); sleep 1; done; echo saved >>"$out"; exit 0' TERM
echo started >>"$out"
while :; do sleep 1; done
WORKER
cat >"$rq/worker.sh" <<'WORKER'
#!/bin/sh
ckpt="$RQ_DIR/checkpoint"
out="$RQ_DIR/rank-$RANK"
if [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ]; then
  [ "$RANK" != 0 ] || { echo 5 >"$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"; }
  echo "run 0 started" >>"$out"
  while :; do sleep 1; done
fi
echo "run $SLURM_RESTART_COUNT resumed from step $(cat "$ckpt")" >>"$out"
WORKER
chmod +x "$drain/worker.sh" "$rq/worker.sh"
# submit DIR: sbatch's the example script in DIR with DIR/worker.sh; prints the job id.
submit() {
  local dir=$1 rc=0
  (cd "$dir" && DRAIN_DIR="$drain" DRAIN_SECONDS=$DRAIN_SECONDS RQ_DIR="$rq" ACCEL_AGENT="$AGENT" ACCEL_NPROC=$NPROC \
    sbatch --parsable --nodes="$NODES" --cpus-per-task=1 --output="$dir/out" --error="$dir/err" --open-mode=append \
    "$OLDPWD/deploy/slurm/train.sbatch" --no-python "$dir/worker.sh") >"$dir/job" 2>"$dir/sbatch.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "sbatch exited $rc: $(cat "$dir/sbatch.err")"
  cut -d';' -f1 "$dir/job"
}
say "running: sbatch deploy/slurm/train.sbatch twice: scancel --signal=TERM (the time limit's warning; workers save for $DRAIN_SECONDS s), and scontrol requeue (the second run resumes from the first's checkpoint)"
DJOB="$(submit "$drain")"
RJOB="$(submit "$rq")"
all_started() { [ "$(count_files "$drain" '^started$')" -eq "$WORLD" ]; }
wait_for "drain job $DJOB: every worker started" 120 all_started
scancel --signal=TERM "$DJOB" || fail "scancel --signal=TERM $DJOB failed"
signaled=$SECONDS
run0_started() { [ "$(count_files "$rq" '^run 0 started$')" -eq "$WORLD" ] && [ -s "$rq/checkpoint" ]; }
wait_for "requeue job $RJOB: run 0 started and saved" 120 run0_started
scontrol requeue "$RJOB" || fail "scontrol requeue $RJOB failed"
ended() { case "$(job_state "$DJOB")" in PENDING | RUNNING | CONFIGURING | COMPLETING | "") return 1 ;; *) return 0 ;; esac; }
wait_for "drain job $DJOB: the end" $((DRAIN_SECONDS + 60)) ended
took=$((SECONDS - signaled))
saved="$(count_files "$drain" '^saved$')"
if [ "$saved" -ne "$WORLD" ]; then
  for f in "$drain"/rank-*; do echo "  | $(basename "$f"): $(grep -c '^saving' "$f") lines, last: $(tail -n 1 "$f")"; done >&2
  sed 's/^/  ! /' "$drain/err" >&2 2>/dev/null || true
  fail "drain job $DJOB: $saved of $WORLD workers finished saving after SIGTERM (the agents' --shutdown-timeout cut them short?)"
fi
say "drain job $DJOB: all $WORLD workers saved for $DRAIN_SECONDS s after SIGTERM and exited (job over $took s after the signal, state $(job_state "$DJOB"))"
resumed() { [ "$(count_files "$rq" '^run 1 resumed from step 5$')" -eq "$WORLD" ]; }
wait_for "requeue job $RJOB: every worker of run 1 resumed from step 5" 240 resumed
completed() { [ "$(job_state "$RJOB")" = COMPLETED ]; }
wait_for "requeue job $RJOB: run 1 completed" 60 completed
say "requeue job $RJOB: run 1 resumed from run 0's checkpoint on all $WORLD workers and completed"

say "all checks passed in $((SECONDS - START)) s"
echo "check-slurm: ok ($NODES nodes, job $JOB)"
