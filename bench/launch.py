"""Launch benchmark: accel-agent vs torchrun, side by side in one run.

Runs `<launcher> --nproc-per-node N --no-python true` alternately with each
launcher, and reports the median wall time and the median peak RSS (the
largest resident set of any process of the launch that the launcher waited
for, from wait4's ru_maxrss). Prints a Markdown table.

Usage: python bench/launch.py --accel PATH --torchrun PATH [--nproc 4] [--runs 10]
"""
import argparse
import os
import platform
import statistics
import subprocess
import time


def run_once(argv):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed with status {status}")
    return wall, usage.ru_maxrss / 1024.0  # KiB -> MiB


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    cmds = {
        "accel-agent": [a.accel, "--nproc-per-node", str(a.nproc), "--no-python", "true"],
        "torchrun": [a.torchrun, "--nproc-per-node", str(a.nproc), "--no-python", "true"],
    }
    for argv in cmds.values():  # warm the page cache
        run_once(argv)
    results = {k: [] for k in cmds}
    for _ in range(a.runs):
        for name, argv in cmds.items():
            results[name].append(run_once(argv))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(r for _, r in v)) for k, v in results.items()}
    print(f"launch {a.nproc} workers of `true`, {a.runs} runs each, alternating; "
          f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}")
    print()
    print("| launcher | median wall | median peak RSS |")
    print("|---|---|---|")
    for k, (w, r) in med.items():
        print(f"| {k} | {w * 1000:.1f} ms | {r:.1f} MiB |")
    (aw, ar), (tw, tr) = med["accel-agent"], med["torchrun"]
    print(f"| ratio torchrun/accel | {tw / aw:.0f}x | {tr / ar:.0f}x |")


if __name__ == "__main__":
    main()
