"""A training loop whose steps take STEP_S seconds +/- JITTER (a share,
default 0.5; uniform, seeded by rank and attempt), reporting each with
accel.progress(step); rank SLOW_RANK (global), or SLOW_LOCAL_RANK (local:
one node's), sleeps SLOW (a share of STEP_S) more per step; with
HANG_AT, rank 0 of the first attempt stops making progress at that step
(it sleeps in `stuck_between_steps`) until it is killed; every CKPT_EVERY
steps (default 50) it saves a checkpoint inside accel.section("checkpoint")
taking SAVE_S seconds. Each attempt of rank 0 leaves CKPT_DIR/attempt-N;
at the end each rank prints `rank R attempt N done`.

  hang_job.py   (CKPT_DIR, STEPS, STEP_S; JITTER; SLOW_RANK or SLOW_LOCAL_RANK, SLOW; HANG_AT;
                 CKPT_EVERY; SAVE_S;
                 EARLY_STEPS: rank 1 does only this many steps, then exits 0)
"""
import os
import random
import time

import accel

ckpt = os.environ["CKPT_DIR"]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
steps = int(os.environ["STEPS"])
if rank == 1 and "EARLY_STEPS" in os.environ:
    steps = int(os.environ["EARLY_STEPS"])
step_s = float(os.environ["STEP_S"])
hang_at = int(os.environ.get("HANG_AT", "-1"))
every = int(os.environ.get("CKPT_EVERY", "50"))
save_s = float(os.environ.get("SAVE_S", "0"))
jitter = float(os.environ.get("JITTER", "0.5"))
slow = rank == int(os.environ.get("SLOW_RANK", "-1")) or os.environ["LOCAL_RANK"] == os.environ.get(
    "SLOW_LOCAL_RANK"
)
extra = step_s * float(os.environ.get("SLOW", "0")) if slow else 0.0
rng = random.Random(1000 * attempt + rank)
if rank == 0:
    open(os.path.join(ckpt, f"attempt-{attempt}"), "w").close()


def stuck_between_steps():
    with open(os.path.join(ckpt, "hung-at"), "w") as f:
        f.write(f"{time.time():.6f}\n")
    time.sleep(600)


for step in range(1, steps + 1):
    time.sleep(step_s * rng.uniform(1 - jitter, 1 + jitter) + extra)
    accel.progress(step)
    if rank == 0 and attempt == 0 and step == hang_at:
        stuck_between_steps()
    if step % every == 0:
        with accel.section("checkpoint"):
            time.sleep(save_s)
        accel.checkpointed(step)
print(f"rank {rank} attempt {attempt} done", flush=True)
