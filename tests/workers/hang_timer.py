"""Arms torch's FileTimer (the client torchrun documents) around a step; in
the first attempt rank 1 hangs inside it, in `stuck_in_a_collective`, until
the agent acts on the expired timer. Later attempts finish.

  hang_timer.py   (with TORCHELASTIC_ENABLE_FILE_TIMER=1 in the agent's environment;
                   FLOOD_PID, FLOOD_COUNT: see below)
"""
import os
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires

configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])

# FLOOD_PID=PID: before arming its own timer, the rank that will hang
# writes FLOOD_COUNT far-future timers for PID (a live process that is no
# worker's) to the agent's pipe, as any process of the user could.
if os.environ.get("FLOOD_PID") and rank == 1 and attempt == 0:
    import json

    pid, count = int(os.environ["FLOOD_PID"]), int(os.environ.get("FLOOD_COUNT", "5000"))
    fd = os.open(os.environ["TORCHELASTIC_TIMER_FILE"], os.O_WRONLY)
    far = time.time() + 24 * 3600
    for i in range(count):
        line = {"version": 1, "pid": pid, "scope_id": f"flood-{i}", "expiration_time": far, "signal": 9}
        os.write(fd, (json.dumps(line) + "\n").encode())
    os.close(fd)
    print(f"rank {rank} flooded the pipe with {count} timers for pid {pid}", flush=True)


def stuck_in_a_collective():
    time.sleep(600)


# With a flood, only the flooding rank arms a timer: torch's client writes
# without blocking, so another rank's request fails (EAGAIN) while the
# flood fills the pipe, and what is tested is the flooding rank's own timer.
if os.environ.get("FLOOD_PID") and rank != 1:
    print(f"rank {rank} attempt {attempt} done", flush=True)
    raise SystemExit(0)

with expires(after=1, scope="train_step"):
    if rank == 1 and attempt == 0:
        stuck_in_a_collective()
print(f"rank {rank} attempt {attempt} done", flush=True)
