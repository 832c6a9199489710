"""init_process_group("gloo") with the default env:// and one all_reduce.

Writes $RECORD_DIR/allreduce_<rank>.json with the reduced value."""
import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
with open(os.path.join(os.environ["RECORD_DIR"], f"allreduce_{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": t.item()}, f)
dist.destroy_process_group()
