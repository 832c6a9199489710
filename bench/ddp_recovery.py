"""Time lost to one worker failure in a DDP job: accel (cold), accel with
`--preload torch` (workers forked from a zygote), and torchrun, in one run.

The job is tests/workers/ddp_train.py: 2 agents x 2 workers (gloo, CPU),
checkpoint every 10 steps, rank 3 exits 13 at step 25 of 40. Measured:
- recovery: from the failing rank's exit to the last rank of the new round
  entering its training loop (checkpoint loaded, DDP built);
- wall: the whole job with that failure, from the agents' start to the last
  agent's exit.
torchrun restarts only with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (PyTorch
#135712); it uses a c10d rendezvous on node 0's TCPStore, accel a static one.

Usage: python bench/ddp_recovery.py --accel PATH --torchrun PATH [--runs 3]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from ports import lease  # noqa: E402  (ports leased as the tests lease theirs)
SCRIPT = os.path.join(HERE, "..", "tests", "workers", "ddp_train.py")
JOB = ["--steps", "40", "--ckpt-every", "10", "--fail-at", "25", "--fail-rank", "3", "--step-sleep", "0.05"]


def commands(kind, paths, port, ck, out, st):
    job = [SCRIPT, ck, out, *JOB, "--stamps", st]
    if kind == "torchrun":
        return [[paths["torchrun"], "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "bench",
                 *job] for _ in range(2)]
    extra = ["--preload", "torch"] if kind == "accel --preload torch" else []
    return [[paths["accel"], "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "1",
             "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", str(n), *extra, *job]
            for n in range(2)]


def run(kind, paths):
    with tempfile.TemporaryDirectory() as d:
        ck, out, st = (os.path.join(d, x) for x in ("ck", "out", "st"))
        for x in (ck, out, st):
            os.makedirs(x)
        # Workers run this interpreter (the venv's torch), whichever
        # `python` is first on the caller's PATH: accel starts `python`.
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        env = dict(os.environ, ACCEL_LOG="error", LOGLEVEL="ERROR", OMP_NUM_THREADS="1",
                   TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PATH=path)
        t0 = time.time()
        procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for c in commands(kind, paths, lease()[0], ck, out, st)]
        codes = [p.wait(timeout=300) for p in procs]
        wall = time.time() - t0
        if any(codes) or len(os.listdir(out)) != 4:
            return None
        fail, loops = None, []
        with open(os.path.join(st, "stamps")) as f:
            stamps = [line.split() for line in f]
        for parts in stamps:
            if parts[0] == "fail":
                fail = float(parts[1])
        if fail is None:
            return None
        # Each rank's first entry into the loop after the failure (torchrun
        # counts restarts per agent, so RESTART_COUNT does not tell rounds apart).
        back = {}
        for parts in stamps:
            if parts[0] == "loop" and float(parts[3]) > fail:
                back.setdefault(parts[1], float(parts[3]))
        if len(back) != 4:
            return None
        return max(back.values()) - fail, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    paths = {"accel": a.accel, "torchrun": a.torchrun}
    kinds = ["accel", "accel --preload torch", "torchrun"]
    results = {k: [] for k in kinds}
    failed = {k: 0 for k in kinds}
    for _ in range(a.runs):
        for k in kinds:  # interleaved, so drift on the machine hits all three
            r = run(k, paths)
            if r is None:
                failed[k] += 1
            else:
                results[k].append(r)
    print("| launcher | failure → every rank training again (median, min–max) | job wall time with one failure (median) | runs that failed |")
    print("|---|---|---|---|")
    med = {}
    for k in kinds:
        rs = results[k]
        if not rs:
            print(f"| {k} | – | – | {failed[k]} of {a.runs} |")
            continue
        rec = [r[0] for r in rs]
        med[k] = statistics.median(rec)
        print(f"| {k} | {med[k]:.3f} s ({min(rec):.3f}–{max(rec):.3f}) | {statistics.median(r[1] for r in rs):.2f} s | {failed[k]} of {a.runs} |")
    if "torchrun" in med:
        for k in kinds[:2]:
            if k in med:
                print(f"\n{k}: recovery {med['torchrun'] / med[k]:.1f}x faster than torchrun", end="")
        print()


if __name__ == "__main__":
    main()
