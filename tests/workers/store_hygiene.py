"""Restart hygiene: attempt 0 writes keys to the worker store and rank 1
fails; attempt 1 records whether any of those keys is visible.

Writes $RECORD_DIR/hygiene_<restart>_<rank>.json."""
import datetime
import json
import os
import sys
import time

import torch.distributed as dist

rank = int(os.environ["RANK"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
record = {"rank": rank, "restart": restart, "port": os.environ["MASTER_PORT"]}
if restart == 0:
    store.set(f"attempt0/rank{rank}", "stale")
    store.add("attempt0/counter", 1)
    store.wait(["attempt0/counter"])
    record["wrote"] = True
else:
    record["sees_stale"] = [store.check([f"attempt0/rank{r}"]) for r in range(int(os.environ["WORLD_SIZE"]))]
    record["sees_counter"] = store.check(["attempt0/counter"])
    record["keys"] = sorted(store.list_keys())
with open(os.path.join(os.environ["RECORD_DIR"], f"hygiene_{restart}_{rank}.json"), "w") as f:
    json.dump(record, f)
if restart == 0:
    time.sleep(0.5)  # let every rank write before the failure
    if rank == 1:
        sys.exit(5)
    time.sleep(30)
