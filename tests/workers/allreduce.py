"""init_process_group("gloo") with the default env:// and one all_reduce of
rank + 1, checked on every rank.

Writes $RECORD_DIR/allreduce_<rank>.json with the reduced value and the
MASTER_ADDR, MASTER_PORT and GROUP_RANK it ran with. With $WAIT_FOR set, it
then waits (at most 120 s) for that file to exist, so a test can act while the
job runs, all-reduces again in a new group (whose members meet through the
store, so this shows the store still serves them) and adds that result to
its record as `after`."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
expected = world * (world + 1) / 2


def all_reduce(group=None):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=group)
    assert t.item() == expected, f"rank {rank}: all_reduce gave {t.item()}, not {expected}"
    return t.item()


def record(**extra):
    path = os.path.join(os.environ["RECORD_DIR"], f"allreduce_{rank}.json")
    env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")}
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "world": world, "sum": total, "env": env, **extra}, f)
    os.replace(path + ".tmp", path)


total = all_reduce()
record()
wait_for = os.environ.get("WAIT_FOR")
if wait_for:
    deadline = time.time() + 120
    while not os.path.exists(wait_for) and time.time() < deadline:
        time.sleep(0.05)
    record(after=all_reduce(dist.new_group()))
# Leave together, then skip interpreter teardown: torch 2.13 sometimes aborts
# ("terminate called without an active exception") while tearing down gloo's
# threads at exit, under any launcher; the result is already written.
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
