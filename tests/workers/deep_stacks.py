"""A worker whose stack is deep and its own: rank R recurses DEPTH frames
(DEPTH, default 2000) of a function named after it before it sleeps, so each
rank's stacks differ in every frame and a job's stacks answer is large
(each rank's text is cut at the agent's per-rank bound).

  deep_stacks.py   (PLACE_DIR=DIR: each rank creates DIR/rank-N once it
                    sleeps at the bottom)
"""
import os
import sys
import time

rank = int(os.environ["RANK"])
depth = int(os.environ.get("DEPTH", "2000"))
sys.setrecursionlimit(depth + 100)


def bottom():
    place = os.environ.get("PLACE_DIR")
    if place:
        open(os.path.join(place, f"rank-{rank}"), "w").close()
    time.sleep(600)


name = f"descends_one_more_frame_in_rank_{rank}"
scope = {"bottom": bottom}
exec(
    f"def {name}(left):\n"
    f"    if left:\n"
    f"        return {name}(left - 1)\n"
    f"    bottom()\n",
    scope,
)
scope[name](depth)
