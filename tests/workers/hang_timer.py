"""Arms torch's FileTimer (the client torchrun documents) around a step; in
the first attempt rank 1 hangs inside it, in `stuck_in_a_collective`, until
the agent acts on the expired timer. Later attempts finish.

  hang_timer.py   (with TORCHELASTIC_ENABLE_FILE_TIMER=1 in the agent's environment)
"""
import os
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires

configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])


def stuck_in_a_collective():
    time.sleep(600)


with expires(after=1, scope="train_step"):
    if rank == 1 and attempt == 0:
        stuck_in_a_collective()
print(f"rank {rank} attempt {attempt} done", flush=True)
