"""init_process_group("gloo") with the default env:// and one all_reduce.

Writes $RECORD_DIR/allreduce_<rank>.json with the reduced value."""
import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
with open(os.path.join(os.environ["RECORD_DIR"], f"allreduce_{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": t.item()}, f)
# Leave together, then skip interpreter teardown: torch 2.13 sometimes aborts
# ("terminate called without an active exception") while tearing down gloo's
# threads at exit, under any launcher; the result is already written.
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
