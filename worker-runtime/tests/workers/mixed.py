"""The collectives of `wr-collectives check`, from Python, for mixed jobs.

init_process_group("gloo") from env://, then the same sequence with the same
rank-derived inputs as src/bin/wr-collectives.rs (keep them in step); writes
$RECORD_DIR/rank<RANK>.json in the same shape."""
import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
f = float(r)
results = {}


def t(values):
    return torch.tensor(values, dtype=torch.float32)


for name, op, values in [
    ("sum", dist.ReduceOp.SUM, [f + 1, 0.5 * (f + 1)]),
    ("avg", dist.ReduceOp.AVG, [f + 1, 10 * (f + 1)]),
    ("min", dist.ReduceOp.MIN, [f + 1, -(f + 1)]),
    ("max", dist.ReduceOp.MAX, [f + 1, -(f + 1)]),
]:
    x = t(values)
    dist.all_reduce(x, op=op)
    results[name] = x.tolist()
for name, root in [("broadcast_first", 0), ("broadcast_last", n - 1)]:
    x = t([100 * f + 1, 100 * f + 2])
    dist.broadcast(x, src=root)
    results[name] = x.tolist()
outs = [torch.empty(2) for _ in range(n)]
dist.all_gather(outs, t([f, f * f]))
results["all_gather"] = [o.tolist() for o in outs]
out = torch.zeros(2)
dist.reduce_scatter(out, [t([10 * f + i, i - f]) for i in range(n)])
results["reduce_scatter"] = out.tolist()
dist.barrier()

path = os.path.join(os.environ.get("RECORD_DIR", "."), f"rank{r}.json")
with open(path, "w") as fh:
    json.dump({"rank": r, "world": n, "kind": "python", "results": results}, fh)
# Leave together, then skip interpreter teardown (torch 2.13 may abort while
# tearing down gloo's threads at exit; the result is already written).
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
