"""The chaos run's recording worker: appends what it sees to a shared history.

Every line is one JSON object, appended with O_APPEND (one write per line, so
lines of workers on every node never interleave), with CLOCK_MONOTONIC times:
that clock is the same for every process of the machine, whatever network
namespace it is in, so the harness can order events of all nodes.

  {"ev": "start"|"beat"|"end", "t": MONOTONIC, "job", "rank", "world",
   "local_rank", "group_rank", "restart", "master", "pid", "node"}

A `start` line first, then a `beat` every 50 ms while the worker runs, and
`end` when the harness has created $CHAOS_STOP (the job is then told to
finish: the worker exits 0). Once a second it prints a line, so the agent's
log directory sees writes (a full log disk is one of the faults).
"""
import json
import os
import sys
import time

env = os.environ
fd = os.open(env["CHAOS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
base = {
    "job": env["CHAOS_JOB"],
    "rank": int(env["RANK"]),
    "world": int(env["WORLD_SIZE"]),
    "local_rank": int(env["LOCAL_RANK"]),
    "group_rank": int(env["GROUP_RANK"]),
    "restart": int(env["TORCHELASTIC_RESTART_COUNT"]),
    "master": f'{env["MASTER_ADDR"]}:{env["MASTER_PORT"]}',
    "pid": os.getpid(),
    "node": env["CHAOS_NODE"],
}


def emit(ev):
    line = dict(base, ev=ev, t=time.monotonic())
    os.write(fd, (json.dumps(line) + "\n").encode())


emit("start")
stop = env["CHAOS_STOP"]
beats = 0
while True:
    time.sleep(0.05)
    if os.path.exists(stop):
        emit("end")
        sys.exit(0)
    emit("beat")
    beats += 1
    if beats % 20 == 0:
        try:
            print(f"rank {base['rank']} beat {beats}", flush=True)
        except OSError:
            pass
