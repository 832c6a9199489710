"""A training loop that reports progress and fails at a step.

Each rank counts steps from the last checkpoint (CKPT_DIR/step, written by
rank 0 every 10 steps), calls accel.progress(step) after each one, and
accel.checkpointed(step) at every tenth; rank 0 exits 1 when it reaches
FAIL_AT + FAIL_STRIDE * TORCHELASTIC_RESTART_COUNT (FAIL_STRIDE defaults
to 0: the same step after every restart). Each attempt of rank 0 leaves
CKPT_DIR/attempt-N.

  progress_job.py   (CKPT_DIR, FAIL_AT; FAIL_STRIDE; STEPS: where it ends,
                     default 1000; REPORT=0: no accel calls, the agent reads
                     CKPT_DIR/step as --checkpoint-iteration-file)
"""
import os
import time

import accel

report = os.environ.get("REPORT", "1") == "1"

ckpt = os.environ["CKPT_DIR"]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
fail_at = int(os.environ["FAIL_AT"]) + int(os.environ.get("FAIL_STRIDE", "0")) * attempt
path = os.path.join(ckpt, "step")
if rank == 0:
    open(os.path.join(ckpt, f"attempt-{attempt}"), "w").close()
step = int(open(path).read()) if os.path.exists(path) else 0
while step < int(os.environ.get("STEPS", "1000")):
    time.sleep(0.005 if report else 0.05)
    step += 1
    if report:
        accel.progress(step)
    if rank == 0 and step == fail_at:
        raise SystemExit(1)
    if step % 10 == 0:
        if rank == 0:
            with open(path + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(path + ".tmp", path)
        if report:
            accel.checkpointed(step)
