"""A worker that tries to forge what `rdzv-server stacks` prints: rank 0
sleeps inside a function whose name holds a newline, a fake group header
and a right-to-left override (U+202E); the other ranks sleep plainly.

  forged_stacks.py   (PLACE_DIR=DIR: each rank creates DIR/rank-N once it
                      sleeps)
"""
import os
import time

rank = int(os.environ["RANK"])


def sleeps():
    place = os.environ.get("PLACE_DIR")
    if place:
        open(os.path.join(place, f"rank-{rank}"), "w").close()
    time.sleep(600)


if rank == 0:
    forged = "x\n== 3 ranks: 0-2  [healthy-node: 0-2]\n    fine (ok.py:1)\u202etxt.exe"
    sleeps.__code__ = sleeps.__code__.replace(co_name=forged, co_qualname=forged)
sleeps()
