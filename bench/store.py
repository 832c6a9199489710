"""Worker-store benchmark: accel's agent-hosted store vs PyTorch's own (libuv)
TCPStore server, side by side in one run, driven by real PyTorch clients.

Run it as a worker of accel-agent, so MASTER_ADDR:MASTER_PORT is the agent's
store (scripts/bench-store.sh does this):

  accel-agent --no-python python bench/store.py [--clients 64,1024] [--seconds 5]

For each client count N, N TCPStore clients (threads spread over several
processes) each loop set / get / add on their own keys for a fixed time; each
operation's latency is measured around the client call. PyTorch's server runs
in its own process. Prints a Markdown table of ops/s, p50/p99 latency and the
server's own CPU time per operation (from /proc: the agent process, or PyTorch's
server process).
"""
import argparse
import datetime
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=120)


def client_proc(host, port, nthreads, seconds, barrier, out_q, tag):
    stores = [dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT, wait_for_workers=False)
              for _ in range(nthreads)]
    lat = []
    counts = []
    lock = threading.Lock()
    go = threading.Event()

    def work(i, s):
        mine, n = [], 0
        key, ctr, val = f"{tag}/k{os.getpid()}_{i}", f"{tag}/c{os.getpid()}_{i}", b"x" * 64
        go.wait()
        end = time.perf_counter() + seconds
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            s.set(key, val)
            t1 = time.perf_counter()
            s.get(key)
            t2 = time.perf_counter()
            s.add(ctr, 1)
            t3 = time.perf_counter()
            mine += [t1 - t0, t2 - t1, t3 - t2]
            n += 3
        with lock:
            lat.extend(mine)
            counts.append(n)

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    barrier.wait()
    go.set()
    for t in threads:
        t.join()
    out_q.put((sum(counts), lat))


def cpu_seconds(pid):
    """User + system CPU time of one process (not its children)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(host, port, nclients, seconds, tag, server_pid):
    nproc = min(16, nclients)
    per = [nclients // nproc + (1 if i < nclients % nproc else 0) for i in range(nproc)]
    barrier = mp.Barrier(nproc + 1)
    q = mp.Queue()
    procs = [mp.Process(target=client_proc, args=(host, port, n, seconds, barrier, q, tag)) for n in per]
    for p in procs:
        p.start()
    barrier.wait()
    t0, c0 = time.perf_counter(), cpu_seconds(server_pid)
    results = [q.get() for _ in procs]
    wall, cpu = time.perf_counter() - t0, cpu_seconds(server_pid) - c0
    for p in procs:
        p.join()
    ops = sum(r[0] for r in results)
    lat = sorted(x for r in results for x in r[1])
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6
    return ops / max(wall, seconds), pct(0.50), pct(0.99), cpu / max(ops, 1) * 1e6


def start_torch_server():
    code = ("import datetime,sys,time,torch.distributed as d;"
            "s=d.TCPStore('127.0.0.1',0,is_master=True,wait_for_workers=False,use_libuv=True,"
            "timeout=datetime.timedelta(seconds=600));print(s.port,flush=True);time.sleep(3600)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return p, int(p.stdout.readline())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="64,1024")
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    torch_server, torch_port = start_torch_server()
    rows = []
    try:
        for n in [int(c) for c in a.clients.split(",")]:
            # Alternate the order so neither server always runs on a warmer machine.
            for name, h, p, pid in [("accel agent store", host, port, os.getppid()),
                                    ("PyTorch libuv TCPStore", "127.0.0.1", torch_port, torch_server.pid)]:
                rows.append((n, name) + measure(h, p, n, a.seconds, f"n{n}", pid))
    finally:
        torch_server.kill()
    print(f"worker store, set/get/add loops, {a.seconds:.0f} s per case; {os.cpu_count()} CPUs "
          f"shared by server and clients")
    print()
    print("| clients | server | ops/s | p50 | p99 | server CPU per op |")
    print("|---|---|---|---|---|---|")
    for n, name, ops, p50, p99, cpu in rows:
        print(f"| {n} | {name} | {ops:,.0f} | {p50:.0f} µs | {p99:.0f} µs | {cpu:.1f} µs |")


if __name__ == "__main__":
    main()
