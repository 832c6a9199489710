"""Restart benchmark: one worker fails once; time from its exit to every
worker of the new round running. accel-agent vs torchrun, on 1 and on 3
agents (2 workers each), in one run.

Workers are shell scripts that stamp `date +%s.%N` when they start and just
before the failing one exits, so interpreter start-up is not measured. The
last column is the floor under any launcher on this machine: the same
scripts started at once by this process with nothing else running, from the
first spawn to the last start stamp.

Usage: python bench/restart.py --accel PATH --server PATH --torchrun PATH [--runs 3]
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from ports import lease  # noqa: E402  (ports leased as the tests lease theirs)

WORKER = r"""#!/bin/sh
echo "start $(date +%s.%N) $TORCHELASTIC_RESTART_COUNT $RANK" >> "$STAMPS/$$"
if [ "$RANK" = 1 ] && [ ! -e "$STAMPS/failed" ]; then
  sleep 1
  touch "$STAMPS/failed"
  echo "fail $(date +%s.%N)" >> "$STAMPS/$$"
  exit 1
fi
sleep 3
"""


def run_case(launcher, paths, agents, stamps):
    port = lease()[0]
    env = dict(os.environ, STAMPS=stamps, ACCEL_LOG="error", LOGLEVEL="ERROR")
    worker = os.path.join(stamps, "w.sh")
    server = None
    if launcher == "accel-agent":
        if agents == 1:
            cmds = [[paths["accel"], "--nproc-per-node", "2", "--max-restarts", "1", "--no-python", worker]]
        else:
            server = subprocess.Popen([paths["server"], "--bind", f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
            time.sleep(0.3)
            cmds = [[paths["accel"], "--nnodes", str(agents), "--nproc-per-node", "2", "--max-restarts", "1",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
                     "--local-addr", "127.0.0.1", "--no-python", worker]] * agents
    else:
        if agents == 1:
            cmds = [[paths["torchrun"], "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--no-python", worker]]
        else:
            cmds = [[paths["torchrun"], "--nnodes", str(agents), "--nproc-per-node", "2", "--max-restarts", "1",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "bench",
                     "--no-python", worker]] * agents
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in cmds]
    deadline = time.time() + 90
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
    if server:
        server.kill()
    starts, fail = [], None
    for f in glob.glob(os.path.join(stamps, "[0-9]*")):
        for line in open(f):
            parts = line.split()
            if parts[0] == "fail":
                fail = float(parts[1])
            else:
                starts.append(float(parts[1]))
    later = [s for s in starts if fail is not None and s > fail]
    world = 2 * agents
    if fail is None or len(later) < world:
        return None, len(later), world
    return (max(sorted(later)[:world]) - fail) * 1000, len(later), world


def stamps_dir():
    """A temporary directory holding the worker script, where workers stamp."""
    d = tempfile.TemporaryDirectory()
    worker = os.path.join(d.name, "w.sh")
    with open(worker, "w") as f:
        f.write(WORKER)
    os.chmod(worker, 0o755)
    return d


def alone(world, stamps):
    """The floor under any launcher: the same `world` worker scripts started
    at once by this process, nothing else running; ms from the first spawn
    to the last start stamp."""
    worker = os.path.join(stamps, "w.sh")
    env = dict(os.environ, STAMPS=stamps, RANK="0", TORCHELASTIC_RESTART_COUNT="0")
    t0 = time.time()
    # Each in its own group, so its `sleep` goes with it and does not run on
    # into the next measurement.
    procs = [subprocess.Popen([worker], env=env, start_new_session=True) for _ in range(world)]
    deadline = time.time() + 10
    starts = []
    while len(starts) < world and time.time() < deadline:
        time.sleep(0.05)
        starts = [float(line.split()[1]) for f in glob.glob(os.path.join(stamps, "[0-9]*")) for line in open(f)]
    for p in procs:
        os.killpg(p.pid, 9)
        p.wait()
    return (max(starts) - t0) * 1000 if len(starts) == world else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    paths = {"accel": a.accel, "server": a.server, "torchrun": a.torchrun}
    print(f"one worker (rank 1) fails once; time from its exit to every worker of the new round running; "
          f"2 workers per agent; {a.runs} runs, median; {os.cpu_count()} CPUs")
    print()
    print("| agents | accel-agent | torchrun | ratio | the workers alone |")
    print("|---|---|---|---|---|")
    for agents in (1, 3):
        res = {}
        for launcher in ("accel-agent", "torchrun"):
            times, note = [], ""
            for _ in range(a.runs):
                with stamps_dir() as d:
                    ms, restarted, world = run_case(launcher, paths, agents, d)
                    if ms is None:
                        note = f"only {restarted} of {world} workers restarted"
                    else:
                        times.append(ms)
            res[launcher] = (statistics.median(times) if times else None, note)
        floors = []
        for _ in range(a.runs):
            with stamps_dir() as d:
                ms = alone(2 * agents, d)
                if ms is not None:
                    floors.append(ms)
        floor = f"{statistics.median(floors):.1f} ms" if floors else "—"
        fmt = lambda r: f"{r[0]:.1f} ms" if r[0] is not None else r[1]
        ratio = (f"{res['torchrun'][0] / res['accel-agent'][0]:.0f}x"
                 if res["torchrun"][0] and res["accel-agent"][0] else "—")
        print(f"| {agents} | {fmt(res['accel-agent'])} | {fmt(res['torchrun'])} | {ratio} | {floor} |")


if __name__ == "__main__":
    main()
