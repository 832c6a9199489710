"""Prints one line saying how this worker was started (forked from a
`--preload` zygote or not); in the first attempt, sleeps SECONDS (a test
kills something meanwhile) and exits CODE; later attempts exit 0.

  hot_once.py [SECONDS [CODE]]
"""
import os
import sys
import time

parent = os.getppid()
with open(f"/proc/{parent}/cmdline", "rb") as f:
    forked = b"<accel zygote>" in f.read()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {os.environ['RANK']} attempt {attempt} forked={forked}", flush=True)
if attempt == 0:
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 60)
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
