"""torchrun's side of the rendezvous benchmark: N c10d rendezvous handlers
(torch.distributed.elastic's DynamicRendezvousHandler, what each torchrun
agent runs) complete one round on one TCPStore. The handlers are spread over
several processes (threads inside each), since all N in one Python process
would serialise on its GIL. Prints one Markdown row per N: the time from all
handlers ready to the last one's round completing.

Usage: python bench/torch_rdzv.py [--nodes 8,64,128,256] [--procs 8]
"""
import argparse
import datetime
import multiprocessing as mp
import threading
import time

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler


def worker(port, n, count, run_id, barrier, q):
    params = lambda: RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id=run_id, min_nodes=n, max_nodes=n,
        is_host=False, join_timeout="300", read_timeout="300")
    handlers = [get_rendezvous_handler(params()) for _ in range(count)]
    done = []
    go = threading.Event()

    def join(h):
        go.wait()
        h.next_rendezvous()
        done.append(time.time())

    threads = [threading.Thread(target=join, args=(h,)) for h in handlers]
    for t in threads:
        t.start()
    barrier.wait()
    go.set()
    for t in threads:
        t.join()
    # No shutdown(): it closes the rendezvous for handlers of other processes.
    q.put(max(done) if len(done) == count else float("nan"))


def measure(n, procs):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=600))
    procs = min(procs, n)
    per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    barrier = mp.Barrier(procs + 1)
    q = mp.Queue()
    run_id = f"bench{n}"
    ps = [mp.Process(target=worker, args=(store.port, n, c, run_id, barrier, q)) for c in per]
    for p in ps:
        p.start()
    barrier.wait()
    t0 = time.time()
    last = max(q.get() for _ in ps)
    for p in ps:
        p.join()
    return last - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="8,64,128,256")
    ap.add_argument("--procs", type=int, default=8)
    a = ap.parse_args()
    for n in [int(x) for x in a.nodes.split(",")]:
        print(f"| {n} | {measure(n, a.procs):.3f} s |", flush=True)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    main()
