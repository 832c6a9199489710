"""notebook_launcher benchmark: accel's against accelerate's, side by side in one run.

Times, for `notebook_launcher(function, num_processes=N)` called from a
Python process that has already imported torch and accelerate (as a
notebook has), the time from the call to the function's first line running
in the last process to get there, and the call's whole duration (a function
that returns at once). Alternates the two launchers for `--runs` rounds and
prints the medians as a Markdown table.

Run it where torch's TCPStore reverse lookups are local (scripts/with-private-hosts.sh).
Usage: python bench/notebook_launch.py [--nproc 2] [--runs 10]
(`accel` must be importable and `accel-agent` installed, or ACCEL_AGENT set.)
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import os, sys, time
import torch, accelerate  # a notebook has these already
which, nproc, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if which == "accel":
    from accel import notebook_launcher
else:
    from accelerate import notebook_launcher

def first_line(out):
    t = time.time()
    with open(os.path.join(out, os.environ.get("RANK", "0")), "w") as f:
        f.write(repr(t))

start = time.time()
notebook_launcher(first_line, args=(out,), num_processes=nproc)
end = time.time()
firsts = [float(open(os.path.join(out, r)).read()) for r in os.listdir(out)]
assert len(firsts) == nproc, firsts
print(max(firsts) - start, end - start)
"""


def once(which: str, nproc: int) -> tuple:
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, which, str(nproc), out],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise SystemExit(f"{which} failed:\n{done.stderr[-3000:]}")
        first, whole = done.stdout.split()[-2:]
        return float(first), float(whole)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    results = {"accel": [], "accelerate": []}
    for _ in range(a.runs):
        for which in results:
            results[which].append(once(which, a.nproc))
    print(f"notebook_launcher, {a.nproc} processes, median of {a.runs} (alternating):\n")
    print("| launcher | call to first line, s | whole call, s |")
    print("|---|---|---|")
    for which, rs in results.items():
        first = statistics.median(r[0] for r in rs)
        whole = statistics.median(r[1] for r in rs)
        print(f"| {which} | {first:.3f} | {whole:.3f} |")
    fa = statistics.median(r[0] for r in results["accel"])
    fb = statistics.median(r[0] for r in results["accelerate"])
    print(f"\naccelerate / accel, time to first line: {fb / fa:.1f}x")


if __name__ == "__main__":
    main()
