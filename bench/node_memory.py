"""Memory of a node running N workers that import torch: accel (cold),
accel with `--preload torch` (workers forked from a zygote), and torchrun,
in one run.

Each worker imports torch, makes a tensor, says it is ready and waits; once
all are ready, the PSS (proportional set size: shared pages divided among
the processes that share them) of every process in the launcher's tree is
summed, so pages the forks share with the zygote count once.

Usage: python bench/node_memory.py --accel PATH --torchrun PATH [--nproc 4]
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

WORKER = """
import os, sys, time, torch
x = torch.ones(1000)
open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
time.sleep(120)
"""


def tree(pid):
    """`pid` and its descendants."""
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out.extend(tree(int(child)))
    except OSError:
        pass
    return out


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(cmd, nproc, ready_dir):
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = dict(os.environ, PATH=path, OMP_NUM_THREADS="1", LOGLEVEL="ERROR", ACCEL_LOG="error")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300
        while len([f for f in os.listdir(ready_dir) if f.startswith("ready_")]) < nproc:
            if p.poll() is not None or time.time() > deadline:
                return None
            time.sleep(0.1)
        time.sleep(1)  # let the last worker settle after its mark
        procs = tree(p.pid)
        return sum(pss_kib(q) for q in procs) / 1024, len(procs)
    finally:
        kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill(p.pid, signal.SIGKILL)
            p.wait()


def kill(pgid, sig):
    """Signals the launcher's group, which may already be gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--nproc", type=int, default=4)
    a = ap.parse_args()
    kinds = {
        "accel": [a.accel, "--nproc-per-node", str(a.nproc)],
        "accel --preload torch": [a.accel, "--nproc-per-node", str(a.nproc), "--preload", "torch"],
        "torchrun": [a.torchrun, "--nproc-per-node", str(a.nproc)],
    }
    print(f"| launcher | node memory with {a.nproc} torch workers (PSS, MiB) | processes |")
    print("|---|---|---|")
    results = {}
    for name, cmd in kinds.items():
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "worker.py")
            with open(script, "w") as f:
                f.write(WORKER)
            r = measure([*cmd, script, d], a.nproc, d)
        if r is None:
            print(f"| {name} | failed | – |")
            continue
        results[name] = r[0]
        print(f"| {name} | {r[0]:.0f} | {r[1]} |")
    if "torchrun" in results:
        for name in ("accel", "accel --preload torch"):
            if name in results:
                print(f"\n{name}: {results['torchrun'] / results[name]:.2f}x less memory than torchrun", end="")
        print()


if __name__ == "__main__":
    main()
