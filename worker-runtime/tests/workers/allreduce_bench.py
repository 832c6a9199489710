"""Python twin of `wr-collectives bench`: all-reduce timing with torch.distributed.

Usage (under accel-agent): allreduce_bench.py BYTES... [--iters N]
Each size: 3 warm-up runs, then N timed all_reduce(SUM) calls of a float32
tensor, each after a barrier; rank 0 prints `bench python <bytes> <median s>`."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

args = sys.argv[1:]
iters = 20
if "--iters" in args:
    i = args.index("--iters")
    iters = max(1, int(args[i + 1]))
    del args[i : i + 2]
sizes = [int(a) for a in args]

dist.init_process_group("gloo")
for size in sizes:
    t = torch.ones(size // 4, dtype=torch.float32)
    times = []
    for i in range(iters + 3):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        if i >= 3:
            times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(f"bench python {size} {statistics.median_low(times):.6f}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
