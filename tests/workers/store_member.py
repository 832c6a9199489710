"""A worker that is a PyTorch TCPStore client of the agent's store: it writes
and reads a key, records that in $OUT_DIR/ok_<rank>, then waits until
$OUT_DIR/done exists (at most 120 s) so the test can probe the store meanwhile.
"""
import datetime
import os
import time

import torch.distributed as dist

out = os.environ["OUT_DIR"]
rank = os.environ["RANK"]
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
store.set(f"hello/{rank}", rank)
assert store.get(f"hello/{rank}") == rank.encode()
with open(os.path.join(out, f"ok_{rank}"), "w") as f:
    f.write(f"{os.environ['MASTER_ADDR']} {os.environ['MASTER_PORT']}\n")
deadline = time.time() + 120
while not os.path.exists(os.path.join(out, "done")) and time.time() < deadline:
    time.sleep(0.05)
# The store still answers after the probes.
assert store.get(f"hello/{rank}") == rank.encode()
