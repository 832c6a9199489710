"""A test worker: records what it sees, then behaves as the test asks.

Writes one JSON file per attempt to $RECORD_DIR/<restart>_<rank>[_<pid>].json with its
environment, argv, pid, process group and start time. Behaviour, from the
environment the test gives the agent:

  FAIL_RANKS=3,5      these global ranks exit with FAIL_CODE (default 3)...
  FAIL_UNTIL=1        ...while TORCHELASTIC_RESTART_COUNT < FAIL_UNTIL (default: always)
  FAIL_AFTER=0.2      seconds before failing
  RUN_FOR=0.5         seconds a healthy worker runs before exiting 0
  RUN_FOR_WORLD=3:60  ...but this long while WORLD_SIZE is 3 (a round the test breaks)
  SPAWN_CHILD=1       start a grandchild (`sleep 600`) in the worker's group first
  ON_SIGTERM=exit|ignore   on SIGTERM or SIGINT, exit: record the signal and exit 0;
                           ignore: record it and keep running
"""
import json
import os
import signal
import subprocess
import sys
import time

start = time.time()
env = os.environ
rank = int(env["RANK"])
restart = int(env["TORCHELASTIC_RESTART_COUNT"])
out_dir = env["RECORD_DIR"]
# RECORD_EACH_ROUND=1: one file per process, for jobs whose membership changes
# without a counted restart (the restart count, hence the name, stays the same).
suffix = f"_{os.getpid()}" if env.get("RECORD_EACH_ROUND") == "1" else ""
path = os.path.join(out_dir, f"{restart}_{rank}{suffix}.json")

record = {
    "env": {k: v for k, v in env.items()},
    "argv": sys.argv[1:],
    "pid": os.getpid(),
    "pgid": os.getpgid(0),
    "start": start,
    "unbuffered": "-u" in getattr(sys, "orig_argv", []),
    "children": [],
}

if env.get("SPAWN_CHILD") == "1":
    child = subprocess.Popen(["sleep", "600"])
    record["children"].append(child.pid)


def write():
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def on_term(signum, frame):
    record["signal"] = signum
    record["signal_at"] = time.time()
    write()
    if env.get("ON_SIGTERM") == "exit":
        sys.exit(0)


if env.get("ON_SIGTERM") in ("exit", "ignore"):
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

write()

fail_ranks = {int(r) for r in env.get("FAIL_RANKS", "").split(",") if r}
fail_until = int(env.get("FAIL_UNTIL", "1000000"))
if rank in fail_ranks and restart < fail_until:
    time.sleep(float(env.get("FAIL_AFTER", "0.2")))
    sys.exit(int(env.get("FAIL_CODE", "3")))

run_for = float(env.get("RUN_FOR", "0.5"))
world, _, long_run = env.get("RUN_FOR_WORLD", "").partition(":")
if world and env["WORLD_SIZE"] == world:
    run_for = float(long_run)
deadline = time.time() + run_for
while time.time() < deadline:
    time.sleep(0.02)
record["end"] = time.time()
write()
