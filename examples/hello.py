"""The smallest job: every worker prints where it sits in the job.

Run it with `accel-agent --nproc-per-node 4 examples/hello.py` (or under
torchrun, with the same flags); no PyTorch needed.
"""
import os
import sys

keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID"]
# One write per line: the workers share the terminal, and under
# PYTHONUNBUFFERED `print` writes the text and its newline separately, so
# two ranks' lines could run together.
sys.stdout.write(" ".join(f"{k}={os.environ.get(k, '')}" for k in keys) + "\n")
