"""Progress-report overhead: a training loop at about 1,000 steps/s, with and
without ``accel.progress(step)`` after every step, under accel-agent.

Each run starts ``accel-agent --nproc-per-node N`` with a worker that does
STEPS steps of about 1 ms of arithmetic each (no sleeping: the CPU is the
step) and writes how long its loop took. Runs alternate between the two
variants (reporting, not reporting), ROUNDS times each, so both see the
same machine; the figure is each variant's median loop time, and the cost
is their difference over the non-reporting median. A second measurement
calls ``accel.progress`` in a tight loop: the cost of one call.

Usage: python bench/progress.py --accel PATH [--steps 5000] [--rounds 7] [--nproc 2]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

WORKER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
import accel

steps, report, out = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
# About 1 ms of work per step on this machine (calibrated by the caller).
work = int(sys.argv[5])
def step():
    x = 0
    for i in range(work):
        x += i * i
    return x
t0 = time.perf_counter()
for s in range(1, steps + 1):
    step()
    if report:
        accel.progress(s)
loop = time.perf_counter() - t0
calls = 200000
t0 = time.perf_counter()
for s in range(calls):
    accel.progress(s)
per_call = (time.perf_counter() - t0) / calls
with open(os.path.join(out, f"r{os.environ['RANK']}"), "w") as f:
    f.write(f"{loop} {per_call}\n")
"""


def calibrate():
    """Iterations of the worker's loop that take about 1 ms here."""
    import time

    n = 20000
    while True:
        t0 = time.perf_counter()
        x = 0
        for i in range(n):
            x += i * i
        took = time.perf_counter() - t0
        if took > 0.05:
            return max(1, int(n * 0.001 / took))
        n *= 2


def run(accel, python_dir, nproc, steps, report, work):
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        cmd = [accel, "--nproc-per-node", str(nproc), script, python_dir, str(steps),
               "1" if report else "0", d, str(work)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        loops, calls = [], []
        for r in range(nproc):
            loop, call = open(os.path.join(d, f"r{r}")).read().split()
            loops.append(float(loop))
            calls.append(float(call))
        return max(loops), statistics.median(calls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", required=True)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--nproc", type=int, default=2)
    a = ap.parse_args()
    python_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
    work = calibrate()
    off, on, calls = [], [], []
    for _ in range(a.rounds):
        off.append(run(a.accel, python_dir, a.nproc, a.steps, False, work)[0])
        loop, call = run(a.accel, python_dir, a.nproc, a.steps, True, work)
        on.append(loop)
        calls.append(call)
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"| workers | steps | loop without reports (median of {a.rounds}) | with accel.progress every step | cost | one call |")
    print("|---|---|---|---|---|---|")
    print(f"| {a.nproc} | {a.steps} ({a.steps / m_off:.0f} steps/s) | {m_off:.3f} s | {m_on:.3f} s | "
          f"{(m_on - m_off) / m_off * 100:+.2f} % | {statistics.median(calls) * 1e6:.2f} µs |")
    print(f"without: {' '.join(f'{x:.3f}' for x in off)}", file=sys.stderr)
    print(f"with:    {' '.join(f'{x:.3f}' for x in on)}", file=sys.stderr)


if __name__ == "__main__":
    main()
