"""A job whose stacks tell one rank from the others: every rank joins a
gloo process group; one rank sleeps inside `sleeps_inside_a_function`
while every other rank waits for it in a barrier.

  stacks_job.py   (STUCK_RANK=N: which rank sleeps, default the last;
                   HANG_AFTER=S: in the first attempt the sleeping rank
                   arms torch's FileTimer for S seconds around its sleep,
                   so the agent takes it for hung, with
                   TORCHELASTIC_ENABLE_FILE_TIMER=1 in the agent's
                   environment; later attempts sleep without a timer;
                   PLACE_DIR=DIR: each rank creates DIR/rank-N-attempt-A
                   once it is where it stays)
"""
import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
stuck = int(os.environ.get("STUCK_RANK", dist.get_world_size() - 1))


def in_place():
    place = os.environ.get("PLACE_DIR")
    if place:
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        open(os.path.join(place, f"rank-{rank}-attempt-{attempt}"), "w").close()
    print(f"rank {rank} in place", flush=True)


def sleeps_inside_a_function():
    in_place()
    time.sleep(600)


if rank == stuck:
    after = os.environ.get("HANG_AFTER")
    if after and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        from torch.distributed.elastic.timer import FileTimerClient, configure, expires

        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        with expires(after=float(after), scope="step"):
            sleeps_inside_a_function()
    else:
        sleeps_inside_a_function()
else:
    in_place()
    dist.barrier()
print(f"rank {rank} done", flush=True)
